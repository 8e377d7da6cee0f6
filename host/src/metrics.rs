//! Prometheus metrics, one registry per server (no process-global state).
//!
//! Two kinds share the registry. Counters and histograms the server keeps as it works:
//! requests, policy decisions (how long each took and how plugins failed) and reconciler
//! passes. And gauges of the platform as of the scrape, worked out by [`scrape`] each time
//! `GET /metrics` is read: units by state from the capacity view (in memory: no node is
//! read from the database for it once the view holds it), compute reservations by state
//! (one grouped query), the event outbox (one indexed read) and the database pool.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sqlx::Row as _;

use crate::capacity::UnitState;
use crate::inventory::DeviceClass;
use crate::{App, Result};

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

/// A policy plugin in one world.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
    pub world: String,
}

/// How a policy plugin failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub plugin: String,
    pub world: String,
    /// `trap`, `deadline`, `memory` or `invalid-answer`.
    pub kind: String,
}

/// Units of one pool, model and device class in one state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnitLabels {
    pub pool: String,
    pub model: String,
    pub class: String,
    pub state: String,
}

/// Compute reservations of one pool in one state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReservationLabels {
    pub pool: String,
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    /// `idle` or `in_use`.
    pub state: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type Seconds = Gauge<f64, AtomicU64>;

/// The live states of a compute reservation, as `orl_compute_reservations` labels them:
/// `queued` is a `pending` reservation waiting in a pool-lease queue (its `Queued`
/// condition), `pending` every other one (waiting for a retry).
pub const RESERVATION_STATES: [&str; 7] = [
    "awaiting-confirmation",
    "queued",
    "pending",
    "placed",
    "binding",
    "active",
    "releasing",
];

