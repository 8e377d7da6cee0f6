//! `orl plugins test`: runs a policy plugin on this machine, without a server, against
//! small scenarios (a few built in, and optionally one from a file), and checks every
//! answer as the server would before acting on it.
//!
//! A scenario is JSON (see `examples/scenario.json`):
//!
//! ```json
//! {
//!   "name": "one node, two NVLink domains",
//!   "nodes": { "n1": { "host": { … }, "units": [ … ] } },
//!   "busy": [ { "nodeId": "n1", "unitIds": ["n1-gpu0"], "spot": true, "startedMinutesAgo": 30 } ],
//!   "request": { "devices": [{ "class": "gpu", "count": 4, "topology": "nvlink-all" }], "duration": "2h" },
//!   "expect": "placed",
//!   "charge": { "amountMinor": 2000, "gpuCount": 4, "durationSeconds": 7200, "pricePerGpuHourMinor": 250 },
//!   "budget": { "limitMinor": 10000, "spentMinor": 0, "committedMinor": 0 }
//! }
//! ```
//!
//! - `nodes`: node id → inventory, as `PUT /v1/orgs/{orgId}/provider/nodes/{nodeId}` (and
//!   `orl nodes import`) take it.
//! - `busy`: what already holds units over the request's window: each entry is one
//!   reservation holding `unitIds` of one node; `spot` ones are what a preemptor may
//!   terminate (`startedMinutesAgo` orders them, default 60).
//! - `request`: a create request as `POST /api/compute/reservations/create` takes it
//!   (`tenantId`, `poolId` and `idempotencyKey` may be left out).
//! - `expect` (optional): what any correct policy must answer, `placed`,
//!   `unschedulable`, `allowed` or `refused`; a different answer counts as a failure.
//!   Use it for facts (nothing fits), not for preferences.
//! - `charge` and `budget`: what a spend-guard decides on.
//!
//! Placers and preemptors run the scenarios with `nodes` and a `request`; spend-guards those
//! with a `charge` and a `budget`. Candidates are built as the server builds them, from the
//! same inventory, bookings and request.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use wasmtime_wasi::runtime::in_tokio;

use crate::booking::CreateRequest;
use crate::booking::placement::{Candidacy, Snapshot};
use crate::capacity::{Booked, NodeCapacity, PoolList};
use crate::inventory::nodes::Node;
use crate::inventory::{self, NodeInventory};
use crate::placer::{Failure, check_choice};
use crate::policy::logs::LogLine;
use crate::policy::{BUILT_INS, Loaded, PolicyHost, World};

/// Options of `orl plugins test`.
#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// The component to run: a `.wasm` file implementing the placer, preemptor or
    /// spend-guard world, or the name of a built-in policy (`placer-default`,
    /// `preemptor-default`, `spend-guard-default`).
    pub plugin: PathBuf,
    /// A scenario file (JSON, see examples/scenario.json) run after the built-in scenarios.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Run only the scenario file, not the built-in scenarios.
    #[arg(long, requires = "scenario")]
    pub only_scenario: bool,
    /// How long one decision may take, 1-10000 ms (as a pool's `deadlineMs`).
    #[arg(long, default_value_t = crate::policy::DEFAULT_DEADLINE_MS,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub deadline_ms: u64,
    /// A JSON file the plugin reads as `/config/config.json`.
    #[arg(long)]
    pub config_file: Option<PathBuf>,
}

/// One scenario (see the module documentation).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeInventory>,
    #[serde(default)]
    pub busy: Vec<Busy>,
    #[serde(default)]
    pub request: Option<Value>,
    #[serde(default)]
    pub expect: Option<Expect>,
    #[serde(default)]
    pub charge: Option<Charge>,
    #[serde(default)]
    pub budget: Option<Budget>,
}

/// Units of one node held by one reservation over the request's window.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Busy {
    pub node_id: String,
    pub unit_ids: Vec<String>,
    #[serde(default)]
    pub spot: bool,
    #[serde(default = "an_hour")]
    pub started_minutes_ago: i64,
}

fn an_hour() -> i64 {
    60
}

