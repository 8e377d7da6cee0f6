//! Different operations racing each other on one reservation, on several replicas where the
//! database allows it (three `orl serve` on one PostgreSQL; one process owns a SQLite
//! file). After each race the database must satisfy [`invariants::check`], and no request
//! may answer 5xx.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row as _;

use crate::invariants;
use crate::support::{Api, Db, Options, Server, T0, on_both_databases, register_node};

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

/// A provider with `nodes` nodes of 8 H100s in one pool, offered to `tenant-a` with a
/// quota of `gpus`, served by one server (SQLite) or three replicas (PostgreSQL).
pub(crate) struct Fleet {
    pub servers: Vec<Server>,
    pub pool: String,
    /// The provider's (acme's) client on the first server.
    pub provider: Api,
    /// A tenant-a key.
    key: String,
}

pub(crate) async fn fleet(db: Db, nodes: usize, gpus: i64, policy: Value) -> Fleet {
    let server = Server::start_with(db, fleet_options(Vec::new())).await;
    let mut fleet = fleet_on(server, nodes, gpus, policy).await;
    if db == Db::Postgres {
        for _ in 0..2 {
            let replica = fleet.servers[0].replica().await;
            fleet.servers.push(replica);
        }
    }
    fleet
}

/// A fleet's server options, with `env` set for it.
fn fleet_options(env: Vec<(String, String)>) -> Options {
    Options {
        args: vec!["--database-connections".into(), "6".into()],
        env,
        ..Options::default()
    }
}

/// [`fleet`] on `server` alone.
async fn fleet_on(server: Server, nodes: usize, gpus: i64, policy: Value) -> Fleet {
    let provider = server.org_with_key("acme", "provider").await;
    let node_ids: Vec<String> = (1..=nodes).map(|n| format!("n{n}")).collect();
    for node in &node_ids {
        register_node(&provider, "acme", node, 8).await;
    }
    server.org_with_key("tenant-a", "member").await;
    let key = server.key_in("tenant-a", json!({ "role": "member" })).await;
    let admin = server.admin();
    let (status, pool) = admin
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": node_ids, "policy": policy }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    let (status, offer) = admin
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": gpus } }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
    Fleet {
        servers: vec![server],
        pool,
        key,
        provider,
    }
}

impl Fleet {
    /// The tenant's client on replica `i` (round robin).
    pub fn tenant(&self, i: usize) -> Api {
        self.servers[i % self.servers.len()].as_key(&self.key)
    }

    pub fn ask(&self, key: &str, gpus: i64, start: Option<i64>) -> Value {
        let mut body = json!({ "tenantId": "tenant-a", "poolId": self.pool,
            "devices": [{ "class": "gpu", "count": gpus }], "duration": "2h", "idempotencyKey": key });
        if let Some(start) = start {
            body["start"] = json!(start);
        }
        body
    }