/// The server's metrics and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily<RequestLabels>,
    decisions: Family<DecisionLabels, Counter>,
    decision_duration: HistogramFamily<PluginLabels>,
    policy_failures: Family<FailureLabels, Counter>,
    reconciler_pass: Histogram,
    reconciler_due: Gauge,
    reconciler_lag: Seconds,
    /// When the last reconciler pass ended, wall-clock epoch milliseconds (0: none yet).
    reconciler_last_pass_ms: std::sync::atomic::AtomicI64,
    units: Family<UnitLabels, Gauge>,
    reservations: Family<ReservationLabels, Gauge>,
    oldest_pending: Family<PoolLabels, Seconds>,
    outbox_position: Gauge,
    outbox_newest_age: Seconds,
    db_connections: Family<ConnectionLabels, Gauge>,
    db_max_connections: Gauge,
    scrape_errors: Counter,
    /// Components the policy host compiled, as of the last scrape.
    plugin_compiles: Counter,
    /// One scrape at a time works out and replaces the live gauges.
    scraping: tokio::sync::Mutex<()>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("orl");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: HistogramFamily<RequestLabels> =
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
        let decision_duration: HistogramFamily<PluginLabels> =
            Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.0001, 2.0, 16)));
        registry.register(
            "policy_decision_duration_seconds",
            "Time one policy plugin call took, from the call to its checked answer, whatever the outcome",
            decision_duration.clone(),
        );
        let policy_failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "policy_failures",
            "Policy plugin calls that failed, by kind: trap, deadline (ran out of fuel or time), memory (exceeded its limit), invalid-answer (refused by the host's check); counted whether or not the pool falls back to the built-in default",
            policy_failures.clone(),
        );
        let reconciler_pass = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "reconciler_pass_duration_seconds",
            "Time one reconciler pass took, node-loss checks and every due move included",
            reconciler_pass.clone(),
        );
        let reconciler_due = Gauge::default();
        registry.register(
            "reconciler_due_reservations",
            "Reservations the last reconciler pass found due",
            reconciler_due.clone(),
        );
        let reconciler_lag = Seconds::default();
        registry.register(
            "reconciler_lag_seconds",
            "How long the oldest due move of the last reconciler pass had been due when the pass read it (0 when none was due)",
            reconciler_lag.clone(),
        );
        let units = Family::<UnitLabels, Gauge>::default();
        registry.register(
            "units",
            "Sellable units by pool, model, device class and what holds them at the scrape, each counted in the first state that applies: lost (its node is marked lost), booked (an active booking holds it now, spot work on a released unit included), reserved (a node reservation in its term holds it; a needs-review one holds every unit it names), released (a node reservation in its term released it to the spot market), free (nothing holds it). A node in several pools counts in each; units of nodes in no pool are not counted",
            units.clone(),
        );
        let reservations = Family::<ReservationLabels, Gauge>::default();
        registry.register(
            "compute_reservations",
            "Compute reservations in a live state, by pool; state queued is a pending reservation waiting in a pool-lease queue, pending every other pending one (retried as capacity frees)",
            reservations.clone(),
        );
        let oldest_pending = Family::<PoolLabels, Seconds>::default();
        registry.register(
            "oldest_pending_reservation_age_seconds",
            "Age (since it was created) of the oldest pending or queued compute reservation of the pool, 0 when none is",
            oldest_pending.clone(),
        );
        let outbox_position = Gauge::default();
        registry.register(
            "events_outbox_position",
            "Position (seq) of the newest event in the outbox. Events are written in the transaction of the change they describe and read by cursor, so none ever waits to be published; nothing is deleted, so it grows with every event written (deriv() is events written per second)",
            outbox_position.clone(),
        );
        let outbox_newest_age = Seconds::default();
        registry.register(
            "events_outbox_newest_age_seconds",
            "Age of the newest event in the outbox (0 when there is none). Events are written with their change, so there is no delivery backlog to measure: a value that keeps growing while the platform is busy means changes stopped being written",
            outbox_newest_age.clone(),
        );
        let db_connections = Family::<ConnectionLabels, Gauge>::default();
        registry.register(
            "db_pool_connections",
            "Open connections of the database pool requests read through (on PostgreSQL writes too; on SQLite writes have one connection of their own), idle or in use",
            db_connections.clone(),
        );
        let db_max_connections = Gauge::default();
        registry.register(
            "db_pool_max_connections",
            "Most connections that database pool opens",
            db_max_connections.clone(),
        );
        let scrape_errors = Counter::default();
        registry.register(
            "metrics_scrape_errors",
            "Scrapes that could not work out the live gauges (units, reservations, outbox); those gauges then keep the values of the last scrape that could",
            scrape_errors.clone(),
        );
        let plugin_compiles = Counter::default();
        registry.register(
            "plugin_compiles",
            "Plugin components compiled by Cranelift (once per component: concurrent uploads of the same bytes share one compile, and precompiled artifacts read back from disk are not counted)",
            plugin_compiles.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            decisions,
            decision_duration,
            policy_failures,
            reconciler_pass,
            reconciler_due,
            reconciler_lag,
            reconciler_last_pass_ms: Default::default(),
            units,
            reservations,
            oldest_pending,
            outbox_position,
            outbox_newest_age,
            db_connections,
            db_max_connections,
            scrape_errors,
            plugin_compiles,
            scraping: tokio::sync::Mutex::new(()),
        }
    }

    /// Counts one answered request and its latency.
    pub fn observe_request(&self, labels: RequestLabels, seconds: f64) {
        self.latency.get_or_create(&labels).observe(seconds);
        self.requests.get_or_create(&labels).inc();
    }

    /// Counts one policy decision and how long the plugin call took.
    pub fn observe_decision(&self, plugin: &str, world: &str, outcome: &str, seconds: f64) {
        let labels = DecisionLabels {
            plugin: plugin.into(),
            world: world.into(),
            outcome: outcome.into(),
        };
        self.decisions.get_or_create(&labels).inc();
        let labels = PluginLabels {
            plugin: plugin.into(),
            world: world.into(),
        };
        self.decision_duration
            .get_or_create(&labels)
            .observe(seconds);
    }

    /// Counts one failed policy call (`kind` as [`crate::policy::FailureKind::as_str`]).
    pub fn observe_policy_failure(&self, plugin: &str, world: &str, kind: &str) {
        let labels = FailureLabels {
            plugin: plugin.into(),
            world: world.into(),
            kind: kind.into(),
        };
        self.policy_failures.get_or_create(&labels).inc();
    }

    /// Records one reconciler pass: how long it took, how many reservations were due, and
    /// how long the oldest of them had been due.
    pub fn observe_reconciler_pass(&self, seconds: f64, due: usize, lag_ms: i64) {
        self.reconciler_pass.observe(seconds);
        self.reconciler_due.set(due as i64);
        self.reconciler_lag.set(lag_ms.max(0) as f64 / 1000.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        (self.reconciler_last_pass_ms).store(now, std::sync::atomic::Ordering::Relaxed);
    }

    /// The last reconciler pass as [`Metrics::observe_reconciler_pass`] recorded it: when
    /// it ended (wall-clock epoch milliseconds; `None` before the first), how many
    /// reservations were due, and the seconds the oldest of them had been due.
    pub fn reconciler(&self) -> (Option<i64>, i64, f64) {
        let last = (self.reconciler_last_pass_ms).load(std::sync::atomic::Ordering::Relaxed);
        (
            (last > 0).then_some(last),
            self.reconciler_due.get(),
            self.reconciler_lag.get(),
        )
    }

    /// The Prometheus text exposition of every metric, live gauges as the last [`scrape`]
    /// left them.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// Replaces every live gauge with `live`.
    fn set_live(&self, live: Live) {
        self.units.clear();
        for (labels, value) in live.units {
            self.units.get_or_create(&labels).set(value);
        }
        self.reservations.clear();
        for (labels, value) in live.reservations {
            self.reservations.get_or_create(&labels).set(value);
        }
        self.oldest_pending.clear();
        for (labels, value) in live.oldest_pending {
            self.oldest_pending.get_or_create(&labels).set(value);
        }
        self.outbox_position.set(live.outbox_position);
        self.outbox_newest_age.set(live.outbox_newest_age);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The live gauges as one scrape worked them out.
#[derive(Default)]
struct Live {
    units: Vec<(UnitLabels, i64)>,
    reservations: Vec<(ReservationLabels, i64)>,
    oldest_pending: Vec<(PoolLabels, f64)>,
    outbox_position: i64,
    outbox_newest_age: f64,
}

/// Works out the live gauges and renders every metric: what `GET /metrics` answers. A
/// gauge that cannot be worked out (the database is unreachable) keeps its last value and
/// counts in `orl_metrics_scrape_errors_total`; the scrape itself still answers.
pub async fn scrape(app: &App) -> String {
    let metrics = &app.metrics;
    let _turn = metrics.scraping.lock().await;
    let pool = app.store.pool();
    let in_use = i64::from(pool.size()) - pool.num_idle() as i64;
    for (state, value) in [("idle", pool.num_idle() as i64), ("in_use", in_use.max(0))] {
        metrics
            .db_connections
            .get_or_create(&ConnectionLabels {
                state: state.into(),
            })
            .set(value);
    }
    metrics
        .db_max_connections
        .set(i64::from(pool.options().get_max_connections()));
    let compiled = app.policy.compiles();
    metrics
        .plugin_compiles
        .inc_by(compiled.saturating_sub(metrics.plugin_compiles.get()));
    match live(app).await {
        Ok(live) => metrics.set_live(live),
        Err(err) => {
            metrics.scrape_errors.inc();
            tracing::warn!(error = %format_args!("{err:#}"), "metrics: cannot work out the live gauges");
        }
    }
    metrics.render()
}

async fn live(app: &App) -> Result<Live> {
    let now = app.now_ms();
    let mut live = Live::default();
    let pools: Vec<String> = sqlx::query_scalar("SELECT id FROM pools ORDER BY id")
        .fetch_all(app.store.pool())
        .await?;
    for pool in &pools {
        let list = app.capacity.pool(pool).await?;
        count_units(pool, &list.nodes, now, &mut live.units);
    }
    reservations(app, &pools, now, &mut live).await?;
    let newest: Option<(i64, i64)> =
        sqlx::query_as("SELECT seq, at FROM events ORDER BY seq DESC LIMIT 1")
            .fetch_optional(app.store.pool())
            .await?;
    if let Some((seq, at)) = newest {
        live.outbox_position = seq;
        live.outbox_newest_age = seconds_since(at, now);
    }
    Ok(live)
}

fn seconds_since(at_ms: i64, now_ms: i64) -> f64 {
    (now_ms - at_ms).max(0) as f64 / 1000.0
}

/// Adds pool `pool`'s units by model, class and state at `now` to `out`: one pass over its
/// nodes, with one scratch buffer for all of them. Every state of a model and class the
/// pool has is written, 0 included, so that an alert on one never sees it vanish.
fn count_units(
    pool: &str,
    nodes: &[std::sync::Arc<crate::capacity::NodeCapacity>],
    now: i64,
    out: &mut Vec<(UnitLabels, i64)>,
) {
    let mut counts: HashMap<(&str, DeviceClass), [i64; 5], foldhash::fast::RandomState> =
        HashMap::default();
    let mut scratch = Vec::new();
    for node in nodes {
        let models = node.models();
        node.unit_states(now, &mut scratch, |slot, state| {
            let key = (models[slot.model as usize].as_str(), slot.class);
            counts.entry(key).or_default()[state as usize] += 1;
        });
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by_key(|((model, class), _)| (*model, class.as_str()));
    for ((model, class), by_state) in counts {
        for state in UnitState::ALL {
            let labels = UnitLabels {
                pool: pool.into(),
                model: model.into(),
                class: class.as_str().into(),
                state: state.as_str().into(),
            };
            out.push((labels, by_state[state as usize]));
        }
    }
}

/// Compute reservations in live states by pool (every state of every pool, 0 included),
/// and each pool's oldest pending one: one grouped query.
async fn reservations(app: &App, pools: &[String], now: i64, live: &mut Live) -> Result<()> {
    let rows = sqlx::query(
        "SELECT pool_id, state,
                CAST(CASE WHEN state = 'pending' AND conditions LIKE $1 THEN 1 ELSE 0 END AS BIGINT) AS queued,
                COUNT(*) AS n, MIN(created_at) AS oldest
         FROM compute_reservations
         WHERE state IN ('awaiting-confirmation', 'pending', 'placed', 'binding', 'active', 'releasing')
         GROUP BY 1, 2, 3",
    )
    .bind(r#"%"type":"Queued"%"#)
    .fetch_all(app.store.pool())
    .await?;
    let mut counts: HashMap<(String, &str), i64> = HashMap::new();
    let mut oldest: HashMap<String, i64> = HashMap::new();
    for row in &rows {
        let pool: String = row.try_get("pool_id")?;
        let state: String = row.try_get("state")?;
        let queued: i64 = row.try_get("queued")?;
        let n: i64 = row.try_get("n")?;
        let created: Option<i64> = row.try_get("oldest")?;
        let label = match state.as_str() {
            "pending" if queued == 1 => "queued",
            other => match RESERVATION_STATES.iter().find(|s| **s == other) {
                Some(s) => *s,
                None => continue,
            },
        };
        if state == "pending"
            && let Some(created) = created
        {
            let at = oldest.entry(pool.clone()).or_insert(created);
            *at = (*at).min(created);
        }
        *counts.entry((pool, label)).or_default() += n;
    }
    for pool in pools {
        for state in RESERVATION_STATES {
            let value = counts.remove(&(pool.clone(), state)).unwrap_or(0);
            let labels = ReservationLabels {
                pool: pool.clone(),
                state: state.into(),
            };
            live.reservations.push((labels, value));
        }
        let age = oldest.get(pool).map_or(0.0, |at| seconds_since(*at, now));
        live.oldest_pending
            .push((PoolLabels { pool: pool.clone() }, age));
    }
    Ok(())
}
