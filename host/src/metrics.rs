//! Prometheus metrics, one registry per server (no process-global state).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of one HTTP request: the matched route template, not the raw path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

/// Labels of one policy decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub plugin: String,
    pub world: String,
    /// `placed`, `unschedulable`, or how it failed (`trap`, `deadline`, `memory`, `invalid-answer`).
    pub outcome: String,
}

type HistogramFamily = Family<RequestLabels, Histogram, fn() -> Histogram>;

/// The server's metrics and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily,
    decisions: Family<DecisionLabels, Counter>,
    reconciler_pass: Histogram,
    reconciler_due: Gauge,
    reconciler_lag: Gauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("orl");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0005, 2.0, 16)));
        registry.register("http_requests", "HTTP requests served", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request",
            latency.clone(),
        );
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "policy_decisions",
            "Policy plugin decisions by outcome",
            decisions.clone(),
        );
        let reconciler_pass = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "reconciler_pass_duration_seconds",
            "Time one reconciler pass took",
            reconciler_pass.clone(),
        );
        let reconciler_due = Gauge::default();
        registry.register(
            "reconciler_due_reservations",
            "Reservations the last reconciler pass found due",
            reconciler_due.clone(),
        );
        let reconciler_lag = Gauge::default();
        registry.register(
            "reconciler_lag_milliseconds",
            "How long the oldest due move of the last pass had been due when the pass started",
            reconciler_lag.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            decisions,
            reconciler_pass,
            reconciler_due,
            reconciler_lag,
        }
    }

    /// Counts one answered request and its latency.
    pub fn observe_request(&self, labels: RequestLabels, seconds: f64) {
        self.latency.get_or_create(&labels).observe(seconds);
        self.requests.get_or_create(&labels).inc();
    }

    /// Counts one policy decision.
    pub fn observe_decision(&self, plugin: &str, world: &str, outcome: &str) {
        let labels = DecisionLabels {
            plugin: plugin.into(),
            world: world.into(),
            outcome: outcome.into(),
        };
        self.decisions.get_or_create(&labels).inc();
    }

    /// Records one reconciler pass: how long it took, how many reservations were due, and
    /// how long the oldest of them had been due.
    pub fn observe_reconciler_pass(&self, seconds: f64, due: usize, lag_ms: i64) {
        self.reconciler_pass.observe(seconds);
        self.reconciler_due.set(due as i64);
        self.reconciler_lag.set(lag_ms.max(0));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