    pub async fn create(&self, i: usize, body: Value) -> Value {
        let (status, r) = rpc(&self.tenant(i), "create", body).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    /// `count` reservations of 1 GPU from `start` (keys `k-0`, …), each placed: their ids.
    pub async fn placed(&self, count: usize, start: i64) -> Vec<Value> {
        let mut ids = Vec::new();
        for i in 0..count {
            let r = self
                .create(i, self.ask(&format!("k-{i}"), 1, Some(start)))
                .await;
            assert_eq!(r["state"], "placed", "{r}");
            ids.push(r["id"].clone());
        }
        ids
    }

    pub async fn get(&self, id: &Value) -> Value {
        self.on_reservation(0, "get", id).await
    }

    /// Releases `id` through replica `i`: the reservation as released.
    pub async fn release(&self, i: usize, id: &Value) -> Value {
        self.on_reservation(i, "release", id).await
    }

    /// Calls `method` on reservation `id` through replica `i`, expecting OK.
    async fn on_reservation(&self, i: usize, method: &str, id: &Value) -> Value {
        let body = json!({ "tenantId": "tenant-a", "reservationId": id });
        let (status, r) = rpc(&self.tenant(i), method, body).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    /// Moves every replica's clock to `ms` at once; each reconciles on its own.
    pub async fn set_clocks(&self, ms: i64) {
        let moves = self.servers.iter().map(|s| s.set_clock(ms));
        futures::future::join_all(moves).await;
    }
}

pub(crate) async fn rpc(api: &Api, method: &str, body: Value) -> (StatusCode, Value) {
    api.post(&format!("/api/compute/reservations/{method}"), body)
        .await
}

/// Runs every future at once on the runtime's threads and answers their outputs in order.
async fn all<T: Send + 'static>(
    futures: Vec<impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for handle in handles {
        out.push(handle.await.unwrap());
    }
    out
}

#[track_caller]
fn assert_not_5xx(status: StatusCode, body: &Value) {
    assert!(!status.is_server_error(), "{status} {body}");
}

/// The earliest start and latest end of a reservation's bookings.
async fn booked_window(server: &Server, id: &Value) -> (i64, i64) {
    let mut db = server.database().await;
    let row = sqlx::query(
        "SELECT MIN(start_ms) AS s, MAX(end_ms) AS e FROM bookings WHERE reservation_id = $1",
    )
    .bind(id.as_str().unwrap())
    .fetch_one(&mut db)
    .await
    .unwrap();
    (row.get("s"), row.get("e"))
}

on_both_databases!(
    reservations_starting_together_on_every_replica_while_released_start_once,
    reservations_ending_together_on_every_replica_are_refunded_once,
    an_extend_racing_activation_is_never_lost,
    an_extend_racing_a_create_answers_available_until_not_500,
    an_extend_racing_release_never_extends_a_released_reservation,
    a_spot_create_racing_a_reclaim_never_survives_it,
    a_reservation_placed_late_books_from_when_it_was_placed,
    a_lease_with_a_future_start_counts_from_the_start,
    a_retry_decided_before_a_node_reservation_claimed_its_units_does_not_take_them,
    a_retry_decided_before_its_node_shrank_does_not_overbook_its_cpus,
    a_retry_that_lost_its_write_decides_again_and_places_on_what_is_left,
    a_create_that_loses_its_decision_on_every_attempt_waits_and_its_retry_places_it,
    a_create_that_loses_its_decision_twice_is_placed_by_its_last_attempt,
    a_node_binding_books_the_whole_node,
    creates_racing_for_one_nodes_host_cpus_on_every_replica_book_them_once,
    creates_racing_with_one_key_on_every_replica_answer_one_reservation,
);

/// Forty-eight creates with one idempotency key, spread over every replica and sent at once
/// (a client trying again while its first try is still in flight): every one answers the
/// same reservation, booked once and charged once.
async fn creates_racing_with_one_key_on_every_replica_answer_one_reservation(db: Db) {
    let f = fleet(db, 2, 64, json!({})).await;
    let body = f.ask("k-same", 2, None);
    let creates = (0..48)
        .map(|i| {
            let (tenant, body) = (f.tenant(i), body.clone());
            async move { rpc(&tenant, "create", body).await }
        })
        .collect();
    let answers = all(creates).await;
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::OK, "{body}");
        assert_eq!(body["state"], "placed", "{body}");
        assert_eq!(body["id"], answers[0].1["id"], "{body}");
    }
    let mut db = f.servers[0].database().await;
    let stored: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM compute_reservations WHERE idempotency_key = 'k-same'",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!(stored, 1);
    let booked: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM bookings WHERE reservation_id = $1 AND active")
            .bind(answers[0].1["id"].as_str().unwrap())
            .fetch_one(&mut db)
            .await
            .unwrap();
    assert_eq!(booked, 2, "its two GPUs, booked once");
    invariants::check(&f.servers[0]).await;
}