/// What any correct policy must answer in a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expect {
    Placed,
    Unschedulable,
    Allowed,
    Refused,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Charge {
    pub amount_minor: i64,
    pub gpu_count: u32,
    pub duration_seconds: u64,
    pub price_per_gpu_hour_minor: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Budget {
    pub limit_minor: i64,
    #[serde(default)]
    pub spent_minor: i64,
    #[serde(default)]
    pub committed_minor: i64,
}

/// An H100 of `node` in NVLink domain `domain`.
fn h100(node: &str, g: usize, domain: usize) -> Value {
    json!({ "id": format!("{node}-gpu{g}"), "class": "vfio-group", "deviceClass": "gpu",
            "model": "H100-SXM5-80GB", "memoryGiB": 80, "nvlinkDomain": format!("nvl{domain}"),
            "sellable": true })
}

/// A node of 8 H100s in two NVLink domains of 4.
fn eight_h100(node: &str, region: &str) -> Value {
    json!({
        "region": region,
        "host": { "vcpu": 224, "memoryGiB": 2048, "hugepages1Gi": 512 },
        "units": (0..8).map(|g| h100(node, g, g / 4)).collect::<Vec<_>>(),
    })
}

/// The scenarios every run starts with.
pub fn built_in_scenarios() -> Vec<Scenario> {
    let mixed = json!({
        "region": "eu-west-1",
        "labels": { "rack": "r2" },
        "host": { "vcpu": 128, "memoryGiB": 1024 },
        "units": [
            h100("m1", 0, 0), h100("m1", 1, 0),
            { "id": "m1-mig0", "class": "mig", "deviceClass": "gpu.mig", "model": "H100-1g.10gb",
              "memoryGiB": 10, "sellable": true },
            { "id": "m1-mig1", "class": "mig", "deviceClass": "gpu.mig", "model": "H100-1g.10gb",
              "memoryGiB": 10, "sellable": true },
            { "id": "m1-mig2", "class": "mig", "deviceClass": "gpu.mig", "model": "H100-3g.40gb",
              "memoryGiB": 40, "sellable": true },
            { "id": "m1-nic0", "class": "nic-vf", "deviceClass": "nic.vf", "model": "CX7",
              "memoryGiB": 0, "sellable": true },
            { "id": "m1-nic1", "class": "nic-vf", "deviceClass": "nic.vf", "model": "CX7",
              "memoryGiB": 0, "sellable": true },
        ],
    });
    let scenarios = json!([
        {
            "name": "two-nvlink-domains",
            "description": "one 8-GPU node, three GPUs of its first NVLink domain busy; 4 GPUs in one domain fit only in the second",
            "nodes": { "n1": eight_h100("n1", "eu-west-1") },
            "busy": [ { "nodeId": "n1", "unitIds": ["n1-gpu0", "n1-gpu1", "n1-gpu2"] } ],
            "request": { "devices": [{ "class": "gpu", "count": 4, "topology": "nvlink-all" }], "duration": "2h" },
            "expect": "placed",
        },
        {
            "name": "mixed-mig-and-nic",
            "description": "a node of whole GPUs, MIG instances and NIC VFs beside a node of whole GPUs; a small MIG instance and a NIC VF fit only on the first",
            "nodes": { "m1": mixed, "n2": eight_h100("n2", "eu-west-2") },
            "busy": [ { "nodeId": "m1", "unitIds": ["m1-mig0"], "spot": true, "startedMinutesAgo": 10 } ],
            "request": { "devices": [
                { "class": "gpu.mig", "count": 1, "selector": { "model": "H100-1g.10gb" } },
                { "class": "nic.vf", "count": 1 },
            ], "duration": "30m" },
        },
        {
            "name": "almost-full",
            "description": "two 8-GPU nodes with 6 and 7 GPUs busy (4 of them spot work on n2); 4 GPUs fit nowhere without preemption",
            "nodes": { "n1": eight_h100("n1", "eu-west-1"), "n2": eight_h100("n2", "eu-west-1") },
            "busy": [
                { "nodeId": "n1", "unitIds": ["n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu4", "n1-gpu5", "n1-gpu6"] },
                { "nodeId": "n2", "unitIds": ["n2-gpu0", "n2-gpu1", "n2-gpu2"] },
                { "nodeId": "n2", "unitIds": ["n2-gpu4", "n2-gpu5"], "spot": true, "startedMinutesAgo": 90 },
                { "nodeId": "n2", "unitIds": ["n2-gpu6", "n2-gpu7"], "spot": true, "startedMinutesAgo": 5 },
            ],
            "request": { "devices": [{ "class": "gpu", "count": 4 }], "duration": "1h" },
            "expect": "unschedulable",
        },
        {
            "name": "within-budget",
            "description": "a 4-GPU, 2-hour charge against a budget with room for it",
            "charge": { "amountMinor": 2000, "gpuCount": 4, "durationSeconds": 7200, "pricePerGpuHourMinor": 250 },
            "budget": { "limitMinor": 10000, "spentMinor": 5000, "committedMinor": 1000 },
        },
        {
            "name": "over-budget",
            "description": "the same charge against a budget with 1,000 left",
            "charge": { "amountMinor": 2000, "gpuCount": 4, "durationSeconds": 7200, "pricePerGpuHourMinor": 250 },
            "budget": { "limitMinor": 10000, "spentMinor": 8000, "committedMinor": 1000 },
        },
    ]);
    serde_json::from_value(scenarios).expect("the built-in scenarios parse")
}

/// Reads a scenario file.
pub fn read_scenario(path: &Path) -> anyhow::Result<Scenario> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading the scenario from stdin")?
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    serde_json::from_str(&text).with_context(|| format!("{} is not a scenario", path.display()))
}

