//! A state-machine property test of the booking engine: random creates (single, gangs and
//! spot, some with a lease), releases, cancels, extends, renews, spot reclaims, changes of
//! the pool's nodes, node reservations made and ended and their units released to spot and
//! reclaimed, node agents and inventory reports (and the node loss that follows when a
//! watched node falls silent), NVLink topology changes (which put the node's reservations
//! up for review) and re-affirmations, and clock steps go to the real
//! server on a real database, and after each one the database is compared with a small model
//! of DESIGN's rules: which units are booked and by whom, each tenant's quota in use, each
//! reservation's state and end, that spot work is the only work ever terminated for
//! capacity, that units a node reservation claims are booked (or extended into) only by its
//! audience, or by spot work once released, that what a lost node held fails, and that
//! nothing waits that could be placed. Each case runs in a pool, provider and two tenants of its own on one server;
//! the server's invariants (audit, events, no double booking) are checked when it stops.
//!
//! The operations come from a seeded generator (`ORL_MODEL_SEED` replays a run,
//! `ORL_MODEL_CASES` sets how many cases, default 24); a failure names its seed, its case
//! and the operations up to the failing one.

use std::collections::{BTreeMap, BTreeSet};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::support::{
    Api, Db, HOUR, Server, T0, h100_inventory, on_both_databases, register_node, report_node,
};

on_both_databases!(the_booking_engine_follows_its_model_over_random_operations);

const GPUS_PER_NODE: i64 = 4;
const NODES: usize = 3;
const TENANTS: usize = 2;
const QUOTA: i64 = 7;
/// How long a watched node may stay silent before it is lost (the server's default
/// `--node-lost-after`).
const NODE_LOST_AFTER: i64 = 5 * 60_000;
/// How long a waiting reservation may take to notice capacity that freed without waking
/// its pool (a node reservation ended or expired, a lost node reporting again): the
/// reconciler's retry period.
const RETRY: i64 = 30_000;

/// One step a tenant, the provider or time takes. Indices pick among the case's
/// reservations (or nodes, for a reclaim).
#[derive(Clone, Debug)]
enum Op {
    /// `members` nodes with `gpus` each (a gang when more than one).
    Create {
        tenant: usize,
        gpus: i64,
        members: i64,
        hours: i64,
        spot: bool,
        /// `leaseSeconds`: it is released once a lease goes unrenewed that long.
        lease: Option<i64>,
    },
    Release(usize),
    /// Moves a reservation's lease deadline to now plus its lease.
    Renew(usize),
    /// The pool's nodes become those whose bit is set (`PUT /v1/pools/{id}/nodes`).
    SetNodes(u8),
    Cancel(usize),
    Extend(usize, i64),
    /// The provider reclaims the spot work on a node.
    Reclaim(usize),
    Step(i64),
    /// A platform admin reserves `count` units of a node, from its unit `first` on
    /// (wrapping), for one tenant or for nobody but the platform, for `hours` or open-ended.
    NodeReserve {
        node: usize,
        first: usize,
        count: usize,
        allowed: Option<usize>,
        hours: Option<i64>,
    },
    /// A platform admin ends a node reservation now.
    NodeEnd(usize),
    /// A platform admin puts `count` of a node reservation's units, from its unit `first`
    /// on (wrapping), on the spot market.
    NodeRelease {
        claim: usize,
        first: usize,
        count: usize,
    },
    /// A platform admin takes released units back, terminating the spot work on them.
    NodeReclaim {
        claim: usize,
        first: usize,
        count: usize,
    },
    /// A node's agent polls for its bindings: the node is watched from then on, and lost
    /// once it stays silent for `NODE_LOST_AFTER`.
    Poll(usize),
    /// The provider reports a node's inventory again, unchanged.
    Report(usize),
    /// The provider reports a node with its NVLink domains wired the other way.
    Rewire(usize),
    /// A platform admin re-affirms a node reservation put up for review.
    Reaffirm(usize),
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A small deterministic generator (64-bit LCG), so a seed replays a run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }

    /// One operation: creates weigh 6 (one in three spot, by the second tenant; one in six
    /// a gang of two; half with a lease), releases and steps 2, cancels, extends, renews,
    /// reclaims, changes of the pool's nodes, node reservations, their ends, releases and
    /// reclaims of their units, agent polls, inventory reports, rewirings and
    /// re-affirmations 1.
    fn op(&mut self) -> Op {
        let index = self.below(16) as usize;
        match self.below(23) {
            0..=5 => {
                let kind = self.below(6);
                Op::Create {
                    // One tenant books spot work, the other everything else: a tenant's
                    // create that preempts its own spot work is charged after the refund,
                    // which the model leaves out.
                    tenant: usize::from(kind >= 4),
                    gpus: 1 + self.below(if kind == 0 { 2 } else { 4 }) as i64,
                    members: if kind == 0 { 2 } else { 1 },
                    hours: 1 + self.below(3) as i64,
                    spot: kind >= 4,
                    lease: [None, None, Some(1_800), Some(5_400)][self.below(4) as usize],
                }
            }
            19 => Op::Renew(index),
            20 => Op::SetNodes(1 + self.below((1 << NODES) - 1) as u8),
            21 => Op::Rewire(index % NODES),
            22 => Op::Reaffirm(index),
            6 | 7 => Op::Release(index),
            8 => Op::Cancel(index),
            9 => Op::Extend(index, 1 + self.below(2) as i64),
            10 => Op::Reclaim(index % NODES),
            11 | 12 => Op::Step([10_000, 30_000, HOUR / 2, HOUR][self.below(4) as usize]),
            13 => Op::NodeReserve {
                node: index % NODES,
                first: self.below(GPUS_PER_NODE as u64) as usize,
                count: 1 + self.below(GPUS_PER_NODE as u64) as usize,
                allowed: [None, Some(0), Some(1)][self.below(3) as usize],
                hours: [None, Some(1), Some(2)][self.below(3) as usize],
            },
            14 => Op::NodeEnd(index),
            15 => Op::Poll(index % NODES),
            16 => Op::Report(index % NODES),
            kind => {
                let (claim, first) = (index, self.below(GPUS_PER_NODE as u64) as usize);
                let count = 1 + self.below(GPUS_PER_NODE as u64) as usize;
                match kind {
                    17 => Op::NodeRelease {
                        claim,
                        first,
                        count,
                    },
                    _ => Op::NodeReclaim {
                        claim,
                        first,
                        count,
                    },
                }
            }
        }
    }
}