/// Sixteen creates, spread over every replica, each want 150 of the only node's 224 vCPUs
/// (and one of its eight GPUs, not all the same one): exactly one is placed, the others wait, and the node's
/// host resources are never booked past what it has.
async fn creates_racing_for_one_nodes_host_cpus_on_every_replica_book_them_once(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let (status, offer) = f.servers[0]
        .admin()
        .post(
            &format!("/v1/pools/{}/offers", f.pool),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": 64, "vcpu": 4096, "memoryGiB": 65536 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{offer}");
    // Each unit labelled, so that the racers ask for different units and only the node's
    // CPUs are contended.
    let mut inventory = crate::support::h100_inventory("n1", 8);
    for (g, unit) in inventory["units"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        unit["labels"] = json!({ "slot": format!("s{g}") });
    }
    let (status, node) = f
        .provider
        .put("/v1/orgs/acme/provider/nodes/n1", inventory)
        .await;
    assert_eq!(status, StatusCode::OK, "{node}");
    let creates = (0..16)
        .map(|i| {
            let tenant = f.tenant(i);
            let mut body = f.ask(&format!("k-{i}"), 1, None);
            body["devices"][0]["selector"] = json!({ "labels": { "slot": format!("s{}", i % 8) } });
            body["resources"] = json!({ "vcpu": 150 });
            async move { rpc(&tenant, "create", body).await }
        })
        .collect();
    let answers = all(creates).await;
    let mut placed = 0;
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::OK, "{body}");
        match body["state"].as_str() {
            Some("placed") => placed += 1,
            Some("pending") => {}
            other => panic!("unexpected state {other:?}: {body}"),
        }
    }
    let states: Vec<&Value> = answers.iter().map(|(_, body)| &body["state"]).collect();
    assert_eq!(placed, 1, "only one fits the node's CPUs: {states:?}");
    invariants::check(&f.servers[0]).await;
}

/// 120 reservations end at the same millisecond while every replica reconciles and the
/// tenant releases a third of them: each ends once, is refunded once, and the reconciler
/// keeps working afterwards.
async fn reservations_ending_together_on_every_replica_are_refunded_once(db: Db) {
    let f = fleet(db, 15, 200, json!({})).await;
    let mut ids = Vec::new();
    for i in 0..120 {
        let r = f.create(i, f.ask(&format!("k-{i}"), 1, None)).await;
        assert_eq!(r["state"], "placed", "{r}");
        ids.push(r["id"].clone());
    }
    f.set_clocks(T0 + MIN).await;
    let end = T0 + 2 * HOUR;
    let mut races: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
        Vec::new();
    for (i, server) in f.servers.iter().enumerate() {
        let admin = server.admin();
        races.push(Box::pin(async move {
            let (status, body) = admin.post("/v1/clock", json!({ "nowMs": end })).await;
            assert_eq!(status, StatusCode::OK, "replica {i}: {body}");
        }));
    }
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let tenant = f.tenant(i);
        let id = id.clone();
        races.push(Box::pin(async move {
            let (status, body) = rpc(
                &tenant,
                "release",
                json!({ "tenantId": "tenant-a", "reservationId": id }),
            )
            .await;
            assert_not_5xx(status, &body);
        }));
    }
    all(races).await;
    for id in &ids {
        let r = f.get(id).await;
        assert!(
            r["state"] == "expired" || r["state"] == "released",
            "{id}: {}",
            r["state"]
        );
    }
    invariants::check(&f.servers[0]).await;
    // The reconciler still moves reservations on every replica.
    let later = f.create(1, f.ask("k-after", 8, Some(end + HOUR))).await;
    f.set_clocks(end + HOUR).await;
    assert_eq!(f.get(&later["id"]).await["state"], "active");
    invariants::check(&f.servers[0]).await;
}