/// What the plugin answered in one scenario, checked.
#[derive(Debug)]
pub struct Outcome {
    pub scenario: String,
    /// What the scenario is about.
    pub description: Option<String>,
    /// What it decided, in words.
    pub decision: String,
    /// `None` when the answer is valid (and as expected); otherwise why not.
    pub problem: Option<String>,
    /// Something worth knowing that is not wrong.
    pub note: Option<String>,
    pub took: Duration,
    /// The lines the plugin logged during the decision, oldest first.
    pub log: Vec<LogLine>,
}

impl Outcome {
    /// The outcome of `scenario` before anything is decided.
    fn of(scenario: &Scenario) -> Outcome {
        Outcome {
            scenario: scenario.name.clone(),
            description: scenario.description.clone(),
            decision: String::new(),
            problem: None,
            note: None,
            took: Duration::ZERO,
            log: Vec::new(),
        }
    }

    /// The plugin failed the decision (a trap, its deadline or its memory cap).
    fn failed(mut self, failure: &Failure) -> Outcome {
        let kind = failure.kind.as_str();
        self.decision = format!("failed ({kind})");
        self.problem = Some(format!("{kind}: {}", failure.message));
        self
    }
}

/// The nodes, bookings and request of a placement scenario, read as the server reads a
/// pool: a [`Snapshot`] over the request's window and the reservation it decides for.
struct Pool {
    snapshot: Snapshot,
    reservation: crate::booking::store::Reservation,
    /// The reservation behind each busy entry.
    busy_ids: Vec<String>,
}

