//! A state-machine property test of the booking engine: random creates, releases,
//! cancels, extends and clock steps go to the real server on a real database, and after
//! each one the database is compared with a small model of DESIGN's rules: which units
//! are booked and by whom, the quota in use, each reservation's state and end, and that
//! nothing waits that could be placed. Each case runs in a pool, provider and tenant of
//! its own on one server; the server's invariants (audit, events, no double booking) are
//! checked when it stops.
//!
//! The operations come from a seeded generator (`ORL_MODEL_SEED` replays a run,
//! `ORL_MODEL_CASES` sets how many cases, default 12); a failure names its seed, its case
//! and the operations up to the failing one.

use std::collections::{BTreeMap, BTreeSet};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::support::{Api, Db, Server, T0, on_both_databases, register_node};

on_both_databases!(the_booking_engine_follows_its_model_over_random_operations);

const HOUR: i64 = 3_600_000;
const GPUS_PER_NODE: i64 = 4;
const QUOTA: i64 = 6;

/// One step a tenant (or time) takes. Indices pick among the case's reservations.
#[derive(Clone, Debug)]
enum Op {
    Create { gpus: i64, hours: i64 },
    Release(usize),
    Cancel(usize),
    Extend(usize, i64),
    Step(i64),
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

    /// One operation: creates weigh 4, releases and steps 2, cancels and extends 1.
    fn op(&mut self) -> Op {
        let index = self.below(16) as usize;
        match self.below(10) {
            0..=3 => Op::Create {
                gpus: 1 + self.below(4) as i64,
                hours: 1 + self.below(3) as i64,
            },
            4 | 5 => Op::Release(index),
            6 => Op::Cancel(index),
            7 => Op::Extend(index, 1 + self.below(2) as i64),
            _ => Op::Step([10_000, 30_000, HOUR / 2, HOUR][self.below(4) as usize]),
        }
    }
}

/// What the model knows of one reservation.
#[derive(Clone, Debug)]
struct Modelled {
    id: String,
    gpus: i64,
    end: i64,
    state: String,
    node: Option<String>,
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

/// The rules: a request is placed when one node has that many units no live reservation
/// holds, otherwise it waits (holding its quota); quota is charged from create to the end;
/// a release ends a live reservation and cancels a waiting one; cancel withdraws what has
/// not started; extend moves a live reservation's end; time activates and expires.
struct Model {
    now: i64,
    nodes: Vec<String>,
    reservations: Vec<Modelled>,
}

impl Model {
    fn free_on(&self, node: &str) -> i64 {
        let held: usize = self
            .reservations
            .iter()
            .filter(|r| r.live() && r.node.as_deref() == Some(node))
            .map(|r| r.units.len())
            .sum();
        GPUS_PER_NODE - held as i64
    }
    fn fits(&self, gpus: i64) -> bool {
        self.nodes.iter().any(|n| self.free_on(n) >= gpus)
    }
    fn used(&self) -> i64 {
        self.reservations
            .iter()
            .filter(|r| r.charged())
            .map(|r| r.gpus)
            .sum()
    }
}

/// One case's world on the shared server.
struct Case<'a> {
    server: &'a Server,
    tenant: Api,
    tenant_id: String,
    pool: String,
    model: Model,
    keys: usize,
}