/// 90 placed reservations start at the same millisecond while every replica reconciles
/// (the pass starts them in batches) and the tenant releases a third of them: each that
/// started did so once, with one event and one audit entry, and none released before its
/// start was started after it.
async fn reservations_starting_together_on_every_replica_while_released_start_once(db: Db) {
    let f = fleet(db, 12, 200, json!({})).await;
    let start = T0 + HOUR;
    let ids = f.placed(90, start).await;
    let mut races: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
        Vec::new();
    for server in &f.servers {
        let admin = server.admin();
        races.push(Box::pin(async move {
            let (status, body) = admin.post("/v1/clock", json!({ "nowMs": start })).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }));
    }
    for (i, id) in ids.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        let (tenant, id) = (f.tenant(i), id.clone());
        races.push(Box::pin(async move {
            let body = json!({ "tenantId": "tenant-a", "reservationId": id });
            let (status, body) = rpc(&tenant, "release", body).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }));
    }
    all(races).await;
    let mut db = crate::support::connect(&f.servers[0].database_url()).await;
    for (i, id) in ids.iter().enumerate() {
        let state = f.get(id).await["state"].clone();
        let (events, audited): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM events WHERE object_id = $1 AND type = 'reservation.active'),
                    (SELECT COUNT(*) FROM audit_log WHERE object_id = $1 AND action = 'compute-reservation.activate')",
        )
        .bind(id.as_str().unwrap())
        .fetch_one(&mut db)
        .await
        .unwrap();
        match i % 3 {
            0 => assert!(
                state == "released" && events <= 1,
                "{id}: {state}, {events} starts"
            ),
            _ => assert!(
                state == "active" && events == 1,
                "{id}: {state}, {events} starts"
            ),
        }
        assert_eq!(audited, events, "{id}: one audit entry a start");
    }
    invariants::check(&f.servers[0]).await;
}

/// Thirty placed reservations start at once while each is extended: every extend that
/// answered `extended: true` keeps its end, and the bookings end where the reservation does.
async fn an_extend_racing_activation_is_never_lost(db: Db) {
    let f = fleet(db, 4, 64, json!({})).await;
    let start = T0 + HOUR;
    let ids = f.placed(30, start).await;
    let mut extends = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let tenant = f.tenant(i);
        let body = json!({ "tenantId": "tenant-a", "reservationId": id, "by": "1h", "idempotencyKey": format!("x-{i}") });
        extends.push(tokio::spawn(
            async move { rpc(&tenant, "extend", body).await },
        ));
    }
    f.set_clocks(start).await;
    let mut answers = Vec::new();
    for extend in extends {
        answers.push(extend.await.unwrap());
    }
    // Activation runs again on a second pass for any reservation an extend changed.
    f.set_clocks(start + 1).await;
    for (id, (status, body)) in ids.iter().zip(answers) {
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["extended"], true, "{body}");
        let r = f.get(id).await;
        assert_eq!(r["state"], "active", "{r}");
        assert_eq!(r["end"], start + 3 * HOUR, "the extended end was kept: {r}");
        assert_eq!(booked_window(&f.servers[0], id).await.1, start + 3 * HOUR);
        let body = json!({ "tenantId": "tenant-a", "reservationId": id, "by": "1h", "idempotencyKey": "again" });
        let (status, again) = rpc(&f.tenant(0), "extend", body).await;
        assert_eq!(
            status,
            StatusCode::OK,
            "no extend is left in flight: {again}"
        );
    }
    invariants::check(&f.servers[0]).await;
}

/// Each of four nodes is held whole until T0+2h; an extend of each races a create that
/// books the whole node from T0+2h. Either may win, but neither answers 5xx, and an extend
/// that lost names when the next booking starts.
async fn an_extend_racing_a_create_answers_available_until_not_500(db: Db) {
    let f = fleet(db, 4, 64, json!({})).await;
    let mut held = Vec::new();
    for i in 0..4 {
        let r = f.create(i, f.ask(&format!("k-{i}"), 8, None)).await;
        assert_eq!(r["state"], "placed", "{r}");
        held.push(r["id"].clone());
    }
    let mut races = Vec::new();
    for (i, id) in held.iter().enumerate() {
        let extend = json!({ "tenantId": "tenant-a", "reservationId": id, "by": "1h", "idempotencyKey": format!("x-{i}") });
        let create = f.ask(&format!("later-{i}"), 8, Some(T0 + 2 * HOUR));
        let (a, b) = (f.tenant(i), f.tenant(i + 1));
        races.push(tokio::spawn(async move {
            tokio::join!(rpc(&a, "extend", extend), rpc(&b, "create", create))
        }));
    }
    let mut extended = 0;
    for race in races {
        let ((status, extend), (create_status, create)) = race.await.unwrap();
        assert_not_5xx(create_status, &create);
        assert_eq!(status, StatusCode::OK, "{extend}");
        if extend["extended"] == true {
            extended += 1;
            assert_eq!(extend["reservation"]["end"], T0 + 3 * HOUR);
        } else {
            assert_eq!(extend["availableUntil"], T0 + 2 * HOUR, "{extend}");
        }
    }
    let later: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM compute_reservations WHERE state = 'placed' AND start_ms = $1",
    )
    .bind(T0 + 2 * HOUR)
    .fetch_one(&mut f.servers[0].database().await)
    .await
    .unwrap();
    assert_eq!(
        later,
        4 - extended,
        "every node went to exactly one of the two"
    );
    invariants::check(&f.servers[0]).await;
}