fn pool_of(scenario: &Scenario, now: i64) -> anyhow::Result<Pool> {
    let raw = scenario
        .request
        .clone()
        .ok_or_else(|| anyhow!("the scenario has no request"))?;
    let Value::Object(mut raw) = raw else {
        bail!("the request must be an object");
    };
    for (field, value) in [
        ("tenantId", "tenant"),
        ("poolId", "pool_01jd0000000000000000000000"),
        ("idempotencyKey", "scenario"),
    ] {
        raw.entry(field).or_insert_with(|| value.into());
    }
    let request: CreateRequest = serde_json::from_value(Value::Object(raw))
        .map_err(|e| anyhow!("the request is not a create request: {e}"))?;
    request
        .validate()
        .map_err(|e| anyhow!("the request: {e}"))?;
    let binding = request.binding().map_err(|e| anyhow!("the request: {e}"))?;
    let reservation = crate::booking::create::new_draft(
        &crate::iam::Principal::system(),
        "rsv-scenario",
        &request,
        binding,
        None,
        now,
    )
    .map_err(|e| anyhow!("the request: {e}"))?;
    let mut bookings: BTreeMap<&str, Vec<Booked>> = BTreeMap::new();
    let mut busy_ids = Vec::new();
    for (i, busy) in scenario.busy.iter().enumerate() {
        let inventory = scenario
            .nodes
            .get(&busy.node_id)
            .ok_or_else(|| anyhow!("busy[{i}]: no node {}", busy.node_id))?;
        let id = format!("rsv-busy-{i}");
        for unit in &busy.unit_ids {
            if !inventory.units.iter().any(|u| &u.id == unit) {
                bail!("busy[{i}]: node {} has no unit {unit}", busy.node_id);
            }
            bookings.entry(&busy.node_id).or_default().push(Booked {
                unit_id: unit.clone(),
                reservation_id: id.clone(),
                spot: busy.spot,
                start_ms: now - busy.started_minutes_ago.max(0) * 60_000,
                end_ms: reservation.end_ms + 86_400_000,
            });
        }
        busy_ids.push(id);
    }
    let at = crate::clock::format_ms(now);
    let mut nodes = Vec::new();
    for (id, inventory) in &scenario.nodes {
        crate::validation::id("nodeId", id).map_err(|e| anyhow!("node {id}: {e}"))?;
        inventory::validate(inventory).map_err(|e| anyhow!("node {id}: {e}"))?;
        let node = Node {
            id: id.clone(),
            org_id: "provider".into(),
            region: inventory.region.clone(),
            labels: inventory.labels.clone(),
            host: inventory.host.clone(),
            units: inventory.units.clone(),
            topology_gen: 1,
            single_class: inventory::single_class(&inventory.units),
            created_at: at.clone(),
            updated_at: at.clone(),
            last_seen_at: at.clone(),
            conditions: Vec::new(),
        };
        let mut booked = bookings.remove(id.as_str()).unwrap_or_default();
        booked.sort();
        nodes.push(Arc::new(NodeCapacity::new(
            Arc::new(node),
            booked,
            Vec::new(),
            Vec::new(),
        )));
    }
    let list = PoolList {
        nodes: nodes.into_iter().collect(),
        scan: Arc::default(),
        smallest_share: None,
    };
    let snapshot = Snapshot::of(
        list,
        Some(&reservation.id),
        reservation.start_ms,
        reservation.end_ms,
        now,
    );
    Ok(Pool {
        snapshot,
        reservation,
        busy_ids,
    })
}

/// The lines `plugin` logged after line `after`, oldest first.
fn lines_after(host: &PolicyHost, plugin: &str, after: u64) -> Vec<LogLine> {
    let mut lines: Vec<LogLine> = (host.logs())
        .newest(plugin, None, crate::policy::logs::LINES_PER_PLUGIN)
        .into_iter()
        .filter(|l| l.id.parse::<u64>().is_ok_and(|id| id > after))
        .collect();
    lines.reverse();
    lines
}

fn last_line(host: &PolicyHost, plugin: &str) -> u64 {
    (host.logs().newest(plugin, None, 1).first())
        .and_then(|l| l.id.parse().ok())
        .unwrap_or(0)
}

/// The unit ids `units` (candidate ids) of a candidacy name, on their node.
fn unit_names(pool: &Pool, offer: &Candidacy, units: &[u32]) -> Vec<String> {
    units
        .iter()
        .map(|u| match offer.index.get(*u as usize) {
            Some(&(n, i)) => pool.snapshot.node(n).units[i].id.clone(),
            None => format!("#{u}"),
        })
        .collect()
}