impl Case<'_> {
    async fn open(server: &Server, n: usize, now: i64) -> Case<'_> {
        server.set_clock(now).await;
        let provider_id = format!("prov{n}");
        let tenant_id = format!("ten{n}");
        let provider = server.org_with_key(&provider_id, "provider").await;
        let nodes: Vec<String> = ["a", "b"].iter().map(|s| format!("c{n}{s}")).collect();
        for node in &nodes {
            register_node(&provider, &provider_id, node, GPUS_PER_NODE as usize).await;
        }
        let tenant = server.org_with_key(&tenant_id, "member").await;
        let admin = server.admin();
        let (status, pool) = admin
            .post(
                "/v1/pools",
                json!({ "name": "p", "ownerOrgId": provider_id, "nodeIds": nodes }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{pool}");
        let pool = pool["id"].as_str().unwrap().to_string();
        let (status, offer) = admin
            .post(
                &format!("/v1/pools/{pool}/offers"),
                json!({ "tenantId": tenant_id, "quota": { "gpu": QUOTA } }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{offer}");
        Case {
            server,
            tenant,
            tenant_id,
            pool,
            model: Model {
                now,
                nodes,
                reservations: Vec::new(),
            },
            keys: 0,
        }
    }

    async fn rpc(&self, method: &str, body: Value) -> (StatusCode, Value) {
        self.tenant
            .post(&format!("/api/compute/reservations/{method}"), body)
            .await
    }

    fn pick(&self, i: usize) -> Option<usize> {
        (!self.model.reservations.is_empty()).then(|| i % self.model.reservations.len())
    }

    /// Applies `op` to the server and to the model, checking the answer.
    async fn apply(&mut self, op: &Op) {
        let step = matches!(op, Op::Step(_));
        let before: Vec<String> = self
            .model
            .reservations
            .iter()
            .map(|r| r.state.clone())
            .collect();
        match *op {
            Op::Create { gpus, hours } => {
                self.keys += 1;
                let body = json!({ "tenantId": self.tenant_id, "poolId": self.pool,
                    "devices": [{ "class": "gpu", "count": gpus }], "duration": hours * 3600,
                    "idempotencyKey": format!("k{}", self.keys) });
                let (status, answer) = self.rpc("create", body).await;
                if self.model.used() + gpus > QUOTA {
                    assert_eq!(
                        (status, answer["error"]["code"].as_str()),
                        (StatusCode::CONFLICT, Some("QUOTA_EXCEEDED")),
                        "{answer}"
                    );
                    return;
                }
                assert_eq!(status, StatusCode::OK, "{answer}");
                let expected = if self.model.fits(gpus) {
                    "placed"
                } else {
                    "pending"
                };
                assert_eq!(answer["state"], expected, "{answer}");
                self.model.reservations.push(Modelled {
                    id: answer["id"].as_str().unwrap().to_string(),
                    gpus,
                    end: self.model.now + hours * HOUR,
                    state: "pending".to_string(),
                    node: None,
                    units: BTreeSet::new(),
                });
            }
            Op::Release(i) => {
                let Some(i) = self.pick(i) else { return };
                let r = &self.model.reservations[i];
                let (status, answer) = self.call("release", &r.id.clone()).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                let r = &mut self.model.reservations[i];
                r.state = match r.state.as_str() {
                    "pending" => "cancelled".to_string(),
                    "placed" | "active" => "released".to_string(),
                    ended => ended.to_string(),
                };
                assert_eq!(answer["state"], r.state.as_str(), "{answer}");
            }
            Op::Cancel(i) => {
                let Some(i) = self.pick(i) else { return };
                let id = self.model.reservations[i].id.clone();
                let (status, answer) = self.call("cancel", &id).await;
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
                let body = json!({ "tenantId": self.tenant_id, "reservationId": r.id,
                    "by": hours * 3600, "idempotencyKey": format!("e{}", self.keys) });
                let (status, answer) = self.rpc("extend", body).await;
                let r = &mut self.model.reservations[i];
                if r.live() {
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
            Op::Step(ms) => {
                self.model.now += ms;
                self.server.set_clock(self.model.now).await;
                let now = self.model.now;
                for r in &mut self.model.reservations {
                    if r.charged() && r.end <= now {
                        r.state = "expired".to_string();
                    } else if r.state == "placed" {
                        r.state = "active".to_string();
                    }
                }
            }
        }
        self.check(&before, step).await;
    }

    async fn call(&self, method: &str, id: &str) -> (StatusCode, Value) {
        self.rpc(
            method,
            json!({ "tenantId": self.tenant_id, "reservationId": id }),
        )
        .await
    }

    /// Compares the database with the model. The one move the model leaves to the server
    /// is when a waiting reservation is placed; it must then fit, and afterwards nothing
    /// that waits may fit anywhere.
    async fn check(&mut self, before: &[String], step: bool) {
        let mut db = self.server.database().await;
        let rows = sqlx::query(
            "SELECT id, state, end_ms, node_id FROM compute_reservations
             WHERE tenant_id = $1 AND state <> 'draft'",
        )
        .bind(&self.tenant_id)
        .fetch_all(&mut db)
        .await
        .unwrap();
        let stored: BTreeMap<String, (String, i64, Option<String>)> = rows
            .iter()
            .map(|r| {
                (
                    r.get("id"),
                    (r.get("state"), r.get("end_ms"), r.get("node_id")),
                )
            })
            .collect();
        let rows = sqlx::query(
            "SELECT b.reservation_id, b.node_id, b.unit_id FROM bookings b
             JOIN compute_reservations r ON r.id = b.reservation_id
             WHERE r.tenant_id = $1 AND b.active = $2",
        )
        .bind(&self.tenant_id)
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

        // States: what the model decided, or a waiting reservation placed by the server,
        // which must have fit in what the others left.
        let mut placed_now = Vec::new();
        for (i, r) in self.model.reservations.iter_mut().enumerate() {
            let (state, end, _) = &stored[&r.id];
            let was = before.get(i).map_or("pending", String::as_str);
            if r.state == "pending" && state == "placed" {
                placed_now.push(i);
            } else {
                assert_eq!(
                    state, &r.state,
                    "{}: was {was}, model says {}, server says {state} (step: {step})",
                    r.id, r.state
                );
            }
            if r.charged() {
                assert_eq!(*end, r.end, "{}: end", r.id);
            }
        }
        for i in placed_now {
            let r = &self.model.reservations[i];
            let (nodes, units) = booked.get(&r.id).cloned().unwrap_or_default();
            assert_eq!(nodes.len(), 1, "{} placed on one node: {nodes:?}", r.id);
            let node = nodes.into_iter().next().unwrap();
            assert!(
                self.model.free_on(&node) >= r.gpus,
                "{} placed on {node} where {} of {} GPUs were free",
                r.id,
                self.model.free_on(&node),
                r.gpus
            );
            let r = &mut self.model.reservations[i];
            r.state = "placed".to_string();
            r.node = Some(node);
            r.units = units;
        }

        // Units: a live reservation holds exactly its GPUs, on its node, and no unit twice;
        // nothing else holds any.
        let mut seen = BTreeSet::new();
        for r in &mut self.model.reservations {
            let held = booked.remove(&r.id);
            if !r.live() {
                assert!(held.is_none(), "{} is {} but holds {held:?}", r.id, r.state);
                continue;
            }
            let (nodes, units) = held.unwrap_or_default();
            assert_eq!(units.len() as i64, r.gpus, "{} holds {units:?}", r.id);
            assert_eq!(nodes.len(), 1, "{} spans {nodes:?}", r.id);
            let node = nodes.into_iter().next();
            if r.node.is_some() {
                assert_eq!(r.node, node, "{} moved", r.id);
                assert_eq!(r.units, units, "{} changed units", r.id);
            }
            r.node = node;
            for unit in &units {
                assert!(seen.insert(unit.clone()), "{unit} booked twice");
            }
            r.units = units;
        }
        for node in &self.model.nodes {
            assert!(self.model.free_on(node) >= 0, "{node} over-booked");
        }

        // Quota: charged from create to the end, once.
        let used: Option<i64> = sqlx::query_scalar(
            "SELECT used FROM quota_usage WHERE pool_id = $1 AND tenant_id = $2 AND resource = 'gpu'",
        )
        .bind(&self.pool)
        .bind(&self.tenant_id)
        .fetch_optional(&mut db)
        .await
        .unwrap();
        assert_eq!(used.unwrap_or(0), self.model.used(), "quota in use");

        // Nothing waits that fits: capacity that frees goes to the waiting at once.
        for r in &self.model.reservations {
            if r.state == "pending" {
                assert!(
                    !self.model.fits(r.gpus),
                    "{} waits for {} GPUs while a node has them free",
                    r.id,
                    r.gpus
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
        .unwrap_or(12);
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