/// Twenty reservations are each extended and released at once: an extend never answers
/// `extended: true` for a reservation that ends released, unless it came first, and no
/// `reservation.extended` follows a `reservation.released`.
async fn an_extend_racing_release_never_extends_a_released_reservation(db: Db) {
    let f = fleet(db, 3, 64, json!({})).await;
    let mut ids = Vec::new();
    for i in 0..20 {
        let r = f.create(i, f.ask(&format!("k-{i}"), 1, None)).await;
        ids.push(r["id"].clone());
    }
    let mut races = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let extend = json!({ "tenantId": "tenant-a", "reservationId": id, "by": "1h", "idempotencyKey": format!("x-{i}") });
        let release = json!({ "tenantId": "tenant-a", "reservationId": id });
        let (a, b) = (f.tenant(i), f.tenant(i + 1));
        races.push(tokio::spawn(async move {
            tokio::join!(rpc(&a, "extend", extend), rpc(&b, "release", release))
        }));
    }
    for (id, race) in ids.iter().zip(races) {
        let ((status, extend), (release_status, release)) = race.await.unwrap();
        assert_eq!(release_status, StatusCode::OK, "{release}");
        assert_eq!(release["state"], "released");
        assert_not_5xx(status, &extend);
        if status == StatusCode::OK && extend["extended"] == true {
            assert_ne!(extend["reservation"]["state"], "released", "{extend}");
        }
        let (_, end) = booked_window(&f.servers[0], id).await;
        assert_eq!(end, T0, "released at once, whatever the extend did");
    }
    invariants::check(&f.servers[0]).await;
}

/// A node reservation releases all of n1 to spot; spot creates race a reclaim of those
/// units. Whatever order they commit in, no live spot reservation keeps a booking on a
/// reclaimed unit.
async fn a_spot_create_racing_a_reclaim_never_survives_it(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let admin = f.servers[0].admin();
    f.servers[0].org_with_key("anchor", "member").await;
    let units: Vec<String> = (0..8).map(|g| format!("n1-gpu{g}")).collect();
    let (status, nr) = admin
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": units, "allowedOrgIds": ["anchor"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");
    let nr = nr["id"].as_str().unwrap().to_string();
    for round in 0..5 {
        let (status, body) = admin
            .post(
                &format!("/v1/nodes/n1/reservations/{nr}/release"),
                json!({ "unitIds": units }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let mut creates = Vec::new();
        for i in 0..8 {
            let mut body = f.ask(&format!("spot-{round}-{i}"), 1, None);
            body["spot"] = json!(true);
            let tenant = f.tenant(i);
            creates.push(tokio::spawn(
                async move { rpc(&tenant, "create", body).await },
            ));
        }
        let reclaimer = f.servers[round % f.servers.len()].admin();
        let path = format!("/v1/nodes/n1/reservations/{nr}/reclaim");
        let (status, reclaim) = reclaimer.post(&path, json!({ "unitIds": units })).await;
        assert_eq!(status, StatusCode::OK, "{reclaim}");
        for create in creates {
            let (status, body) = create.await.unwrap();
            assert_not_5xx(status, &body);
        }
        let survivors: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM bookings b JOIN compute_reservations r ON r.id = b.reservation_id
             WHERE b.active = $1 AND b.spot = $1 AND r.state IN ('placed', 'binding', 'active')",
        )
        .bind(true)
        .fetch_one(&mut f.servers[0].database().await)
        .await
        .unwrap();
        assert_eq!(
            survivors, 0,
            "round {round}: spot work survived the reclaim"
        );
        invariants::check(&f.servers[0]).await;
    }
}