/// Runs the placer `loaded` on `scenario`.
fn place(
    host: &PolicyHost,
    loaded: &Loaded,
    scenario: &Scenario,
    config: Option<&Value>,
    deadline_ms: u64,
    now: i64,
) -> anyhow::Result<Outcome> {
    let pool = pool_of(scenario, now)?;
    let offer = pool.snapshot.candidates(&pool.reservation, false, None);
    let before = last_line(host, &loaded.id);
    let started = Instant::now();
    let answer = in_tokio(host.place(
        loaded,
        &offer.request,
        &offer.candidates,
        &|c| pool.snapshot.facts(c),
        config,
        deadline_ms,
    ));
    let took = started.elapsed();
    let mut outcome = Outcome {
        took,
        log: lines_after(host, &loaded.id, before),
        ..Outcome::of(scenario)
    };
    let placed = match answer {
        Err(failure) => return Ok(outcome.failed(&failure)),
        Ok(Err(reason)) => {
            outcome.decision = format!("unschedulable: {reason}");
            if orl_placer_default::place(&offer.request, &offer.candidates).is_ok() {
                outcome.note = Some("the built-in placer would place this request".into());
            }
            false
        }
        Ok(Ok(choice)) => {
            if let Err(message) = check_choice(&offer.request, &offer.candidates, &choice) {
                // Named where they can be: an id that was not offered shows as `#id`.
                let node = (choice.node as usize) < pool.snapshot.len();
                outcome.decision = format!(
                    "answered node {} units {} (candidate ids {} and {:?})",
                    if node {
                        pool.snapshot.node(choice.node as usize).id.clone()
                    } else {
                        format!("#{}", choice.node)
                    },
                    unit_names(&pool, &offer, &choice.units).join(", "),
                    choice.node,
                    choice.units,
                );
                outcome.problem = Some(format!("invalid answer: {message}"));
                return Ok(outcome);
            }
            let node = pool.snapshot.node(choice.node as usize);
            outcome.decision = format!(
                "placed on {}: {}",
                node.id,
                unit_names(&pool, &offer, &choice.units).join(", ")
            );
            true
        }
    };
    match scenario.expect {
        Some(Expect::Placed) if !placed => {
            outcome.problem = Some("expected a placement: the request fits".into());
        }
        Some(Expect::Unschedulable) if placed => {
            outcome.problem = Some("expected unschedulable".into());
        }
        _ => {}
    }
    Ok(outcome)
}

/// Runs the preemptor `loaded` on `scenario`, as the server does once a request does not
/// fit: offered the spot bookings that could give way.
fn preempt(
    host: &PolicyHost,
    loaded: &Loaded,
    scenario: &Scenario,
    config: Option<&Value>,
    deadline_ms: u64,
    now: i64,
) -> anyhow::Result<Outcome> {
    let pool = pool_of(scenario, now)?;
    let mut outcome = Outcome::of(scenario);
    if pool.reservation.spot {
        outcome.decision = "not asked: a spot request never preempts".into();
        return Ok(outcome);
    }
    // The server asks its preemptor only once the request does not fit as things are.
    let plain = pool.snapshot.candidates(&pool.reservation, false, None);
    if orl_placer_default::place(&plain.request, &plain.candidates).is_ok() {
        outcome.decision = "not asked: the request fits without preemption".into();
        return Ok(outcome);
    }
    let offer = pool.snapshot.candidates(&pool.reservation, true, None);
    if offer.spot.is_empty() {
        outcome.decision = "not asked: no spot work holds units the request could use".into();
        return Ok(outcome);
    }
    let before = last_line(host, &loaded.id);
    let started = Instant::now();
    let answer = in_tokio(host.preempt(
        loaded,
        &offer.request,
        &offer.candidates,
        &|c| pool.snapshot.facts(c),
        &offer.spot,
        config,
        deadline_ms,
    ));
    outcome.took = started.elapsed();
    outcome.log = lines_after(host, &loaded.id, before);
    let victims = match answer {
        Err(failure) => return Ok(outcome.failed(&failure)),
        Ok(Err(reason)) => {
            outcome.decision = format!("nothing can make room: {reason}");
            return Ok(outcome);
        }
        Ok(Ok(victims)) => victims,
    };
    let mut seen = HashSet::new();
    for id in &victims {
        if *id as usize >= offer.spot.len() {
            outcome.decision = format!("terminate {victims:?}");
            outcome.problem = Some(format!("invalid answer: spot booking {id} was not offered"));
            return Ok(outcome);
        }
        if !seen.insert(*id) {
            outcome.decision = format!("terminate {victims:?}");
            outcome.problem = Some(format!("invalid answer: spot booking {id} chosen twice"));
            return Ok(outcome);
        }
    }
    if victims.is_empty() {
        outcome.decision = "terminate nothing".into();
        return Ok(outcome);
    }
    let ended: Vec<String> = (victims.iter())
        .map(|id| offer.spot_reservations[*id as usize].clone())
        .collect();
    let described: Vec<String> = victims
        .iter()
        .map(|id| {
            let spot = &offer.spot[*id as usize];
            let busy = (pool.busy_ids.iter())
                .position(|b| *b == offer.spot_reservations[*id as usize])
                .map_or_else(String::new, |i| format!("busy[{i}] "));
            let units: Vec<u32> = (spot.units.start..spot.units.start + spot.units.len).collect();
            format!("{busy}({})", unit_names(&pool, &offer, &units).join(", "))
        })
        .collect();
    outcome.decision = format!("terminate {}", described.join(", "));
    // What the host does next: place the request on what is left.
    let after = pool.snapshot.without(&ended);
    let again = after.candidates(&pool.reservation, false, None);
    if orl_placer_default::place(&again.request, &again.candidates).is_err() {
        outcome.note = Some(
            "the request still does not fit once these end: the server would terminate nothing"
                .into(),
        );
    }
    Ok(outcome)
}

