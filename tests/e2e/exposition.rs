//! One scrape of `/metrics`, read by series and labels.

use std::collections::HashMap;
use std::fmt;

/// The samples of one exposition, each by its series as rendered (`name` or
/// `name{labels}`).
pub struct Metrics {
    text: String,
    samples: HashMap<String, f64>,
}

impl Metrics {
    pub fn parse(text: String) -> Metrics {
        let samples = (text.lines())
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter_map(|(series, value)| Some((series.to_string(), value.parse().ok()?)))
            .collect();
        Metrics { text, samples }
    }

    /// The sample of `series` (`name`, or `name{labels}` as rendered), if exported.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.samples.get(series).copied()
    }

    /// The samples of `name` that carry every one of `labels`, summed; `None` when none
    /// does.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        (self.samples.iter())
            .filter(|(series, _)| {
                series.strip_prefix(name).is_some_and(|rest| {
                    (rest.is_empty() || rest.starts_with('{'))
                        && labels.iter().all(|&(k, v)| has_label(rest, k, v))
                })
            })
            .map(|(_, value)| *value)
            .reduce(|a, b| a + b)
    }

    /// Every sample, by series.
    pub fn samples(&self) -> impl Iterator<Item = (&str, f64)> {
        self.samples.iter().map(|(s, v)| (s.as_str(), *v))
    }

    /// The exposition as served.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Whether the rendered label set `labels` (`{k="v",…}`) has `key` set to `value`.
fn has_label(labels: &str, key: &str, value: &str) -> bool {
    let pair = format!("{key}=\"{value}\"");
    ["{", ","].iter().any(|before| {
        [",", "}"]
            .iter()
            .any(|after| labels.contains(&format!("{before}{pair}{after}")))
    })
}

impl fmt::Display for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