/// A reservation that waited for capacity books from when it was placed, not from when it
/// was asked for, so the unit is never billed to two reservations at once.
async fn a_reservation_placed_late_books_from_when_it_was_placed(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let first = f.create(0, f.ask("first", 8, None)).await;
    let waiting = f.create(0, f.ask("waiting", 8, None)).await;
    assert_eq!(waiting["state"], "pending");
    f.set_clocks(T0 + 10 * MIN).await;
    f.release(0, &first["id"]).await;
    let placed = f.get(&waiting["id"]).await;
    assert_eq!(placed["state"], "placed", "{placed}");
    assert_eq!(
        booked_window(&f.servers[0], &waiting["id"]).await,
        (T0 + 10 * MIN, T0 + 2 * HOUR)
    );
    invariants::check(&f.servers[0]).await;
}

/// A lease counts from the window's start: a reservation placed for later does not lapse
/// before it opens.
async fn a_lease_with_a_future_start_counts_from_the_start(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let mut ask = f.ask("leased", 1, Some(T0 + HOUR));
    ask["leaseSeconds"] = json!(60);
    let r = f.create(0, ask).await;
    assert_eq!(r["state"], "placed");
    assert_eq!(r["leaseDeadline"], T0 + HOUR + 60_000);
    f.set_clocks(T0 + 30 * MIN).await;
    assert_eq!(f.get(&r["id"]).await["state"], "placed");
    f.set_clocks(T0 + HOUR).await;
    assert_eq!(f.get(&r["id"]).await["state"], "active");
    f.set_clocks(T0 + HOUR + 60_000).await;
    let lapsed = f.get(&r["id"]).await;
    assert_eq!(lapsed["state"], "released");
    assert_eq!(lapsed["reason"], "lease-lapsed");
}

/// A node binding hands over the whole node: every unit is booked, and nobody else is
/// placed on it.
async fn a_node_binding_books_the_whole_node(db: Db) {
    let f = fleet(db, 2, 64, json!({ "tenantRoot": true })).await;
    let mut ask = f.ask("node", 1, None);
    ask["binding"] = json!("node");
    let r = f.create(0, ask).await;
    assert_eq!(r["state"], "placed", "{r}");
    let node = r["placement"]["nodeId"].as_str().unwrap().to_string();
    assert_eq!(
        r["placement"]["unitIds"].as_array().unwrap().len(),
        8,
        "{r}"
    );
    let other = f.create(1, f.ask("other", 1, None)).await;
    assert_eq!(other["state"], "placed");
    assert_ne!(other["placement"]["nodeId"], node.as_str());
    let mut second = f.ask("second-node", 1, None);
    second["binding"] = json!("node");
    let second = f.create(0, second).await;
    assert_eq!(
        second["state"], "pending",
        "the other node is partly booked: {second}"
    );
    invariants::check(&f.servers[0]).await;
}

/// One server whose pending reservations' retries (`ORL_TEST_RETRY_GATE`), or creates'
/// placement attempts (`ORL_TEST_CREATE_GATE`), are held after deciding, before they
/// write, until the gate opens.
struct Gated {
    f: Fleet,
    gates: tempfile::TempDir,
}

impl Gated {
    async fn start(db: Db) -> Gated {
        Gated::on(db, "ORL_TEST_RETRY_GATE").await
    }

    /// The server with the gate `var` (see `booking::gate`) at `open` in a directory of
    /// its own.
    async fn on(db: Db, var: &str) -> Gated {
        let gates = tempfile::tempdir().unwrap();
        let gate = gates.path().join("open").display().to_string();
        let server = Server::start_with(db, fleet_options(vec![(var.into(), gate)])).await;
        server.org_with_key("tenant-b", "member").await;
        let f = fleet_on(server, 1, 64, json!({})).await;
        Gated { f, gates }
    }

