//! Prometheus metrics, one registry per server (no process-global state).
//!
//! Two kinds share the registry. Counters and histograms the server keeps as it works:
//! requests, policy decisions (how long each took and how plugins failed, per plugin and
//! world, labelled with the plugin's id, name and version: [`PluginFigures`], which GraphQL
//! reads too) and reconciler passes. And gauges of the platform as of the scrape, worked out by [`scrape`] each time
//! `GET /metrics` is read: units by state from the capacity view (in memory: no node is
//! read from the database for it once the view holds it), compute reservations by state
//! (one grouped query), the event outbox (one indexed read) and the database pool.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sqlx::Row as _;

use crate::capacity::UnitState;
use crate::inventory::DeviceClass;
use crate::policy::Names;
use crate::{App, Result};

/// Labels of one HTTP request: the matched route template, not the raw path.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

/// How many buckets `orl_policy_decision_duration_seconds` has below +Inf.
const DECISION_BUCKETS: usize = 16;

/// The upper bounds of the decision latency buckets, in seconds: 0.1 ms doubling to 3.3 s
/// (+Inf follows).
fn decision_bounds() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0001, 2.0, DECISION_BUCKETS as u16)
}

/// One plugin's figures in one world since this server started: what
/// `orl_policy_decisions_total`, `orl_policy_failures_total` and
/// `orl_policy_decision_duration_seconds` expose for it, and what GraphQL's `Plugin` shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PluginFigures {
    /// Decisions by outcome: `placed`, `unschedulable`, `preempted`, `nothing`,
    /// `unsatisfiable`, `allowed`, `refused`, or how the call failed.
    pub outcomes: BTreeMap<String, u64>,
    /// Failed calls by kind: `trap`, `deadline`, `memory`, `invalid-answer`.
    pub failures: BTreeMap<String, u64>,
    /// How long each call took, from the call to its checked answer, whatever the outcome.
    pub latency: Latency,
}

/// A histogram of call durations, in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub sum: f64,
    /// Calls per bucket (not cumulative): at most its bound and over the bound before; the
    /// last is +Inf.
    counts: [u64; DECISION_BUCKETS + 1],
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            count: 0,
            sum: 0.0,
            counts: [0; DECISION_BUCKETS + 1],
        }
    }
}

impl Latency {
    fn observe(&mut self, seconds: f64) {
        self.count += 1;
        self.sum += seconds;
        let at = decision_bounds()
            .position(|le| seconds <= le)
            .unwrap_or(DECISION_BUCKETS);
        self.counts[at] += 1;
    }

    /// The buckets as Prometheus exposes them: each upper bound in seconds (`None` for
    /// +Inf) with the calls that took at most that long (cumulative).
    pub fn buckets(&self) -> Vec<(Option<f64>, u64)> {
        let mut total = 0;
        (decision_bounds().map(Some))
            .chain(std::iter::once(None))
            .zip(self.counts)
            .map(|(le, n)| {
                total += n;
                (le, total)
            })
            .collect()
    }

    /// The `q` quantile (0-1) estimated from the buckets as PromQL's `histogram_quantile`
    /// does: linear inside the bucket it falls in, and the highest finite bound when it
    /// falls in +Inf. `None` before the first call.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let (mut below, mut lower) = (0u64, 0.0);
        for (le, n) in decision_bounds().zip(self.counts) {
            if n > 0 && (below + n) as f64 >= rank {
                return Some(lower + (le - lower) * (rank - below as f64) / n as f64);
            }
            below += n;
            lower = le;
        }
        Some(lower)
    }

    /// The buckets as the encoder takes them: upper bound (+Inf as `f64::MAX`) and count.
    fn encoded(&self) -> Vec<(f64, u64)> {
        (decision_bounds().chain(std::iter::once(f64::MAX)))
            .zip(self.counts)
            .collect()
    }
}

/// Every plugin's figures, by plugin id then world: one entry per plugin per world.
#[derive(Debug, Default)]
struct PolicyFigures(RwLock<PluginMap>);

type PluginMap = BTreeMap<String, BTreeMap<String, Arc<Mutex<PluginFigures>>>>;