/// What the model knows of one reservation.
#[derive(Clone, Debug)]
struct Modelled {
    id: String,
    tenant: usize,
    /// GPUs per member.
    gpus: i64,
    members: i64,
    spot: bool,
    end: i64,
    /// Its lease, in milliseconds, and while it is placed the deadline it runs to.
    lease: Option<i64>,
    deadline: Option<i64>,
    state: String,
    nodes: BTreeSet<String>,
    units: BTreeSet<String>,
}

impl Modelled {
    fn live(&self) -> bool {
        self.state == "placed" || self.state == "active"
    }
    fn charged(&self) -> bool {
        self.live() || self.state == "pending"
    }
}

/// What the model knows of one node reservation: it claims its units from its creation
/// until it is ended or its term runs out.
#[derive(Clone, Debug)]
struct Claim {
    id: String,
    node: usize,
    units: BTreeSet<String>,
    /// The tenant in its audience; `None`: only the platform.
    allowed: Option<usize>,
    /// Units put on the spot market: anyone's spot work may book them.
    released: BTreeSet<String>,
    end: Option<i64>,
    ended: bool,
    /// Put up for review by a topology change, and not re-affirmed since: it withholds its
    /// units from everyone.
    review: bool,
}

/// What the model knows of one node's reporting.
#[derive(Clone, Debug, Default)]
struct Reporting {
    /// Its agent has spoken, so silence makes it lost.
    watched: bool,
    last_seen: i64,
    lost: bool,
    /// Which of two NVLink wirings it reports.
    rewired: bool,
}

/// The rules: a request is placed when `members` different nodes, none of them lost, each
/// have that many units that no live reservation holds and that no live node reservation
/// claims for an audience without the tenant; a non-spot one that fits only with spot work
/// terminated preempts it (a gang may instead wait); otherwise it waits, holding its quota.
/// Quota is charged from create to the end, per member. A release ends a live reservation
/// and cancels a waiting one; cancel withdraws what has not started; extend moves a live
/// reservation's end, unless a live node reservation whose audience leaves its tenant out
/// claims one of its units after it (then `availableUntil` is its end); a reclaim ends the
/// node's live spot work; time activates and expires, and fails what is booked on a watched
/// node silent for `NODE_LOST_AFTER`. A node reservation is refused (409) when it claims a
/// unit another live one claims, and leaves the work already booked on its units running.
struct Model {
    now: i64,
    nodes: Vec<String>,
    reservations: Vec<Modelled>,
    claims: Vec<Claim>,
    reporting: Vec<Reporting>,
    /// The nodes in the pool, by index: only they take new placements.
    members: BTreeSet<usize>,
    /// Until when a waiting reservation may not yet have seen capacity that freed without
    /// waking its pool.
    quiet_until: i64,
}