    /// Releases `id` in a task of its own: the release wakes the pool, and its answer waits
    /// for the retries it starts.
    fn release(&self, id: &Value) -> tokio::task::JoinHandle<(StatusCode, Value)> {
        let (tenant, body) = (
            self.f.tenant(0),
            json!({ "tenantId": "tenant-a", "reservationId": id }),
        );
        tokio::spawn(async move { rpc(&tenant, "release", body).await })
    }

    /// Waits until a retry is held at the gate.
    async fn reached(&self) {
        self.reached_at("open.reached").await;
    }

    /// Waits until the file `reached` of the gate's directory exists.
    async fn reached_at(&self, reached: &str) {
        crate::support::reached(&self.gates.path().join(reached)).await;
    }

    /// Opens the gate: the held retry writes, and the release that started it answers.
    /// Answers the reservation `waiting` as the retry left it.
    async fn open(
        &self,
        release: tokio::task::JoinHandle<(StatusCode, Value)>,
        waiting: &Value,
    ) -> Value {
        std::fs::write(self.gates.path().join("open"), b"").unwrap();
        let (status, released) = release.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{released}");
        self.f.get(&waiting["id"]).await
    }

    /// Fills n1 with `first`, creates `waiting` from `ask` (which then waits), and
    /// releases `first`: the waiting reservation's retry decides on the units freed and is
    /// held at the gate. Answers the release (see [`Gated::open`]) and `waiting`.
    async fn hold_a_retry(
        &self,
        ask: Value,
    ) -> (tokio::task::JoinHandle<(StatusCode, Value)>, Value) {
        let first = self.f.create(0, self.f.ask("first", 8, None)).await;
        let waiting = self.f.create(0, ask).await;
        assert_eq!(waiting["state"], "pending", "{waiting}");
        let release = self.release(&first["id"]);
        self.reached().await;
        (release, waiting)
    }