impl PolicyFigures {
    /// Changes plugin `plugin`'s figures in `world`.
    fn update(&self, plugin: &str, world: &str, change: impl FnOnce(&mut PluginFigures)) {
        let found = (self.0.read().expect("policy figures"))
            .get(plugin)
            .and_then(|worlds| worlds.get(world))
            .cloned();
        let figures = found.unwrap_or_else(|| {
            (self.0.write().expect("policy figures"))
                .entry(plugin.to_owned())
                .or_default()
                .entry(world.to_owned())
                .or_default()
                .clone()
        });
        change(&mut figures.lock().expect("policy figures"));
    }

    /// A copy of the figures by plugin id then world: every plugin's, or `only`'s.
    fn read(&self, only: Option<&str>) -> Vec<(String, String, PluginFigures)> {
        let map = self.0.read().expect("policy figures");
        let plugins: Vec<(&String, &BTreeMap<_, _>)> = match only {
            Some(id) => map.get_key_value(id).into_iter().collect(),
            None => map.iter().collect(),
        };
        plugins
            .into_iter()
            .flat_map(|(plugin, worlds)| {
                worlds.iter().map(move |(world, figures)| {
                    let figures = figures.lock().expect("policy figures").clone();
                    (plugin.clone(), world.clone(), figures)
                })
            })
            .collect()
    }
}

/// One of the `orl_policy_*` families, encoded from [`PolicyFigures`] at each scrape: one
/// series per plugin per world (and outcome, or failure kind), labelled `plugin` (its id),
/// `name` and `version` (as the policy host knows them; a built-in's version is the
/// server's) and `world`.
#[derive(Debug)]
struct PolicySeries {
    figures: Arc<PolicyFigures>,
    names: Arc<Names>,
    family: PolicyFamily,
}

#[derive(Clone, Copy, Debug)]
enum PolicyFamily {
    Decisions,
    Failures,
    Duration,
}

impl EncodeMetric for PolicySeries {
    fn encode(&self, mut encoder: MetricEncoder) -> std::result::Result<(), std::fmt::Error> {
        for (plugin, world, figures) in self.figures.read(None) {
            let (name, version) = self.names.get(&plugin).unwrap_or_default();
            let (name, version) = (label_value(&name), label_value(&version));
            let plugin = [
                ("plugin", plugin.as_str()),
                ("name", name.as_ref()),
                ("version", version.as_ref()),
                ("world", world.as_str()),
            ];
            let counts = match self.family {
                PolicyFamily::Decisions => ("outcome", &figures.outcomes),
                PolicyFamily::Failures => ("kind", &figures.failures),
                PolicyFamily::Duration => {
                    let latency = &figures.latency;
                    (encoder.encode_family(&plugin)?).encode_histogram::<NoLabelSet>(
                        latency.sum,
                        latency.count,
                        &latency.encoded(),
                        None,
                    )?;
                    continue;
                }
            };
            for (value, count) in counts.1 {
                let [a, b, c, d] = plugin;
                let labels = [a, b, c, d, (counts.0, value.as_str())];
                (encoder.encode_family(&labels)?)
                    .encode_counter::<NoLabelSet, _, u64>(count, None)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        match self.family {
            PolicyFamily::Decisions | PolicyFamily::Failures => MetricType::Counter,
            PolicyFamily::Duration => MetricType::Histogram,
        }
    }
}

/// `value` as a label value of the text exposition, whose encoder writes values as they
/// are: backslash, double quote and line feed escaped.
fn label_value(value: &str) -> Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n"),
    )
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

/// What the group commit ([`crate::booking::group`]) counts of its write turn.
#[derive(Clone, Default)]
pub struct WriteTurn {
    pub held: Counter<f64, AtomicU64>,
    pub writes: Counter,
    pub commits: Counter,
    pub waiting: Gauge,
}

/// The server's metrics and the registry that renders them.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: HistogramFamily<RequestLabels>,
    /// What `orl_policy_decisions_total`, `orl_policy_failures_total` and
    /// `orl_policy_decision_duration_seconds` expose.
    policy: Arc<PolicyFigures>,
    reconciler_pass: Histogram,
    reconciler_due: Gauge,
    reconciler_lag: Seconds,
    /// When the last reconciler pass ended, wall-clock epoch milliseconds (0: none yet).
    reconciler_last_pass_ms: std::sync::atomic::AtomicI64,
    pending_retries: Counter,
    pending_retry_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
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
    write_turn: WriteTurn,
    /// One scrape at a time works out and replaces the live gauges.
    scraping: tokio::sync::Mutex<()>,
}

