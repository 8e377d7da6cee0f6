//! Policy decision counts, read from this server's `orl_policy_decisions_total` counter
//! (counted since the server started; each replica counts its own).

use std::collections::HashMap;

use crate::metrics::Metrics;

const SERIES: &str = "orl_policy_decisions_total{";

/// Decisions of one plugin in one world with one outcome.
#[derive(Clone, Debug, PartialEq, Eq, async_graphql::SimpleObject)]
pub struct DecisionCount {
    pub world: String,
    /// `placed`, `unschedulable`, or how it failed (`trap`, `deadline`, `memory`,
    /// `invalid-answer`), as the metric labels it.
    pub outcome: String,
    pub count: i64,
}

impl DecisionCount {
    /// Whether the outcome is a failure of the plugin rather than an answer.
    pub fn failed(&self) -> bool {
        matches!(
            self.outcome.as_str(),
            "trap" | "deadline" | "memory" | "invalid-answer"
        )
    }
}

/// Every plugin's decision counts, by plugin id.
pub fn by_plugin(metrics: &Metrics) -> HashMap<String, Vec<DecisionCount>> {
    parse(&metrics.render())
}

fn parse(exposition: &str) -> HashMap<String, Vec<DecisionCount>> {
    let mut counts: HashMap<String, Vec<DecisionCount>> = HashMap::new();
    for line in exposition.lines() {
        let Some((labels, value)) = line
            .strip_prefix(SERIES)
            .and_then(|rest| rest.rsplit_once("} "))
        else {
            continue;
        };
        let labels = labels_of(labels);
        let (Some(plugin), Some(world), Some(outcome), Ok(count)) = (
            labels.get("plugin"),
            labels.get("world"),
            labels.get("outcome"),
            value.trim().parse::<f64>(),
        ) else {
            continue;
        };
        counts
            .entry(plugin.clone())
            .or_default()
            .push(DecisionCount {
                world: world.clone(),
                outcome: outcome.clone(),
                count: count as i64,
            });
    }
    counts
}

/// `a="x",b="y"` as a map (label values here never contain quotes).
fn labels_of(text: &str) -> HashMap<&str, String> {
    text.split("\",")
        .filter_map(|pair| pair.split_once("=\""))
        .map(|(k, v)| (k, v.trim_end_matches('"').to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_read_from_the_decision_counter() {
        let metrics = Metrics::new();
        metrics.observe_decision("sha256:ab", "placer", "placed", 0.001);
        metrics.observe_decision("sha256:ab", "placer", "placed", 0.001);
        metrics.observe_decision("sha256:ab", "placer", "trap", 0.001);
        metrics.observe_decision("sha256:cd", "spend-guard", "allow", 0.001);
        let counts = by_plugin(&metrics);
        let mut ab = counts["sha256:ab"].clone();
        ab.sort_by(|a, b| a.outcome.cmp(&b.outcome));
        assert_eq!(
            ab,
            vec![
                DecisionCount {
                    world: "placer".into(),
                    outcome: "placed".into(),
                    count: 2
                },
                DecisionCount {
                    world: "placer".into(),
                    outcome: "trap".into(),
                    count: 1
                },
            ]
        );
        assert!(ab[1].failed() && !ab[0].failed());
        assert_eq!(counts["sha256:cd"][0].world, "spend-guard");
    }
}