    /// Creates `key` (one GPU) with its placement attempts held (`ORL_TEST_CREATE_GATE`):
    /// while attempt `i` is held, n1's units `claims[i]` are claimed for another org.
    /// Answers the create's answer.
    async fn create_losing(&self, key: &str, claims: &[std::ops::Range<usize>]) -> Value {
        let (tenant, ask) = (self.f.tenant(0), self.f.ask(key, 1, None));
        let create = tokio::spawn(async move { rpc(&tenant, "create", ask).await });
        // A create makes three attempts at most.
        for attempt in 0..(claims.len() + 1).min(3) {
            self.reached_at(&format!("open.{attempt}.reached")).await;
            if let Some(units) = claims.get(attempt) {
                self.claim_for_another_org(units.clone()).await;
            }
            std::fs::write(self.gates.path().join(format!("open.{attempt}")), b"").unwrap();
        }
        let (status, r) = create.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    /// Claims n1's units `gpus` for `tenant-b` with a node reservation.
    async fn claim_for_another_org(&self, gpus: std::ops::Range<usize>) {
        let units: Vec<String> = gpus.map(|u| format!("n1-gpu{u}")).collect();
        let (status, claim) = (self.f.servers[0].admin())
            .post(
                "/v1/nodes/n1/reservations",
                json!({ "unitIds": units, "allowedOrgIds": ["tenant-b"] }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{claim}");
    }

    /// How many units are booked to `id`.
    async fn booked(&self, id: &Value) -> i64 {
        let mut db = self.f.servers[0].database().await;
        sqlx::query_scalar("SELECT COUNT(*) FROM bookings WHERE reservation_id = $1")
            .bind(id.as_str().unwrap())
            .fetch_one(&mut db)
            .await
            .unwrap()
    }
}

/// A pending reservation's retry that decided on units a node reservation then claimed for
/// another org, before its write: the write reads the node's rights again and loses, and
/// the reservation waits instead of taking units its tenant may not use.
async fn a_retry_decided_before_a_node_reservation_claimed_its_units_does_not_take_them(db: Db) {
    let g = Gated::start(db).await;
    let (release, waiting) = g.hold_a_retry(g.f.ask("waiting", 2, None)).await;
    g.claim_for_another_org(0..8).await;
    let after = g.open(release, &waiting).await;
    assert_eq!(after["state"], "pending", "{after}");
    assert_eq!(
        g.booked(&waiting["id"]).await,
        0,
        "nothing of the claimed node"
    );
}

/// A pending reservation's retry whose chosen units a node reservation claimed before its
/// write loses the write, and, in the same pass, decides again on what the node has left.
async fn a_retry_that_lost_its_write_decides_again_and_places_on_what_is_left(db: Db) {
    let g = Gated::start(db).await;
    let (release, waiting) = g.hold_a_retry(g.f.ask("waiting", 2, None)).await;
    // The placer takes the lowest free units first: the retry decided on two of these.
    g.claim_for_another_org(0..6).await;
    let after = g.open(release, &waiting).await;
    assert_eq!(after["state"], "placed", "decided again at once: {after}");
    assert_eq!(
        after["placement"]["unitIds"],
        json!(["n1-gpu6", "n1-gpu7"]),
        "{after}"
    );
    assert_eq!(after["conditions"], json!([]), "no longer unschedulable");
}

/// A create whose decision loses on each of its three placement attempts (a node
/// reservation claims the unit each decided on, before its write) waits as `pending`,
/// with nothing booked, and its retry places it on what the node has left.
async fn a_create_that_loses_its_decision_on_every_attempt_waits_and_its_retry_places_it(db: Db) {
    let g = Gated::on(db, "ORL_TEST_CREATE_GATE").await;
    // The placer takes the lowest free unit: each attempt decided on the first of these.
    let r = g.create_losing("contested", &[0..2, 2..4, 4..6]).await;
    assert_eq!(r["state"], "pending", "{r}");
    let why = r["conditions"][0]["message"].as_str().unwrap_or_default();
    assert!(why.contains("booked concurrently"), "{r}");
    assert_eq!(g.booked(&r["id"]).await, 0);
    g.f.servers[0].set_clock(T0 + 30_000).await;
    let placed = g.f.get(&r["id"]).await;
    assert_eq!(placed["state"], "placed", "{placed}");
    assert_eq!(
        placed["placement"]["unitIds"],
        json!(["n1-gpu6"]),
        "{placed}"
    );
}

/// A create whose decision loses on its first two placement attempts is placed by its
/// last, on what the node has left.
async fn a_create_that_loses_its_decision_twice_is_placed_by_its_last_attempt(db: Db) {
    let g = Gated::on(db, "ORL_TEST_CREATE_GATE").await;
    let r = g.create_losing("contested", &[0..2, 2..4]).await;
    assert_eq!(r["state"], "placed", "{r}");
    assert_eq!(r["placement"]["unitIds"], json!(["n1-gpu4"]), "{r}");
    assert_eq!(g.booked(&r["id"]).await, 1);
}

/// A pending reservation's retry that decided on a node whose provider then reported fewer
/// host CPUs, before its write: the write reads the node's CPUs again and loses, and the
/// reservation waits instead of booking more CPUs than the node has.
async fn a_retry_decided_before_its_node_shrank_does_not_overbook_its_cpus(db: Db) {
    let g = Gated::start(db).await;
    let f = &g.f;
    let (status, offer) = f.servers[0]
        .admin()
        .post(
            &format!("/v1/pools/{}/offers", f.pool),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": 64, "vcpu": 4096 } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{offer}");
    let mut ask = f.ask("waiting", 2, None);
    ask["resources"] = json!({ "vcpu": 150 });
    let (release, waiting) = g.hold_a_retry(ask).await;
    let mut inventory = crate::support::h100_inventory("n1", 8);
    inventory["host"]["vcpu"] = json!(100);
    let (status, node) = f
        .provider
        .put("/v1/orgs/acme/provider/nodes/n1", inventory)
        .await;
    assert_eq!(status, StatusCode::OK, "{node}");
    let after = g.open(release, &waiting).await;
    assert_eq!(after["state"], "pending", "150 CPUs exceed 100: {after}");
    assert_eq!(g.booked(&waiting["id"]).await, 0);
}