impl Metrics {
    /// The metrics of a server whose plugins' names and versions are not known.
    pub fn new() -> Metrics {
        Metrics::with_names(Arc::default())
    }

    /// The metrics of a server whose policy host knows its plugins' names and versions as
    /// `names` (see [`crate::policy::PolicyHost::names`]).
    pub fn with_names(names: Arc<Names>) -> Metrics {
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
        let policy = Arc::new(PolicyFigures::default());
        let series = |family| PolicySeries {
            figures: policy.clone(),
            names: names.clone(),
            family,
        };
        registry.register(
            "policy_decisions",
            "Policy plugin decisions by outcome, per plugin (its id, name and version) and world",
            series(PolicyFamily::Decisions),
        );
        registry.register(
            "policy_decision_duration_seconds",
            "Time one policy plugin call took, from the call to its checked answer, whatever the outcome, per plugin (its id, name and version) and world",
            series(PolicyFamily::Duration),
        );
        registry.register(
            "policy_failures",
            "Policy plugin calls that failed, by kind: trap, deadline (ran out of fuel or time), memory (exceeded its limit), invalid-answer (refused by the host's check); counted whether or not the pool falls back to the built-in default; per plugin (its id, name and version) and world",
            series(PolicyFamily::Failures),
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
        let pending_retries = Counter::default();
        registry.register(
            "pending_retries",
            "Pending compute reservations tried again (every 30 s, and as capacity frees), placed or not",
            pending_retries.clone(),
        );
        let pending_retry_seconds = Counter::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "pending_retry_seconds",
            "Time spent trying pending compute reservations again, their decisions and writes included (divided by orl_pending_retries_total: the time one retry takes)",
            pending_retry_seconds.clone(),
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
        let write_turn = WriteTurn::default();
        registry.register(
            "write_turn_held_seconds",
            "Time the replica's write turn was held: placements (and on SQLite terminal moves) write one after another in the open group commit's transaction, each holding the turn for its round trips. Its rate is the share of time the turn was busy: near 1, writes queue for it and creates wait longer",
            write_turn.held.clone(),
        );
        registry.register(
            "write_turn_writes",
            "Writes that took the replica's write turn, kept or rolled back",
            write_turn.writes.clone(),
        );
        registry.register(
            "write_group_commits",
            "Commits of the replica's group commit (orl_write_turn_writes_total divided by this: the writes one commit takes)",
            write_turn.commits.clone(),
        );
        registry.register(
            "write_turn_waiting",
            "Writes waiting now for the replica's write turn (the queue behind the write that holds it)",
            write_turn.waiting.clone(),
        );
        Metrics {
            write_turn,
            registry,
            requests,
            latency,
            policy,
            reconciler_pass,
            reconciler_due,
            reconciler_lag,
            reconciler_last_pass_ms: Default::default(),
            pending_retries,
            pending_retry_seconds,
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

    /// The write turn's counters, for the group commit to keep.
    pub fn write_turn(&self) -> WriteTurn {
        self.write_turn.clone()
    }

    /// Counts one answered request and its latency.
    pub fn observe_request(&self, labels: RequestLabels, seconds: f64) {
        self.latency.get_or_create(&labels).observe(seconds);
        self.requests.get_or_create(&labels).inc();
    }

    /// Counts one decision of plugin `plugin` (its id) and how long the call took.
    pub fn observe_decision(&self, plugin: &str, world: &str, outcome: &str, seconds: f64) {
        self.policy.update(plugin, world, |figures| {
            match figures.outcomes.get_mut(outcome) {
                Some(count) => *count += 1,
                None => {
                    figures.outcomes.insert(outcome.to_owned(), 1);
                }
            }
            figures.latency.observe(seconds);
        });
    }

    /// Counts one failed call of plugin `plugin` (its id; `kind` as
    /// [`crate::placer::FailureKind::as_str`]).
    pub fn observe_policy_failure(&self, plugin: &str, world: &str, kind: &str) {
        self.policy.update(plugin, world, |figures| {
            match figures.failures.get_mut(kind) {
                Some(count) => *count += 1,
                None => {
                    figures.failures.insert(kind.to_owned(), 1);
                }
            }
        });
    }

    /// Every plugin's figures since this server started, by plugin id then world.
    pub fn policy_figures(&self) -> Vec<(String, String, PluginFigures)> {
        self.policy.read(None)
    }

    /// Plugin `id`'s figures since this server started, by world (a plugin implements one).
    pub fn plugin_figures(&self, id: &str) -> Vec<(String, PluginFigures)> {
        (self.policy.read(Some(id)).into_iter())
            .map(|(_, world, figures)| (world, figures))
            .collect()
    }

    /// Counts `retries` pending reservations tried again, in `seconds` in all.
    pub fn observe_pending_retries(&self, retries: usize, seconds: f64) {
        self.pending_retries.inc_by(retries as u64);
        self.pending_retry_seconds.inc_by(seconds);
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
    nodes: &crate::capacity::Nodes,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_series_carry_the_plugins_id_name_and_version_one_per_plugin_and_world() {
        let names = Arc::new(Names::default());
        names.set("sha256:ab", "spread", "1.2.0");
        names.set("sha256:cd", "odd", "2 \"beta\"");
        let metrics = Metrics::with_names(names.clone());
        for _ in 0..3 {
            metrics.observe_decision("sha256:ab", "placer", "placed", 0.0003);
        }
        metrics.observe_decision("sha256:ab", "placer", "trap", 0.002);
        metrics.observe_policy_failure("sha256:ab", "placer", "trap");
        metrics.observe_decision("sha256:cd", "spend-guard", "allowed", 0.0001);
        let text = metrics.render();
        let ab = r#"plugin="sha256:ab",name="spread",version="1.2.0",world="placer""#;
        for line in [
            format!("orl_policy_decisions_total{{{ab},outcome=\"placed\"}} 3"),
            format!("orl_policy_decisions_total{{{ab},outcome=\"trap\"}} 1"),
            format!("orl_policy_failures_total{{{ab},kind=\"trap\"}} 1"),
            format!("orl_policy_decision_duration_seconds_count{{{ab}}} 4"),
            format!("orl_policy_decision_duration_seconds_bucket{{le=\"0.0004\",{ab}}} 3"),
            format!("orl_policy_decision_duration_seconds_bucket{{le=\"+Inf\",{ab}}} 4"),
            r#"orl_policy_decisions_total{plugin="sha256:cd",name="odd",version="2 \"beta\"",world="spend-guard",outcome="allowed"} 1"#.to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        let series = |prefix: &str| text.lines().filter(|l| l.starts_with(prefix)).count();
        assert_eq!(series("orl_policy_decision_duration_seconds_count{"), 2);
        // Renaming is relabelling: still one series per plugin per world.
        names.set("sha256:ab", "spread", "1.3.0");
        let text = metrics.render();
        assert_eq!(
            (text.lines())
                .filter(|l| l.starts_with("orl_policy_decision_duration_seconds_count{"))
                .count(),
            2
        );
        assert!(text.contains(r#"version="1.3.0""#), "{text}");
        let figures = metrics.plugin_figures("sha256:ab");
        assert_eq!(figures.len(), 1);
        let (world, figures) = &figures[0];
        assert_eq!(world, "placer");
        assert_eq!(figures.outcomes["placed"], 3);
        assert_eq!(figures.failures["trap"], 1);
        assert_eq!(figures.latency.count, 4);
        assert!(metrics.plugin_figures("sha256:ef").is_empty());
    }

    #[test]
    fn latency_quantiles_are_estimated_from_the_buckets_as_histogram_quantile_does() {
        let mut latency = Latency::default();
        assert_eq!(latency.quantile(0.5), None);
        // Bucket bounds: 0.1 ms, 0.2 ms, 0.4 ms, …
        for seconds in [0.00015, 0.00015, 0.0003, 0.0003] {
            latency.observe(seconds);
        }
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 1e-12;
        assert!(close(latency.quantile(0.5), 0.0002), "{latency:?}");
        assert!(close(latency.quantile(0.75), 0.0003), "{latency:?}");
        assert!(close(latency.quantile(1.0), 0.0004), "{latency:?}");
        let buckets = latency.buckets();
        assert_eq!(buckets.len(), DECISION_BUCKETS + 1);
        assert_eq!(buckets[1], (Some(0.0002), 2));
        assert_eq!(buckets[DECISION_BUCKETS], (None, 4));
        // Past the last finite bound: that bound.
        latency.observe(100.0);
        let highest = buckets[DECISION_BUCKETS - 1].0.unwrap();
        assert_eq!(latency.quantile(1.0), Some(highest));
    }
}