/// Runs the spend-guard `loaded` on `scenario`.
fn spend(
    host: &PolicyHost,
    loaded: &Loaded,
    scenario: &Scenario,
    config: Option<&Value>,
    deadline_ms: u64,
) -> anyhow::Result<Outcome> {
    let (Some(charge), Some(budget)) = (&scenario.charge, &scenario.budget) else {
        bail!("the scenario has no charge and budget");
    };
    let charge = orl_spend_guard_default::Charge {
        amount_minor: charge.amount_minor,
        gpu_count: charge.gpu_count,
        duration_seconds: charge.duration_seconds,
        price_per_gpu_hour_minor: charge.price_per_gpu_hour_minor,
    };
    let budget = orl_spend_guard_default::Budget {
        limit_minor: budget.limit_minor,
        spent_minor: budget.spent_minor,
        committed_minor: budget.committed_minor,
    };
    let before = last_line(host, &loaded.id);
    let started = Instant::now();
    let answer = in_tokio(host.spend(loaded, &charge, &budget, config, deadline_ms));
    let took = started.elapsed();
    let mut outcome = Outcome {
        took,
        log: lines_after(host, &loaded.id, before),
        ..Outcome::of(scenario)
    };
    let allowed = match answer {
        Err(failure) => return Ok(outcome.failed(&failure)),
        Ok(Ok(())) => {
            outcome.decision = "allowed".into();
            true
        }
        Ok(Err(reason)) => {
            outcome.decision = format!("refused: {reason}");
            false
        }
    };
    let default = orl_spend_guard_default::decide(&charge, &budget).is_ok();
    if default != allowed {
        outcome.note = Some(format!(
            "the built-in spend guard would {}",
            if default { "allow it" } else { "refuse it" }
        ));
    }
    match scenario.expect {
        Some(Expect::Allowed) if !allowed => {
            outcome.problem = Some("expected the charge to be allowed".into())
        }
        Some(Expect::Refused) if allowed => {
            outcome.problem = Some("expected the charge to be refused".into())
        }
        _ => {}
    }
    Ok(outcome)
}

/// Whether `scenario` applies to a plugin of `world`.
fn applies(world: World, scenario: &Scenario) -> bool {
    match world {
        World::Placer | World::Preemptor => scenario.request.is_some(),
        World::SpendGuard => scenario.charge.is_some() && scenario.budget.is_some(),
    }
}

/// Runs `loaded` on each scenario that applies to its world.
pub fn run_scenarios(
    host: &PolicyHost,
    loaded: &Loaded,
    scenarios: &[Scenario],
    config: Option<&Value>,
    deadline_ms: u64,
) -> anyhow::Result<Vec<Outcome>> {
    let now = crate::clock::Clock::System.now_ms();
    let mut outcomes = Vec::new();
    for scenario in scenarios.iter().filter(|s| applies(loaded.world, s)) {
        let outcome = match loaded.world {
            World::Placer => place(host, loaded, scenario, config, deadline_ms, now),
            World::Preemptor => preempt(host, loaded, scenario, config, deadline_ms, now),
            World::SpendGuard => spend(host, loaded, scenario, config, deadline_ms),
        };
        outcomes.push(outcome.with_context(|| format!("scenario {}", scenario.name))?);
    }
    Ok(outcomes)
}

