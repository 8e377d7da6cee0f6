//! Bindings and the node agent protocol (seed 004): `node` and `kubernetes` reservations go
//! `placed → binding → active` as their node reports, a failed bind fails them, a released
//! `kubernetes` reservation keeps its devices booked while pods hold them (carried in
//! 5-minute steps, unbilled, for at most 24 hours, yielding to a booking made in advance),
//! and a node that stops reporting is lost. The node agent's side is driven over HTTP.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    Api, Db, Server, T0, assert_error, list_params, on_both_databases, pages, register_node,
};

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;

/// Provider `acme` with nodes of 8 H100s in one pool with `policy`, offered to `tenant-a`
/// and to `acme` itself (8 GPUs each). `agent` is acme's provider key (the node agents'),
/// `owner` an acme member key that books, `tenant` a tenant-a member key.
struct World {
    server: Server,
    agent: Api,
    owner: Api,
    tenant: Api,
    pool: String,
    /// The nodes whose agents are running (they report at every clock step).
    live: Vec<String>,
    now: i64,
}

async fn world(db: Db, nodes: &[&str], policy: Value) -> World {
    let server = Server::start(db).await;
    let agent = server.org_with_key("acme", "provider").await;
    for node in nodes {
        register_node(&agent, "acme", node, 8).await;
    }
    let owner = server.as_key(&server.key_in("acme", json!({ "role": "member" })).await);
    let tenant = server.org_with_key("tenant-a", "member").await;
    let (status, pool) = server
        .admin()
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": nodes, "policy": policy }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    for org in ["tenant-a", "acme"] {
        let (status, offer) = server
            .admin()
            .post(
                &format!("/v1/pools/{pool}/offers"),
                json!({ "tenantId": org, "quota": { "gpu": 8 } }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{offer}");
    }
    World {
        server,
        agent,
        owner,
        tenant,
        pool,
        live: Vec::new(),
        now: T0,
    }
}

async fn rpc(api: &Api, method: &str, body: Value) -> (StatusCode, Value) {
    api.post(&format!("/api/compute/reservations/{method}"), body)
        .await
}

impl World {
    fn ask(&self, tenant: &str, key: &str, binding: &str) -> Value {
        json!({ "tenantId": tenant, "poolId": self.pool, "devices": [{ "class": "gpu", "count": 8 }],
                "duration": "1h", "binding": binding, "idempotencyKey": key })
    }

    fn api_of(&self, tenant: &str) -> &Api {
        if tenant == "acme" {
            &self.owner
        } else {
            &self.tenant
        }
    }

    async fn create(&self, body: Value) -> Value {
        let tenant = body["tenantId"].as_str().unwrap().to_string();
        let (status, r) = rpc(self.api_of(&tenant), "create", body).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    async fn get(&self, r: &Value) -> Value {
        let tenant = r["tenantId"].as_str().unwrap();
        let (status, got) = rpc(
            self.api_of(tenant),
            "get",
            json!({ "tenantId": tenant, "reservationId": r["id"] }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{got}");
        got
    }

    async fn release(&self, r: &Value) -> Value {
        let tenant = r["tenantId"].as_str().unwrap();
        let (status, got) = rpc(
            self.api_of(tenant),
            "release",
            json!({ "tenantId": tenant, "reservationId": r["id"] }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{got}");
        got
    }

    async fn used_gpus(&self, tenant: &str) -> i64 {
        let (_, offers) = self
            .server
            .admin()
            .get(&format!("/v1/pools/{}/offers", self.pool))
            .await;
        offers["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["tenantId"] == tenant)
            .map_or(0, |o| o["used"]["gpu"].as_i64().unwrap_or(0))
    }

    /// The node agent polls: what `node` must bind or unbind now (one page holds it all).
    async fn poll(&self, node: &str) -> Vec<Value> {
        let (status, page) = self.agent.get(&format!("/v1/nodes/{node}/bindings")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page.get("cursor").is_none(), "{page}");
        page["items"].as_array().unwrap().clone()
    }

    /// The node agent reports on a reservation.
    async fn report(&self, node: &str, r: &Value, body: Value) -> (StatusCode, Value) {
        let id = r["id"].as_str().unwrap();
        self.agent
            .post(&format!("/v1/nodes/{node}/bindings/{id}"), body)
            .await
    }

    /// Starts the agent of `node`: it reports now and at every later clock step.
    async fn start_agent(&mut self, node: &str) {
        self.poll(node).await;
        self.live.push(node.to_string());
    }

    /// Moves the clock to `to` in steps of at most 4 minutes; the live agents report at
    /// every step, so their nodes are never lost.
    async fn advance(&mut self, to: i64) {
        while self.now < to {
            self.now = (self.now + 4 * MIN).min(to);
            self.server.set_clock(self.now).await;
            for node in self.live.clone() {
                self.poll(&node).await;
            }
        }
    }

    async fn node(&self, node: &str) -> Value {
        let (status, view) = self.agent.get(&format!("/v1/nodes/{node}")).await;
        assert_eq!(status, StatusCode::OK, "{view}");
        view
    }

    /// The condition types on a node.
    async fn node_conditions(&self, node: &str) -> Vec<String> {
        self.node(node).await["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap().to_string())
            .collect()
    }

    /// `(end_ms, billable_end_ms, active)` of the reservation's GPU bookings, read from the
    /// database (the API does not show booking rows).
    /// Whether `r` has bookings, every one of them `active` (or every one not).
    async fn bookings_all(&self, r: &Value, active: bool) -> bool {
        let bookings = self.bookings(r).await;
        !bookings.is_empty() && bookings.iter().all(|(_, _, a)| *a == active)
    }

    async fn bookings(&self, r: &Value) -> Vec<(i64, Option<i64>, bool)> {
        use sqlx::{Connection as _, Row as _};
        let url = self.server.db.url.clone().unwrap_or_else(|| {
            format!(
                "sqlite://{}",
                self.server.data_dir.path().join("orl.db").display()
            )
        });
        sqlx::any::install_default_drivers();
        let mut conn = sqlx::AnyConnection::connect(&url).await.unwrap();
        let postgres = url.starts_with("postgres");
        let active = if postgres {
            "CASE WHEN active THEN 1 ELSE 0 END"
        } else {
            "active"
        };
        sqlx::query(&format!(
            "SELECT end_ms, billable_end_ms, CAST({active} AS BIGINT) AS active FROM bookings
             WHERE reservation_id = $1 ORDER BY unit_id"
        ))
        .bind(r["id"].as_str().unwrap())
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|row| {
            (
                row.get::<i64, _>("end_ms"),
                row.get::<Option<i64>, _>("billable_end_ms"),
                row.get::<i64, _>("active") == 1,
            )
        })
        .collect()
    }

    /// A bound `kubernetes` reservation of all 8 GPUs of `n1`, from T0 for an hour.
    async fn bound_kubernetes(&mut self) -> Value {
        self.start_agent("n1").await;
        let r = self.create(self.ask("acme", "k8s-1", "kubernetes")).await;
        assert_eq!(r["state"], "placed", "{r}");
        self.advance(T0 + 1000).await;
        assert_eq!(self.get(&r).await["state"], "binding");
        let (status, bound) = self.report("n1", &r, json!({ "status": "bound" })).await;
        assert_eq!(status, StatusCode::OK, "{bound}");
        let r = self.get(&r).await;
        assert_eq!(r["state"], "active");
        r
    }
}

fn condition<'a>(r: &'a Value, kind: &str) -> Option<&'a Value> {
    r["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
}

on_both_databases!(
    a_node_binding_goes_placed_binding_active_when_its_node_reports_bound,
    bindings_the_pool_does_not_allow_are_invalid_input,
    a_failed_report_fails_the_reservation_and_frees_its_devices_and_quota,
    the_agent_protocol_is_scoped_to_the_nodes_owner_and_validated,
    a_released_kubernetes_reservation_holds_its_devices_until_allocation_released,
    a_kubernetes_reservation_released_before_its_node_binds_it_frees_its_devices_at_once,
    held_devices_past_their_end_are_carried_unbilled_in_five_minute_steps_and_the_node_is_stuck,
    the_carry_of_held_devices_stops_after_24_hours,
    a_booking_made_in_advance_takes_held_devices_at_its_start,
    a_lost_node_fails_its_reservations_and_its_capacity_is_booked_elsewhere,
    held_devices_on_a_lost_node_are_freed_and_booked_again_once_it_reports,
    a_lost_node_recovers_once_when_its_inventory_or_its_agent_reports,
    a_nodes_bindings_page_oldest_request_first,
);

async fn a_node_binding_goes_placed_binding_active_when_its_node_reports_bound(db: Db) {
    let mut w = world(db, &["n1"], json!({ "tenantRoot": true })).await;
    let mut ask = w.ask("tenant-a", "k-1", "node");
    ask["start"] = json!(T0 + 10 * MIN);
    let r = w.create(ask).await;
    assert_eq!(r["state"], "placed", "{r}");
    w.start_agent("n1").await;
    assert!(
        w.poll("n1").await.is_empty(),
        "nothing to bind before the start"
    );

    w.advance(T0 + 10 * MIN).await;
    let binding = w.get(&r).await;
    assert_eq!(binding["state"], "binding");
    assert!(
        binding.get("binding").is_none(),
        "no binding shown before the node reports it bound: {binding}"
    );
    let asked = w.poll("n1").await;
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["reservationId"], r["id"]);
    assert_eq!(asked[0]["binding"], "node");
    assert_eq!(asked[0]["action"], "bind");
    assert_eq!(asked[0]["tenantId"], "tenant-a");
    assert_eq!(asked[0]["unitIds"], r["placement"]["unitIds"]);
    assert_eq!(asked[0]["resources"], r["resources"]);

    w.advance(T0 + 11 * MIN).await;
    let (status, bound) = w
        .report(
            "n1",
            &r,
            json!({ "status": "bound", "message": "handed over" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{bound}");
    assert_eq!(bound["status"], "bound");
    assert_eq!(bound["state"], "active");
    let active = w.get(&r).await;
    assert_eq!(active["state"], "active");
    assert_eq!(active["binding"]["nodeId"], "n1");
    assert_eq!(active["binding"]["status"], "bound");
    assert_eq!(active["binding"]["boundAt"], T0 + 11 * MIN);
    assert_eq!(active["binding"]["unitIds"], r["placement"]["unitIds"]);
    assert!(w.poll("n1").await.is_empty(), "nothing left to do");
    let (status, again) = w.report("n1", &r, json!({ "status": "bound" })).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a repeated report changes nothing: {again}"
    );

    // Release: the node is asked to give the node back, and the devices are free at once.
    let released = w.release(&r).await;
    assert_eq!(released["state"], "released");
    assert!(condition(&released, "DevicesHeld").is_none());
    let asked = w.poll("n1").await;
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["action"], "unbind");
    let (status, done) = w
        .report("n1", &r, json!({ "status": "allocation-released" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "released");
    assert!(w.poll("n1").await.is_empty());

    let (_, events) = w.tenant.get("/v1/events").await;
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["objectId"] == r["id"])
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "reservation.placed",
            "reservation.binding",
            "reservation.active",
            "reservation.released"
        ]
    );
}

async fn bindings_the_pool_does_not_allow_are_invalid_input(db: Db) {
    let w = world(db, &["n1"], json!({})).await;
    for (tenant, key, binding) in [("tenant-a", "k-1", "node"), ("acme", "k-2", "kubernetes")] {
        let (status, err) = rpc(w.api_of(tenant), "create", w.ask(tenant, key, binding)).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    }

    let w = world(
        db,
        &["n1"],
        json!({ "tenantRoot": true, "kubernetes": true }),
    )
    .await;
    let mut with_resources = w.ask("tenant-a", "k-3", "node");
    with_resources["resources"] = json!({ "vcpu": 8 });
    let (status, err) = rpc(&w.tenant, "create", with_resources).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(err["error"]["details"]["field"], "resources", "{err}");
    let (status, err) = rpc(&w.tenant, "create", w.ask("tenant-a", "k-4", "kubernetes")).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = rpc(&w.tenant, "create", w.ask("tenant-a", "k-5", "vm")).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "UNSUPPORTED");
    assert_eq!(w.used_gpus("tenant-a").await, 0);

    let node = w.create(w.ask("tenant-a", "k-6", "node")).await;
    assert_eq!(node["state"], "placed");
    w.release(&node).await;
    let kube = w.create(w.ask("acme", "k-7", "kubernetes")).await;
    assert_eq!(kube["state"], "placed", "the pool's owner books kubernetes");
}

async fn a_failed_report_fails_the_reservation_and_frees_its_devices_and_quota(db: Db) {
    let mut w = world(db, &["n1"], json!({ "tenantRoot": true })).await;
    w.start_agent("n1").await;
    let r = w.create(w.ask("tenant-a", "k-1", "node")).await;
    w.advance(T0 + 1000).await;
    assert_eq!(w.poll("n1").await.len(), 1);
    assert_eq!(w.used_gpus("tenant-a").await, 8);
    let (status, err) = w
        .report("n1", &r, json!({ "status": "allocation-released" }))
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");

    let (status, failed) = w
        .report(
            "n1",
            &r,
            json!({ "status": "failed", "message": "IOMMU group busy" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{failed}");
    assert_eq!(failed["status"], "failed");
    let got = w.get(&r).await;
    assert_eq!(got["state"], "failed");
    assert_eq!(got["reason"], "binding-failed");
    assert_eq!(
        condition(&got, "BindingFailed").unwrap()["message"],
        "IOMMU group busy"
    );
    assert_eq!(w.used_gpus("tenant-a").await, 0, "quota refunded");
    assert!(w.poll("n1").await.is_empty());
    assert!(w.bookings_all(&r, false).await);

    let again = w.create(w.ask("tenant-a", "k-2", "node")).await;
    assert_eq!(again["state"], "placed", "the devices are free: {again}");
    let (_, events) = w.tenant.get("/v1/events").await;
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "reservation.failed" && e["objectId"] == r["id"])
    );
}

async fn the_agent_protocol_is_scoped_to_the_nodes_owner_and_validated(db: Db) {
    let mut w = world(db, &["n1", "n2"], json!({ "tenantRoot": true })).await;
    w.start_agent("n1").await;
    w.start_agent("n2").await;
    let r = w.create(w.ask("tenant-a", "k-1", "node")).await;
    w.advance(T0 + 1000).await;
    let node = r["placement"]["nodeId"].as_str().unwrap();
    let other = if node == "n1" { "n2" } else { "n1" };

    let stranger = w.server.org_with_key("stranger", "provider").await;
    let (status, err) = stranger.get(&format!("/v1/nodes/{node}/bindings")).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = w.tenant.get(&format!("/v1/nodes/{node}/bindings")).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = w.agent.get("/v1/nodes/nope/bindings").await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = w.report(other, &r, json!({ "status": "bound" })).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = w.report(node, &r, json!({ "status": "done" })).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = w
        .report(node, &r, json!({ "status": "bound", "extra": 1 }))
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = w
        .agent
        .post(
            &format!("/v1/nodes/{node}/bindings/rsv_bad"),
            json!({ "status": "bound" }),
        )
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(w.get(&r).await["state"], "binding", "nothing changed");

    let (_, doc) = w.server.anonymous().get("/openapi.json").await;
    for path in [
        "/v1/nodes/{nodeId}/bindings",
        "/v1/nodes/{nodeId}/bindings/{reservationId}",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} documented");
    }
}

async fn a_released_kubernetes_reservation_holds_its_devices_until_allocation_released(db: Db) {
    let mut w = world(db, &["n1"], json!({ "kubernetes": true })).await;
    let r = w.bound_kubernetes().await;
    assert_eq!(r["binding"]["status"], "bound");

    w.advance(T0 + 10 * MIN).await;
    let released = w.release(&r).await;
    assert_eq!(released["state"], "released", "released at once");
    let held = condition(&released, "DevicesHeld").expect("DevicesHeld");
    assert_eq!(held["since"], T0 + 10 * MIN);
    assert_eq!(w.used_gpus("acme").await, 0, "quota refunded at release");
    let asked = w.poll("n1").await;
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0]["action"], "unbind");
    assert_eq!(asked[0]["binding"], "kubernetes");
    assert_eq!(
        asked[0]["heldUntil"],
        T0 + HOUR,
        "booked (and billed) to its end"
    );
    assert!(
        w.bookings(&r)
            .await
            .iter()
            .all(|b| *b == (T0 + HOUR, None, true))
    );

    let waiting = w.create(w.ask("tenant-a", "k-2", "hold")).await;
    assert_eq!(
        waiting["state"], "pending",
        "held devices are not free: {waiting}"
    );

    w.advance(T0 + 20 * MIN).await;
    let (status, done) = w
        .report("n1", &r, json!({ "status": "allocation-released" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["status"], "released");
    assert_eq!(done["releasedAt"], T0 + 20 * MIN);
    assert!(
        w.bookings(&r)
            .await
            .iter()
            .all(|b| *b == (T0 + 20 * MIN, None, false)),
        "the bookings end when the node reports: {:?}",
        w.bookings(&r).await
    );
    let after = w.get(&r).await;
    assert_eq!(after["state"], "released");
    assert!(condition(&after, "DevicesHeld").is_none(), "{after}");
    assert_eq!(
        w.get(&waiting).await["state"],
        "placed",
        "freed devices wake the pool"
    );
    assert!(w.poll("n1").await.is_empty());
}

/// A kubernetes reservation released before its node bound it holds nothing: its devices
/// are free at once, and the capacity view, which loads its node again, places a create
/// there right after.
async fn a_kubernetes_reservation_released_before_its_node_binds_it_frees_its_devices_at_once(
    db: Db,
) {
    let mut w = world(db, &["n1"], json!({ "kubernetes": true })).await;
    w.start_agent("n1").await;
    let r = w.create(w.ask("acme", "k8s-1", "kubernetes")).await;
    assert_eq!(r["state"], "placed", "{r}");
    w.advance(T0 + 1000).await;
    assert_eq!(w.get(&r).await["state"], "binding");
    let released = w.release(&r).await;
    assert_eq!(released["state"], "released", "{released}");
    assert!(condition(&released, "DevicesHeld").is_none(), "{released}");
    let next = w.create(w.ask("tenant-a", "k-2", "hold")).await;
    assert_eq!(next["state"], "placed", "the freed node takes it: {next}");
}

async fn held_devices_past_their_end_are_carried_unbilled_in_five_minute_steps_and_the_node_is_stuck(
    db: Db,
) {
    let mut w = world(db, &["n1"], json!({ "kubernetes": true })).await;
    let r = w.bound_kubernetes().await;
    w.advance(T0 + 10 * MIN).await;
    w.release(&r).await;
    assert!(w.node_conditions("n1").await.is_empty());

    w.advance(T0 + HOUR).await;
    assert_eq!(w.poll("n1").await[0]["heldUntil"], T0 + HOUR + 5 * MIN);
    assert_eq!(
        w.bookings(&r).await[0],
        (T0 + HOUR + 5 * MIN, Some(T0 + HOUR), true),
        "carried, billed only to the original end"
    );
    assert_eq!(w.node_conditions("n1").await, ["KubernetesReleaseStuck"]);
    let node = w.node("n1").await;
    assert_eq!(node["conditions"][0]["since"], T0 + HOUR);

    w.advance(T0 + HOUR + 6 * MIN).await;
    let asked = w.poll("n1").await;
    assert_eq!(asked[0]["heldUntil"], T0 + HOUR + 10 * MIN);
    assert_eq!(asked[0]["stuckSince"], T0 + HOUR);

    let (status, done) = w
        .report("n1", &r, json!({ "status": "allocation-released" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(
        w.bookings(&r).await[0],
        (T0 + HOUR + 6 * MIN, Some(T0 + HOUR), false)
    );
    assert!(w.node_conditions("n1").await.is_empty(), "no longer stuck");
    let (status, earnings) = w.agent.get("/v1/orgs/acme/provider/earnings").await;
    assert_eq!(status, StatusCode::OK, "{earnings}");
    assert_eq!(
        earnings["gpuSeconds"],
        8 * 3600,
        "8 GPUs billed for the hour booked, not for the carried time: {earnings}"
    );
}

async fn the_carry_of_held_devices_stops_after_24_hours(db: Db) {
    let mut w = world(db, &["n1"], json!({ "kubernetes": true })).await;
    let r = w.bound_kubernetes().await;
    w.release(&r).await;
    w.advance(T0 + 25 * HOUR + 3 * MIN).await;
    assert!(
        w.bookings(&r)
            .await
            .iter()
            .all(|b| *b == (T0 + 25 * HOUR, Some(T0 + HOUR), false)),
        "carried to 24 h past the end, then ended: {:?}",
        w.bookings(&r).await
    );
    let got = w.get(&r).await;
    assert_eq!(
        condition(&got, "DevicesHeld").unwrap()["reason"],
        "CarryLimitReached"
    );
    assert_eq!(
        w.node_conditions("n1").await,
        ["KubernetesReleaseStuck"],
        "still stuck until the node reports"
    );
    let again = w.create(w.ask("tenant-a", "k-2", "hold")).await;
    assert_eq!(again["state"], "placed", "the devices are bookable again");
    let (status, _) = w
        .report("n1", &r, json!({ "status": "allocation-released" }))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(w.node_conditions("n1").await.is_empty());
}

async fn a_booking_made_in_advance_takes_held_devices_at_its_start(db: Db) {
    let mut w = world(db, &["n1"], json!({ "kubernetes": true })).await;
    let r = w.bound_kubernetes().await;
    w.advance(T0 + 10 * MIN).await;
    w.release(&r).await;
    let mut ask = w.ask("tenant-a", "k-2", "hold");
    ask["start"] = json!(T0 + HOUR + 7 * MIN);
    let advance = w.create(ask).await;
    assert_eq!(advance["state"], "placed", "{advance}");
    assert_eq!(advance["placement"]["nodeId"], "n1");

    w.advance(T0 + HOUR + 6 * MIN).await;
    assert_eq!(
        w.poll("n1").await[0]["heldUntil"],
        T0 + HOUR + 7 * MIN,
        "carried only up to the advance booking's start"
    );
    w.advance(T0 + HOUR + 8 * MIN).await;
    assert!(
        w.bookings(&r)
            .await
            .iter()
            .all(|b| *b == (T0 + HOUR + 7 * MIN, Some(T0 + HOUR), false)),
        "{:?}",
        w.bookings(&r).await
    );
    assert_eq!(w.get(&advance).await["state"], "active");
    let got = w.get(&r).await;
    assert_eq!(
        condition(&got, "DevicesHeld").unwrap()["reason"],
        "NextBookingStarted"
    );
}

async fn a_lost_node_fails_its_reservations_and_its_capacity_is_booked_elsewhere(db: Db) {
    let mut w = world(db, &["n1", "n2"], json!({})).await;
    w.start_agent("n1").await;
    w.start_agent("n2").await;
    let r = w.create(w.ask("tenant-a", "k-1", "hold")).await;
    assert_eq!(r["state"], "placed");
    let lost = r["placement"]["nodeId"].as_str().unwrap().to_string();
    let alive = if lost == "n1" { "n2" } else { "n1" }.to_string();
    w.advance(T0 + 1000).await;
    assert_eq!(w.get(&r).await["state"], "active");

    // The agent of the node holding the reservation stops; the other keeps reporting.
    w.live.retain(|n| *n != lost);
    w.advance(T0 + 4 * MIN).await;
    assert_eq!(w.get(&r).await["state"], "active", "not lost yet");
    w.advance(T0 + 5 * MIN + 1000).await;
    let failed = w.get(&r).await;
    assert_eq!(failed["state"], "failed");
    assert_eq!(failed["reason"], "node-lost");
    assert!(condition(&failed, "NodeLost").is_some(), "{failed}");
    let (_, page) = w.server.admin().get("/v1/audit?orgId=tenant-a").await;
    let moved: Vec<&Value> = (page["items"].as_array().unwrap().iter())
        .filter(|e| e["objectId"] == r["id"] && e["action"] == "compute-reservation.node-lost")
        .collect();
    assert_eq!(moved.len(), 1, "the failure is audited once: {page}");
    assert_eq!(moved[0]["actorKeyId"], "system", "{page}");
    assert_eq!(moved[0]["reason"], "node-lost", "{page}");
    assert_eq!(w.used_gpus("tenant-a").await, 0, "quota refunded");
    assert_eq!(w.node_conditions(&lost).await, ["NodeLost"]);
    assert!(w.node_conditions(&alive).await.is_empty());
    assert!(w.bookings_all(&r, false).await);

    let again = w.create(w.ask("tenant-a", "k-2", "hold")).await;
    assert_eq!(again["state"], "placed", "{again}");
    assert_eq!(again["placement"]["nodeId"], alive.as_str());
    assert_eq!(w.used_gpus("tenant-a").await, 8);
    let third = w.create(w.ask("acme", "k-3", "hold")).await;
    assert_eq!(
        third["state"], "pending",
        "the lost node gets no new placements"
    );

    // The node reports again: it is placeable again.
    w.start_agent(&lost).await;
    assert!(w.node_conditions(&lost).await.is_empty());
    // The next retry places it, the pass after that activates it.
    w.advance(T0 + 7 * MIN).await;
    w.advance(T0 + 8 * MIN).await;
    let third = w.get(&third).await;
    assert_eq!(third["state"], "active", "{third}");
    assert_eq!(third["placement"]["nodeId"], lost.as_str());
    let (_, events) = w.agent.get("/v1/events").await;
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "inventory.node-lost" && e["objectId"] == lost.as_str())
    );
}

async fn a_lost_node_recovers_once_when_its_inventory_or_its_agent_reports(db: Db) {
    let recoveries = |events: &Value, node: &str| {
        (events["items"].as_array().unwrap().iter())
            .filter(|e| e["type"] == "inventory.node-recovered" && e["objectId"] == node)
            .map(|e| e["payload"].clone())
            .collect::<Vec<_>>()
    };
    let mut w = world(db, &["n1", "n2"], json!({})).await;
    w.start_agent("n1").await;
    w.start_agent("n2").await;
    w.live.clear();
    w.advance(T0 + 5 * MIN + 1000).await;
    for node in ["n1", "n2"] {
        assert_eq!(w.node_conditions(node).await, ["NodeLost"]);
    }
    // n1 comes back through an unchanged inventory report, n2 through its agent; each
    // reports twice.
    for _ in 0..2 {
        register_node(&w.agent, "acme", "n1", 8).await;
        w.poll("n2").await;
    }
    let (_, events) = w.agent.get("/v1/events?limit=200").await;
    for node in ["n1", "n2"] {
        assert!(w.node_conditions(node).await.is_empty());
        assert_eq!(
            recoveries(&events, node),
            [json!({ "nodeId": node, "orgId": "acme" })],
            "one recovery of {node}: {events}"
        );
    }
}

async fn held_devices_on_a_lost_node_are_freed_and_booked_again_once_it_reports(db: Db) {
    let mut w = world(db, &["n1"], json!({ "kubernetes": true })).await;
    let r = w.bound_kubernetes().await;
    w.advance(T0 + 10 * MIN).await;
    let released = w.release(&r).await;
    assert_eq!(released["state"], "released");
    assert!(condition(&released, "DevicesHeld").is_some(), "{released}");
    assert!(w.bookings_all(&r, true).await);
    let waiting = w.create(w.ask("tenant-a", "k-2", "hold")).await;
    assert_eq!(waiting["state"], "pending", "held devices are not free");

    // The node's agent stops before it reports the devices released.
    w.live.clear();
    w.advance(T0 + 14 * MIN).await;
    assert!(w.bookings_all(&r, true).await, "not lost yet");
    w.advance(T0 + 15 * MIN + 1000).await;
    let bookings = w.bookings(&r).await;
    assert_eq!(bookings.len(), 8);
    assert!(
        bookings
            .iter()
            .all(|(end, _, active)| !active && *end <= T0 + 15 * MIN + 1000),
        "the held bookings end when the node is lost: {bookings:?}"
    );
    let got = w.get(&r).await;
    assert_eq!(
        got["state"], "released",
        "a terminal reservation stays as it ended"
    );
    assert!(condition(&got, "DevicesHeld").is_none(), "{got}");
    assert_eq!(got["binding"]["status"], "lost", "{got}");
    assert_eq!(w.node_conditions("n1").await, ["NodeLost"]);
    assert_eq!(
        w.get(&waiting).await["state"],
        "pending",
        "a lost node gets no new placements"
    );

    // The node reports again: nothing is held there any more and its GPUs are booked.
    w.start_agent("n1").await;
    assert!(w.node_conditions("n1").await.is_empty());
    assert!(
        w.poll("n1")
            .await
            .iter()
            .all(|b| b["reservationId"] != r["id"]),
        "no unbind is asked of it"
    );
    let (status, late) = w
        .report("n1", &r, json!({ "status": "allocation-released" }))
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a late report changes nothing: {late}"
    );
    assert_eq!(late["status"], "lost");
    w.advance(T0 + 30 * MIN).await;
    let placed = w.get(&waiting).await;
    assert!(
        placed["state"] == "placed" || placed["state"] == "active",
        "{placed}"
    );
    assert_eq!(placed["placement"]["nodeId"], "n1");
    assert_eq!(w.used_gpus("tenant-a").await, 8);
}

async fn a_nodes_bindings_page_oldest_request_first(db: Db) {
    let mut w = world(db, &["n1"], json!({ "kubernetes": true })).await;
    w.start_agent("n1").await;
    let one_gpu = |key: &str, start: i64| {
        let mut ask = w.ask("acme", key, "kubernetes");
        ask["devices"] = json!([{ "class": "gpu", "count": 1 }]);
        ask["start"] = json!(start);
        ask
    };
    // Made first, asked to bind last: its window starts later.
    let late = w.create(one_gpu("late", T0 + 10 * MIN)).await;
    let mut early = Vec::new();
    for key in ["early-1", "early-2", "early-3"] {
        early.push(w.create(one_gpu(key, T0 + 1000)).await);
    }
    w.advance(T0 + 2000).await;
    w.advance(T0 + 10 * MIN).await;
    let mut expected: Vec<String> = early
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    expected.sort();
    expected.push(late["id"].as_str().unwrap().to_string());

    let (_, all) = w.agent.get("/v1/nodes/n1/bindings").await;
    let all = all["items"].as_array().unwrap();
    assert!(all.iter().all(|b| b["action"] == "bind"), "{all:?}");
    let paged = pages(&w.agent, "/v1/nodes/n1/bindings", 2, "reservationId").await;
    assert_eq!(paged.len(), 2, "two full pages, the last without a cursor");
    let paged: Vec<String> = paged.concat();
    assert_eq!(paged, expected, "oldest request first, then by id");

    // What the node has answered leaves the list; the cursor of a page still continues it.
    let (status, first) = w.agent.get("/v1/nodes/n1/bindings?limit=1").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let cursor = first["cursor"].as_str().unwrap().to_string();
    let oldest = early.iter().find(|r| r["id"] == expected[0]).unwrap();
    let (status, bound) = w.report("n1", oldest, json!({ "status": "bound" })).await;
    assert_eq!(status, StatusCode::OK, "{bound}");
    let (_, rest) = w
        .agent
        .get(&format!("/v1/nodes/n1/bindings?cursor={cursor}"))
        .await;
    let rest: Vec<&str> = rest["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["reservationId"].as_str().unwrap())
        .collect();
    assert_eq!(
        rest,
        expected[1..].iter().map(String::as_str).collect::<Vec<_>>()
    );
    let (_, all) = w.agent.get("/v1/nodes/n1/bindings").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 3, "{all}");

    for bad in ["limit=0", "limit=201", "cursor=not%20an%20id", "page=2"] {
        let (status, err) = w.agent.get(&format!("/v1/nodes/n1/bindings?{bad}")).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    }
    assert_eq!(
        list_params(&w.server, "/v1/nodes/{nodeId}/bindings").await,
        ["nodeId", "limit", "cursor"]
    );
}