impl Model {
    fn units_of(&self, node: usize) -> impl Iterator<Item = String> + '_ {
        (0..GPUS_PER_NODE).map(move |g| format!("{}-gpu{g}", self.nodes[node]))
    }
    fn claiming(&self, c: &Claim) -> bool {
        !c.ended && c.end.is_none_or(|end| end > self.now)
    }
    /// Whether `tenant` may book `unit` now (with spot work when `spot`): every live claim on
    /// it is not up for review and has the tenant in its audience, or released the unit and
    /// the work is spot.
    fn allowed(&self, tenant: usize, spot: bool, unit: &str) -> bool {
        (self.claims.iter())
            .filter(|c| self.claiming(c) && c.units.contains(unit))
            .all(|c| {
                !c.review && (c.allowed == Some(tenant) || (spot && c.released.contains(unit)))
            })
    }
    /// Whether a live reservation holds `unit`, counting spot work's as free with
    /// `spot_free`.
    fn held(&self, unit: &str, spot_free: bool) -> bool {
        self.reservations
            .iter()
            .any(|r| r.live() && !(spot_free && r.spot) && r.units.contains(unit))
    }
    /// The units of node `n` that `tenant` could book: none on a lost node; otherwise those
    /// no live reservation holds (counting spot work's as free with `spot_free`) and no
    /// live claim keeps from it.
    fn free_on(&self, n: usize, (tenant, spot): (usize, bool), spot_free: bool) -> i64 {
        if self.reporting[n].lost || !self.members.contains(&n) {
            return 0;
        }
        self.units_of(n)
            .filter(|u| !self.held(u, spot_free) && self.allowed(tenant, spot, u))
            .count() as i64
    }
    fn fits(&self, who: (usize, bool), gpus: i64, members: i64, spot_free: bool) -> bool {
        (0..self.nodes.len())
            .filter(|&n| self.free_on(n, who, spot_free) >= gpus)
            .count() as i64
            >= members
    }
    fn used(&self, tenant: usize) -> i64 {
        self.reservations
            .iter()
            .filter(|r| r.charged() && r.tenant == tenant)
            .map(|r| r.gpus * r.members)
            .sum()
    }
    /// Ends the live spot work that `on` picks (a reclaim); answers its ids.
    fn terminate_spot(&mut self, on: impl Fn(&Modelled) -> bool) -> BTreeSet<String> {
        let mut terminated = BTreeSet::new();
        for r in &mut self.reservations {
            if r.spot && r.live() && on(r) {
                r.state = "released".to_string();
                terminated.insert(r.id.clone());
            }
        }
        terminated
    }

    /// The node comes back (or stays): it reported now.
    fn reported(&mut self, n: usize) {
        let node = &mut self.reporting[n];
        node.last_seen = self.now;
        if std::mem::take(&mut node.lost) {
            self.quiet_until = self.quiet_until.max(self.now + RETRY);
        }
    }
}

/// The ids a reclaim's answer says it terminated.
fn answered_terminated(answer: &Value) -> BTreeSet<String> {
    (answer["terminated"].as_array().into_iter().flatten())
        .filter_map(|id| id.as_str().map(str::to_string))
        .collect()
}

/// One case's world on the shared server.
struct Case<'a> {
    server: &'a Server,
    provider: Api,
    provider_id: String,
    tenants: Vec<(Api, String)>,
    pool: String,
    model: Model,
    keys: usize,
}