/// The outcomes as the CLI prints them: one block per scenario.
fn print(plugin: &str, world: World, outcomes: &[Outcome]) -> String {
    let mut out = format!("{plugin} ({})\n", world.as_str());
    for o in outcomes {
        let verdict = if o.problem.is_some() { "FAIL" } else { "ok" };
        out.push_str(&format!(
            "\n{verdict:<4} {}  ({:.2} ms)\n",
            o.scenario,
            o.took.as_secs_f64() * 1000.0,
        ));
        if let Some(about) = &o.description {
            out.push_str(&format!("  scenario: {about}\n"));
        }
        out.push_str(&format!("  decision: {}\n", o.decision));
        if let Some(problem) = &o.problem {
            out.push_str(&format!("  problem: {problem}\n"));
        }
        if let Some(note) = &o.note {
            out.push_str(&format!("  note: {note}\n"));
        }
        if !o.log.is_empty() {
            let lines = match o.log.len() {
                1 => "1 line".to_string(),
                n => format!("{n} lines"),
            };
            out.push_str(&format!("  log ({lines}):\n"));
            for line in &o.log {
                out.push_str(&format!(
                    "    {:<5} {}\n",
                    line.level.as_str(),
                    line.message
                ));
            }
        }
    }
    let failed = outcomes.iter().filter(|o| o.problem.is_some()).count();
    out.push_str(&format!(
        "\n{} scenarios: {} ok, {failed} failed\n",
        outcomes.len(),
        outcomes.len() - failed
    ));
    out
}

fn as_json(plugin: &Loaded, name: &str, outcomes: &[Outcome]) -> Value {
    json!({
        "plugin": { "id": plugin.id, "name": name, "world": plugin.world },
        "scenarios": outcomes.iter().map(|o| json!({
            "name": o.scenario,
            "decision": o.decision,
            "ok": o.problem.is_none(),
            "problem": o.problem,
            "note": o.note,
            "ms": o.took.as_secs_f64() * 1000.0,
            "log": o.log,
        })).collect::<Vec<_>>(),
    })
}

/// `orl plugins test`: runs on the calling thread (never an async task: each plugin call is
/// driven to completion on it with [`in_tokio`]). Fails when any answer is invalid or the plugin failed.
pub fn run(args: TestArgs, json: bool) -> anyhow::Result<()> {
    let mut scenarios = if args.only_scenario {
        Vec::new()
    } else {
        built_in_scenarios()
    };
    if let Some(path) = &args.scenario {
        scenarios.push(read_scenario(path)?);
    }
    let config = match &args.config_file {
        Some(file) => Some(super::read_json(file, "the config file")?),
        None => None,
    };
    let dir = tempfile::tempdir().context("making a temporary directory")?;
    let host = PolicyHost::new(dir.path())?;
    let (loaded, name) = if !args.plugin.exists()
        && let Some(built_in) =
            (args.plugin.to_str()).and_then(|name| host.built_ins().iter().find(|b| b.name == name))
    {
        (built_in.loaded.clone(), built_in.name.to_string())
    } else {
        let bytes = std::fs::read(&args.plugin).with_context(|| {
            format!(
                "reading {} (not a built-in policy either: {})",
                args.plugin.display(),
                BUILT_INS.map(|(n, _)| n).join(", ")
            )
        })?;
        let loaded = host
            .load(&bytes)
            .map_err(|f| anyhow!("{} is refused: {}", args.plugin.display(), f.message))?;
        (loaded, args.plugin.display().to_string())
    };
    let world = loaded.world;
    if !scenarios.iter().any(|s| applies(world, s)) {
        bail!("no scenario applies to a {} plugin", world.as_str());
    }
    let outcomes = run_scenarios(
        &host,
        &loaded,
        &scenarios,
        config.as_ref(),
        args.deadline_ms,
    )?;
    if json {
        println!("{:#}", as_json(&loaded, &name, &outcomes));
    } else {
        print!("{}", print(&name, world, &outcomes));
    }
    let failed = outcomes.iter().filter(|o| o.problem.is_some()).count();
    if failed > 0 {
        bail!("{failed} of {} scenarios failed", outcomes.len());
    }
    Ok(())
}
