//! Per-plugin figures as GraphQL shows them: decisions by outcome, failures by kind and
//! call latency, per world, read from the figures the `orl_policy_*` metric families expose
//! ([`Metrics::policy_figures`]), so `/metrics` and GraphQL never disagree. Counted since
//! the server started; each replica counts its own.

use std::collections::HashMap;

use crate::metrics::{Metrics, PluginFigures};

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

/// Failed calls of one plugin in one world of one kind (`orl_policy_failures_total`).
#[derive(Clone, Debug, PartialEq, Eq, async_graphql::SimpleObject)]
pub struct FailureCount {
    pub world: String,
    /// `trap`, `deadline` (ran out of time), `memory` (exceeded its cap) or
    /// `invalid-answer` (refused by the host's check).
    pub kind: String,
    pub count: i64,
}

/// How long one plugin's calls in one world took (`orl_policy_decision_duration_seconds`):
/// enough for a latency panel without Prometheus — the mean is `sumSeconds / count`, the
/// quantiles are estimated from the buckets as `histogram_quantile` does, and the buckets
/// are there for a heatmap.
#[derive(Clone, Debug, PartialEq, async_graphql::SimpleObject)]
pub struct DecisionLatency {
    pub world: String,
    /// Calls timed, whatever their outcome.
    pub count: i64,
    /// Their total duration, in seconds.
    pub sum_seconds: f64,
    /// The median, estimated from the buckets; null before the first call.
    pub p50_seconds: Option<f64>,
    /// The 99th percentile, estimated from the buckets; null before the first call.
    pub p99_seconds: Option<f64>,
    /// The histogram's buckets, cumulative as Prometheus exposes them.
    pub buckets: Vec<LatencyBucket>,
}

/// One bucket of a latency histogram.
#[derive(Clone, Debug, PartialEq, async_graphql::SimpleObject)]
pub struct LatencyBucket {
    /// Its upper bound in seconds; null for the last (+Inf).
    pub le: Option<f64>,
    /// Calls that took at most `le` (cumulative).
    pub count: i64,
}

/// One plugin's figures on this server, in every world it decided in.
#[derive(Default)]
pub struct Figures {
    pub decisions: Vec<DecisionCount>,
    pub failures: Vec<FailureCount>,
    pub latency: Vec<DecisionLatency>,
}

impl Figures {
    fn add(&mut self, world: &str, figures: PluginFigures) {
        self.decisions.extend(
            figures
                .outcomes
                .into_iter()
                .map(|(outcome, count)| DecisionCount {
                    world: world.to_string(),
                    outcome,
                    count: count as i64,
                }),
        );
        self.failures.extend(
            figures
                .failures
                .into_iter()
                .map(|(kind, count)| FailureCount {
                    world: world.to_string(),
                    kind,
                    count: count as i64,
                }),
        );
        let latency = figures.latency;
        self.latency.push(DecisionLatency {
            world: world.to_string(),
            count: latency.count as i64,
            sum_seconds: latency.sum,
            p50_seconds: latency.quantile(0.5),
            p99_seconds: latency.quantile(0.99),
            buckets: (latency.buckets().into_iter())
                .map(|(le, count)| LatencyBucket {
                    le,
                    count: count as i64,
                })
                .collect(),
        });
    }
}

/// Plugin `id`'s figures.
pub fn of_plugin(metrics: &Metrics, id: &str) -> Figures {
    let mut found = Figures::default();
    for (world, figures) in metrics.plugin_figures(id) {
        found.add(&world, figures);
    }
    found
}

/// Every plugin's decision counts, by plugin id.
pub fn by_plugin(metrics: &Metrics) -> HashMap<String, Vec<DecisionCount>> {
    let mut counts: HashMap<String, Figures> = HashMap::new();
    for (plugin, world, figures) in metrics.policy_figures() {
        counts.entry(plugin).or_default().add(&world, figures);
    }
    (counts.into_iter())
        .map(|(plugin, figures)| (plugin, figures.decisions))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_read_from_the_policy_metrics() {
        let metrics = Metrics::new();
        metrics.observe_decision("sha256:ab", "placer", "placed", 0.001);
        metrics.observe_decision("sha256:ab", "placer", "placed", 0.001);
        metrics.observe_decision("sha256:ab", "placer", "trap", 0.001);
        metrics.observe_policy_failure("sha256:ab", "placer", "trap");
        metrics.observe_decision("sha256:cd", "spend-guard", "allow", 0.001);
        let counts = by_plugin(&metrics);
        let ab = counts["sha256:ab"].clone();
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

        let figures = of_plugin(&metrics, "sha256:ab");
        assert_eq!(figures.decisions, ab);
        assert_eq!(
            figures.failures,
            vec![FailureCount {
                world: "placer".into(),
                kind: "trap".into(),
                count: 1
            }]
        );
        let latency = &figures.latency[0];
        assert_eq!((latency.world.as_str(), latency.count), ("placer", 3));
        assert!((latency.sum_seconds - 0.003).abs() < 1e-12);
        assert!(latency.p50_seconds <= latency.p99_seconds);
        let last = latency.buckets.last().unwrap();
        assert_eq!((last.le, last.count), (None, 3));
        assert!(of_plugin(&metrics, "sha256:ef").latency.is_empty());
    }
}