impl Case<'_> {
    async fn open(server: &Server, n: usize, now: i64) -> Case<'_> {
        server.set_clock(now).await;
        let provider_id = format!("prov{n}");
        let provider = server.org_with_key(&provider_id, "provider").await;
        let nodes: Vec<String> = (0..NODES).map(|i| format!("c{n}n{i}")).collect();
        for node in &nodes {
            register_node(&provider, &provider_id, node, GPUS_PER_NODE as usize).await;
        }
        let admin = server.admin();
        let (status, pool) = admin
            .post(
                "/v1/pools",
                json!({ "name": "p", "ownerOrgId": provider_id, "nodeIds": nodes }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{pool}");
        let pool = pool["id"].as_str().unwrap().to_string();
        let mut tenants = Vec::new();
        for t in 0..TENANTS {
            let tenant_id = format!("ten{n}t{t}");
            let tenant = server.org_with_key(&tenant_id, "member").await;
            let (status, offer) = admin
                .post(
                    &format!("/v1/pools/{pool}/offers"),
                    json!({ "tenantId": tenant_id, "quota": { "gpu": QUOTA } }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{offer}");
            tenants.push((tenant, tenant_id));
        }
        Case {
            server,
            provider,
            provider_id,
            tenants,
            pool,
            model: Model {
                now,
                nodes,
                reservations: Vec::new(),
                claims: Vec::new(),
                reporting: vec![Reporting::default(); NODES],
                members: (0..NODES).collect(),
                quiet_until: now,
            },
            keys: 0,
        }
    }

    async fn rpc(&self, tenant: usize, method: &str, mut body: Value) -> (StatusCode, Value) {
        let (api, tenant_id) = &self.tenants[tenant];
        body["tenantId"] = json!(tenant_id);
        api.post(&format!("/api/compute/reservations/{method}"), body)
            .await
    }

    fn pick(&self, i: usize) -> Option<usize> {
        (!self.model.reservations.is_empty()).then(|| i % self.model.reservations.len())
    }

    /// Applies `op` to the server and to the model, checking the answer.
    async fn apply(&mut self, op: &Op) {
        let before: Vec<String> = self
            .model
            .reservations
            .iter()
            .map(|r| r.state.clone())
            .collect();
        // Spot work the server may terminate for a placement during this step: the clock's
        // retries, and the ones that freed capacity wakes.
        let mut may_preempt = matches!(
            op,
            Op::Step(_) | Op::Release(_) | Op::Cancel(_) | Op::Reclaim(_)
        );
        match *op {
            Op::Create {
                tenant,
                gpus,
                members,
                hours,
                spot,
                lease,
            } => {
                self.keys += 1;
                let mut body = json!({ "poolId": self.pool,
                    "devices": [{ "class": "gpu", "count": gpus }], "duration": hours * 3600,
                    "spot": spot, "idempotencyKey": format!("k{}", self.keys) });
                if let Some(seconds) = lease {
                    body["leaseSeconds"] = json!(seconds);
                }
                if members > 1 {
                    body["gang"] = json!({ "size": members });
                }
                let (status, answer) = self.rpc(tenant, "create", body).await;
                if self.model.used(tenant) + gpus * members > QUOTA {
                    assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("QUOTA_EXCEEDED")),
                        "{answer}"
                    );
                    return;
                }
                assert_eq!(status, StatusCode::OK, "{answer}");
                let m = &self.model;
                let state = answer["state"].as_str().unwrap_or_default();
                if m.fits((tenant, spot), gpus, members, false) {
                    assert_eq!(state, "placed", "{answer}");
                } else if spot || !m.fits((tenant, spot), gpus, members, true) {
                    assert_eq!(state, "pending", "{answer}");
                } else if members == 1 {
                    assert_eq!(state, "placed", "spot work gives way: {answer}");
                    may_preempt = true;
                } else {
                    assert!(state == "placed" || state == "pending", "{answer}");
                    may_preempt = true;
                }
                self.model.reservations.push(Modelled {
                    id: answer["id"].as_str().unwrap().to_string(),
                    tenant,
                    gpus,
                    members,
                    spot,
                    end: self.model.now + hours * HOUR,
                    lease: lease.map(|seconds| seconds * 1000),
                    deadline: None,
                    state: "pending".to_string(),
                    nodes: BTreeSet::new(),
                    units: BTreeSet::new(),
                });
            }
            Op::Release(i) => {
                let Some(i) = self.pick(i) else { return };
                let (status, answer) = self.call(i, "release").await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                let r = &mut self.model.reservations[i];
                r.state = match r.state.as_str() {
                    "pending" => "cancelled".to_string(),
                    "placed" | "active" => "released".to_string(),
                    ended => ended.to_string(),
                };
                assert_eq!(answer["state"], r.state.as_str(), "{answer}");
            }
            Op::Renew(i) => {
                let Some(i) = self.pick(i) else { return };
                let (status, answer) = self.call(i, "renew").await;
                let now = self.model.now;
                let r = &mut self.model.reservations[i];
                match r.lease {
                    Some(lease) if r.live() => {
                        assert_eq!(status, StatusCode::OK, "{answer}");
                        r.deadline = Some(now + lease);
                        assert_eq!(answer["leaseDeadline"], now + lease, "{answer}");
                    }
                    _ => assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("INVALID_STATE")),
                        "renew of a {} reservation with lease {:?}: {answer}",
                        r.state,
                        r.lease
                    ),
                }
            }
            Op::SetNodes(mask) => {
                let members: BTreeSet<usize> =
                    (0..NODES).filter(|n| mask & (1 << n) != 0).collect();
                let ids: Vec<&String> = members.iter().map(|&n| &self.model.nodes[n]).collect();
                let path = format!("/v1/pools/{}/nodes", self.pool);
                let (status, answer) = (self.server.admin())
                    .put(&path, json!({ "nodeIds": ids }))
                    .await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                let model = &mut self.model;
                if !members.is_subset(&model.members) {
                    // Nodes that join do not wake the pool: the waiting see them by the next
                    // retry. Work on nodes that leave runs its course.
                    model.quiet_until = model.quiet_until.max(model.now + RETRY);
                }
                model.members = members;
            }
            Op::Cancel(i) => {
                let Some(i) = self.pick(i) else { return };
                let (status, answer) = self.call(i, "cancel").await;
                let r = &mut self.model.reservations[i];
                match r.state.as_str() {
                    "pending" | "placed" | "cancelled" => {
                        assert_eq!(status, StatusCode::OK, "{answer}");
                        r.state = "cancelled".to_string();
                        assert_eq!(answer["state"], "cancelled", "{answer}");
                    }
                    _ => assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("INVALID_STATE")),
                        "cancel of a {} reservation: {answer}",
                        r.state
                    ),
                }
            }
            Op::Extend(i, hours) => {
                let Some(i) = self.pick(i) else { return };
                self.keys += 1;
                let r = &self.model.reservations[i];
                let body = json!({ "reservationId": r.id, "by": hours * 3600,
                    "idempotencyKey": format!("e{}", self.keys) });
                let (status, answer) = self.rpc(r.tenant, "extend", body).await;
                let m = &self.model;
                let r = &m.reservations[i];
                let refused = (m.claims.iter())
                    .filter(|c| m.claiming(c) && c.end.is_none_or(|end| end > r.end))
                    .any(|c| {
                        (c.units.intersection(&r.units)).any(|u| {
                            c.review
                                || (c.allowed != Some(r.tenant)
                                    && !(r.spot && c.released.contains(u)))
                        })
                    });
                let r = &mut self.model.reservations[i];
                if r.live() && refused {
                    assert_eq!(status, StatusCode::OK, "{answer}");
                    assert_eq!(answer["extended"], false, "a claim for others: {answer}");
                    assert_eq!(answer["availableUntil"], r.end, "{answer}");
                } else if r.live() {
                    assert_eq!(status, StatusCode::OK, "{answer}");
                    assert_eq!(answer["extended"], true, "{answer}");
                    r.end += hours * HOUR;
                } else {
                    assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("INVALID_STATE")),
                        "extend of a {} reservation: {answer}",
                        r.state
                    );
                }
            }
            Op::Reclaim(n) => {
                let node = self.model.nodes[n].clone();
                let path = format!(
                    "/v1/orgs/{}/provider/nodes/{node}/reclaim-spot",
                    self.provider_id
                );
                let (status, answer) = self.provider.post(&path, json!({})).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                let terminated = self.model.terminate_spot(|r| r.nodes.contains(&node));
                assert_eq!(answered_terminated(&answer), terminated, "{answer}");
            }
            Op::Step(ms) => {
                let was = self.model.now;
                self.model.now += ms;
                self.server.set_clock(self.model.now).await;
                let now = self.model.now;
                // A claim that ran out frees its units without waking the pool.
                let model = &mut self.model;
                if (model.claims.iter())
                    .any(|c| !c.ended && c.end.is_some_and(|end| was < end && end <= now))
                {
                    model.quiet_until = model.quiet_until.max(now + RETRY);
                }
                // Loss comes first: what a lost node holds fails, even if its term ended.
                let mut lost = BTreeSet::new();
                for (n, node) in model.reporting.iter_mut().enumerate() {
                    if node.watched && !node.lost && node.last_seen + NODE_LOST_AFTER <= now {
                        node.lost = true;
                    }
                    if node.lost {
                        lost.insert(model.nodes[n].clone());
                    }
                }
                for r in &mut model.reservations {
                    if r.live() && !r.nodes.is_disjoint(&lost) {
                        r.state = "failed".to_string();
                    }
                }
                for r in &mut self.model.reservations {
                    if r.live() && r.deadline.is_some_and(|d| d <= now) {
                        r.state = "released".to_string();
                    } else if r.charged() && r.end <= now {
                        r.state = "expired".to_string();
                    } else if r.state == "placed" {
                        r.state = "active".to_string();
                    }
                }
            }
            Op::NodeReserve {
                node,
                first,
                count,
                allowed,
                hours,
            } => {
                let units: BTreeSet<String> = (first..first + count)
                    .map(|g| {
                        format!(
                            "{}-gpu{}",
                            self.model.nodes[node],
                            g % GPUS_PER_NODE as usize
                        )
                    })
                    .collect();
                let allowed_ids: Vec<&str> = allowed
                    .iter()
                    .map(|&t| self.tenants[t].1.as_str())
                    .collect();
                let mut body = json!({ "unitIds": units, "allowedOrgIds": allowed_ids });
                let end = hours.map(|h| self.model.now + h * HOUR);
                if let Some(end) = end {
                    body["endsAt"] = json!(rfc3339(end));
                }
                let path = format!("/v1/nodes/{}/reservations", self.model.nodes[node]);
                let (status, answer) = self.server.admin().post(&path, body).await;
                let m = &self.model;
                let overlaps =
                    (m.claims.iter()).any(|c| m.claiming(c) && !c.units.is_disjoint(&units));
                if overlaps {
                    assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("CONFLICT")),
                        "a claim on a claimed unit: {answer}"
                    );
                } else {
                    assert_eq!(status, StatusCode::CREATED, "{answer}");
                    assert_eq!(answer["status"], "active", "{answer}");
                    self.model.claims.push(Claim {
                        id: answer["id"].as_str().unwrap().to_string(),
                        node,
                        units,
                        allowed,
                        released: BTreeSet::new(),
                        end,
                        ended: false,
                        review: false,
                    });
                }
            }
            Op::NodeEnd(i) => {
                let Some(i) = self.pick_claim(i) else { return };
                let (status, answer) = self.claim_call(i, "end", json!({})).await;
                let c = &self.model.claims[i];
                let expired = !c.ended && !self.model.claiming(c);
                if expired {
                    assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("INVALID_STATE")),
                        "end of an expired node reservation: {answer}"
                    );
                } else {
                    assert_eq!(status, StatusCode::OK, "{answer}");
                    assert_eq!(answer["status"], "cancelled", "{answer}");
                    let model = &mut self.model;
                    if !std::mem::replace(&mut model.claims[i].ended, true) {
                        // Its units return to everyone, without waking the pool.
                        model.quiet_until = model.quiet_until.max(model.now + RETRY);
                    }
                }
            }
            Op::NodeRelease {
                claim,
                first,
                count,
            }
            | Op::NodeReclaim {
                claim,
                first,
                count,
            } => {
                let Some(i) = self.pick_claim(claim) else {
                    return;
                };
                let c = &self.model.claims[i];
                let units: Vec<&String> = c.units.iter().collect();
                let picked: BTreeSet<String> = (first..first + count.min(units.len()))
                    .map(|u| units[u % units.len()].clone())
                    .collect();
                let release = matches!(op, Op::NodeRelease { .. });
                let action = if release { "release" } else { "reclaim" };
                let (status, answer) =
                    (self.claim_call(i, action, json!({ "unitIds": picked }))).await;
                if !self.model.claiming(c) || c.review {
                    assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("INVALID_STATE")),
                        "units of a node reservation ended or up for review: {answer}"
                    );
                    return self.check(&before, op, may_preempt).await;
                }
                assert_eq!(status, StatusCode::OK, "{answer}");
                let model = &mut self.model;
                let c = &mut model.claims[i];
                if release {
                    if !picked.is_subset(&c.released) {
                        // Spot work waiting for these units sees them by the next retry.
                        model.quiet_until = model.quiet_until.max(model.now + RETRY);
                    }
                    c.released.extend(picked);
                } else {
                    c.released.retain(|u| !picked.contains(u));
                    let terminated = model.terminate_spot(|r| !r.units.is_disjoint(&picked));
                    assert_eq!(answered_terminated(&answer), terminated, "{answer}");
                    // What it terminated wakes the pool, whose placements may preempt.
                    may_preempt = true;
                }
            }
            Op::Poll(n) => {
                let path = format!("/v1/nodes/{}/bindings", self.model.nodes[n]);
                let (status, answer) = self.provider.get(&path).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                self.model.reporting[n].watched = true;
                self.model.reported(n);
            }
            Op::Report(n) | Op::Rewire(n) => {
                let model = &mut self.model;
                if matches!(op, Op::Rewire(_)) {
                    model.reporting[n].rewired ^= true;
                    // Every claim on it still in its term is up for review.
                    let claiming: Vec<bool> =
                        (model.claims.iter()).map(|c| model.claiming(c)).collect();
                    for (c, claiming) in model.claims.iter_mut().zip(claiming) {
                        c.review |= c.node == n && claiming;
                    }
                }
                let node = &model.nodes[n];
                let mut inventory = h100_inventory(node, GPUS_PER_NODE as usize);
                if model.reporting[n].rewired {
                    for (g, unit) in
                        (inventory["units"].as_array_mut().unwrap().iter_mut()).enumerate()
                    {
                        unit["nvlinkDomain"] = json!(format!("nvl{}", g % 2));
                    }
                }
                report_node(&self.provider, &self.provider_id, node, inventory).await;
                self.model.reported(n);
            }
            Op::Reaffirm(i) => {
                let Some(i) = self.pick_claim(i) else { return };
                let (status, answer) = self.claim_call(i, "reaffirm", json!({})).await;
                let model = &mut self.model;
                if model.claiming(&model.claims[i]) && model.claims[i].review {
                    assert_eq!(status, StatusCode::OK, "{answer}");
                    assert_eq!(answer["status"], "active", "{answer}");
                    model.claims[i].review = false;
                    // Its units return to its audience without waking the pool.
                    model.quiet_until = model.quiet_until.max(model.now + RETRY);
                } else {
                    assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("INVALID_STATE")),
                        "re-affirming a node reservation not up for review: {answer}"
                    );
                }
            }
        }
        self.check(&before, op, may_preempt).await;
    }

    fn pick_claim(&self, i: usize) -> Option<usize> {
        (!self.model.claims.is_empty()).then(|| i % self.model.claims.len())
    }

    /// A platform admin's `action` on node reservation `i`.
    async fn claim_call(&self, i: usize, action: &str, body: Value) -> (StatusCode, Value) {
        let c = &self.model.claims[i];
        let path = format!(
            "/v1/nodes/{}/reservations/{}/{action}",
            self.model.nodes[c.node], c.id
        );
        self.server.admin().post(&path, body).await
    }

    async fn call(&self, i: usize, method: &str) -> (StatusCode, Value) {
        let r = &self.model.reservations[i];
        self.rpc(r.tenant, method, json!({ "reservationId": r.id }))
            .await
    }

    /// Compares the database with the model. The moves the model leaves to the server are
    /// when a waiting reservation is placed (it must then fit in what the others leave, and
    /// afterwards nothing that waits may fit anywhere), and, when a non-spot placement
    /// could need it (`may_preempt`), which spot work it terminates.
    async fn check(&mut self, before: &[String], op: &Op, may_preempt: bool) {
        let mut db = self.server.database().await;
        let tenants: Vec<&str> = self.tenants.iter().map(|(_, id)| id.as_str()).collect();
        let rows = sqlx::query(
            "SELECT id, state, end_ms, reason, lease_deadline_ms FROM compute_reservations
             WHERE (tenant_id = $1 OR tenant_id = $2) AND state <> 'draft'",
        )
        .bind(tenants[0])
        .bind(tenants[1])
        .fetch_all(&mut db)
        .await
        .unwrap();
        let deadlines: BTreeMap<String, Option<i64>> = (rows.iter())
            .map(|r| (r.get("id"), r.get("lease_deadline_ms")))
            .collect();
        let stored: BTreeMap<String, (String, i64, Option<String>)> = rows
            .iter()
            .map(|r| {
                (
                    r.get("id"),
                    (r.get("state"), r.get("end_ms"), r.get("reason")),
                )
            })
            .collect();
        let rows = sqlx::query(
            "SELECT b.reservation_id, b.node_id, b.unit_id FROM bookings b
             JOIN compute_reservations r ON r.id = b.reservation_id
             WHERE r.pool_id = $1 AND b.active = $2",
        )
        .bind(&self.pool)
        .bind(true)
        .fetch_all(&mut db)
        .await
        .unwrap();
        let mut booked: BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> = BTreeMap::new();
        for row in &rows {
            let entry = booked.entry(row.get("reservation_id")).or_default();
            entry.0.insert(row.get("node_id"));
            entry.1.insert(row.get("unit_id"));
        }
        assert_eq!(
            stored.len(),
            self.model.reservations.len(),
            "reservations: {stored:?}"
        );

        // States: what the model decided; or a waiting reservation placed by the server,
        // which must have fit in what the others left; or spot work (even work the server
        // placed from waiting in this very step) preempted for a placement.
        let mut placed_now = Vec::new();
        let mut preempted = Vec::new();
        for (i, r) in self.model.reservations.iter_mut().enumerate() {
            let (state, end, reason) = &stored[&r.id];
            let was = before.get(i).map_or("pending", String::as_str);
            if r.state == "pending" && state == "placed" {
                placed_now.push(i);
            } else if r.spot
                && (r.live() || r.state == "pending")
                && state == "released"
                && reason.as_deref() == Some("preempted")
            {
                preempted.push(i);
            } else {
                assert_eq!(
                    state, &r.state,
                    "{}: was {was}, model says {}, server says {state} ({reason:?}) after {op:?}",
                    r.id, r.state
                );
            }
            if r.charged() {
                assert_eq!(*end, r.end, "{}: end", r.id);
            }
        }
        for &i in &preempted {
            let r = &mut self.model.reservations[i];
            assert!(
                may_preempt,
                "{} was preempted by {op:?}, which places no non-spot work",
                r.id
            );
            r.state = "released".to_string();
        }
        let mut placed_non_spot = false;
        for i in placed_now {
            let r = &self.model.reservations[i];
            let (nodes, units) = booked.get(&r.id).cloned().unwrap_or_default();
            assert_eq!(
                nodes.len() as i64,
                r.members,
                "{} placed on one node per member: {nodes:?}",
                r.id
            );
            for node in &nodes {
                let n = self.model.nodes.iter().position(|m| m == node).unwrap();
                assert!(
                    !self.model.reporting[n].lost,
                    "{} placed on lost {node}",
                    r.id
                );
                assert!(
                    self.model.members.contains(&n),
                    "{} placed on {node}, which is not in the pool",
                    r.id
                );
            }
            for unit in &units {
                assert!(
                    !self.model.held(unit, false),
                    "{} placed on {unit}, which another holds",
                    r.id
                );
                assert!(
                    self.model.allowed(r.tenant, r.spot, unit),
                    "{} placed on {unit}, which a node reservation claims for others: {:?}",
                    r.id,
                    self.model.claims
                );
            }
            placed_non_spot |= !r.spot;
            let r = &mut self.model.reservations[i];
            r.state = "placed".to_string();
            r.deadline = r.lease.map(|lease| self.model.now + lease);
            r.nodes = nodes;
            r.units = units;
        }
        if !preempted.is_empty() && matches!(op, Op::Step(_)) {
            assert!(
                placed_non_spot,
                "spot work was preempted while no waiting non-spot reservation was placed"
            );
        }

        // Units: a live reservation holds exactly its GPUs, on one node per member, and no
        // unit twice; nothing else holds any.
        let mut seen = BTreeSet::new();
        for r in &mut self.model.reservations {
            let held = booked.remove(&r.id);
            if !r.live() {
                assert!(held.is_none(), "{} is {} but holds {held:?}", r.id, r.state);
                continue;
            }
            let (nodes, units) = held.unwrap_or_default();
            assert_eq!(
                units.len() as i64,
                r.gpus * r.members,
                "{} holds {units:?}",
                r.id
            );
            assert_eq!(nodes.len() as i64, r.members, "{} spans {nodes:?}", r.id);
            if !r.nodes.is_empty() {
                assert_eq!(r.nodes, nodes, "{} moved", r.id);
                assert_eq!(r.units, units, "{} changed units", r.id);
            }
            r.nodes = nodes;
            assert_eq!(deadlines[&r.id], r.deadline, "{}: lease deadline", r.id);
            for unit in &units {
                assert!(seen.insert(unit.clone()), "{unit} booked twice");
            }
            r.units = units;
        }
        assert!(
            booked.is_empty(),
            "bookings of no live reservation: {booked:?}"
        );

        // Node reservations: cancelled once ended; up for review from a rewiring of their
        // node in their term until re-affirmed.
        let nodes = &self.model.nodes;
        let lifecycles: BTreeMap<String, String> = sqlx::query(
            "SELECT id, lifecycle FROM node_reservations
             WHERE node_id = $1 OR node_id = $2 OR node_id = $3",
        )
        .bind(&nodes[0])
        .bind(&nodes[1])
        .bind(&nodes[2])
        .fetch_all(&mut db)
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get("id"), row.get("lifecycle")))
        .collect();
        for c in &self.model.claims {
            let lifecycle = match (c.ended, c.review) {
                (true, _) => "cancelled",
                (false, true) => "needs-review",
                (false, false) => "granted",
            };
            assert_eq!(lifecycles[&c.id], lifecycle, "{} after {op:?}", c.id);
        }

        // Quota: charged from create to the end, once, and refunded to the preempted.
        for (t, tenant_id) in tenants.iter().enumerate() {
            let used: Option<i64> = sqlx::query_scalar(
                "SELECT used FROM quota_usage WHERE pool_id = $1 AND tenant_id = $2 AND resource = 'gpu'",
            )
            .bind(&self.pool)
            .bind(tenant_id)
            .fetch_optional(&mut db)
            .await
            .unwrap();
            assert_eq!(
                used.unwrap_or(0),
                self.model.used(t),
                "{tenant_id}'s quota in use"
            );
        }

        // Nothing waits that fits: capacity that frees goes to the waiting at once, or, when
        // it frees without waking the pool, by the next retry.
        for r in &self.model.reservations {
            if r.state == "pending" && self.model.now >= self.model.quiet_until {
                assert!(
                    !self
                        .model
                        .fits((r.tenant, r.spot), r.gpus, r.members, false),
                    "{} waits for {} GPUs on {} nodes while they are free",
                    r.id,
                    r.gpus,
                    r.members
                );
            }
        }
    }
}

async fn the_booking_engine_follows_its_model_over_random_operations(db: Db) {
    let server = Server::start(db).await;
    let seed = std::env::var("ORL_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) ^ (T0 as u64));
    let cases: usize = std::env::var("ORL_MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(24);
    let mut rng = Lcg(seed);
    let mut start = T0;
    for n in 1..=cases {
        let ops: Vec<Op> = (0..1 + rng.below(24)).map(|_| rng.op()).collect();
        // Each case has a world of its own, later in time than the last one's.
        start += 30 * 24 * HOUR;
        let mut case = Case::open(&server, n, start).await;
        for (i, op) in ops.iter().enumerate() {
            let applied =
                futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(case.apply(op)))
                    .await;
            if let Err(panic) = applied {
                eprintln!(
                    "booking model: ORL_MODEL_SEED={seed}, case {n}, failed at operation {i} of {:#?}",
                    &ops[..=i]
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
}
