//! The spot market (seeds 001 and 003): the double sell, reclaiming released units, the
//! provider's reclaim, and preemption of spot work by non-spot creates.

use reqwest::StatusCode;
use serde_json::{Value, json};

use reqwest::Method;

use crate::support::{
    Api, Db, Server, T0, assert_error, component, on_both_databases, register_node,
};

/// Creates a reservation of `gpus` GPUs in `pool` for `tenant` as `api` (a request for 4
/// asks for `nvlink-all`: one NVLink domain).
async fn create(api: &Api, pool: &str, tenant: &str, key: &str, gpus: i64, spot: bool) -> Value {
    let mut devices = json!([{ "class": "gpu", "count": gpus }]);
    if gpus == 4 {
        devices[0]["topology"] = json!("nvlink-all");
    }
    let (status, r) = api
        .post(
            "/api/compute/reservations/create",
            json!({ "tenantId": tenant, "poolId": pool, "devices": devices,
                    "duration": "2h", "spot": spot, "idempotencyKey": key }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r
}

async fn get(api: &Api, tenant: &str, r: &Value) -> Value {
    let (status, got) = api
        .post(
            "/api/compute/reservations/get",
            json!({ "tenantId": tenant, "reservationId": r["id"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    got
}

/// The GPUs of `tenant`'s quota in `pool` in use.
async fn gpus_used(server: &Server, pool: &str, tenant: &str) -> i64 {
    let (_, offers) = server
        .admin()
        .get(&format!("/v1/pools/{pool}/offers"))
        .await;
    offers["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["tenantId"] == tenant)
        .and_then(|o| o["used"]["gpu"].as_i64())
        .unwrap_or(0)
}

/// Provider `acme` owns node `n1` (8 H100s in NVLink domains of 4: gpu0-3, gpu4-7) in one
/// pool offered to `anchor` and to `stranger`. Node reservation `nr` gives gpu0-5 to
/// `anchor`, managed by `broker`, and releases gpu0-3 to the spot market.
struct Market {
    server: Server,
    acme: Api,
    broker: Api,
    anchor: Api,
    stranger: Api,
    pool: String,
    nr: String,
}

async fn market(db: Db) -> Market {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    register_node(&acme, "acme", "n1", 8).await;
    let anchor = server.org_with_key("anchor", "member").await;
    let stranger = server.org_with_key("stranger", "member").await;
    let broker = server.org_with_key("broker", "provider").await;
    let admin = server.admin();
    let (status, pool) = admin
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": ["n1"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    for tenant in ["anchor", "stranger"] {
        let (status, offer) = admin
            .post(
                &format!("/v1/pools/{pool}/offers"),
                json!({ "tenantId": tenant, "quota": { "gpu": 8 } }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{offer}");
    }
    let units: Vec<String> = (0..6).map(|g| format!("n1-gpu{g}")).collect();
    let (status, nr) = admin
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": units, "allowedOrgIds": ["anchor"], "managingOrgIds": ["broker"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");
    let nr = nr["id"].as_str().unwrap().to_string();
    let (status, body) = broker
        .post(
            &format!("/v1/nodes/n1/reservations/{nr}/release"),
            json!({ "unitIds": ["n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu3"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    Market {
        server,
        acme,
        broker,
        anchor,
        stranger,
        pool,
        nr,
    }
}

impl Market {
    async fn book(&self, api: &Api, tenant: &str, key: &str, gpus: i64, spot: bool) -> Value {
        create(api, &self.pool, tenant, key, gpus, spot).await
    }

    async fn state_of(&self, api: &Api, tenant: &str, r: &Value) -> Value {
        get(api, tenant, r).await
    }

    async fn gpus_used_by(&self, tenant: &str) -> i64 {
        gpus_used(&self.server, &self.pool, tenant).await
    }

    fn reclaim_path(&self) -> String {
        format!("/v1/nodes/n1/reservations/{}/reclaim", self.nr)
    }

    /// The loaded node: a stranger's non-spot job on the open gpu6-7, a stranger's spot job
    /// on the released gpu0-3, and the audience's non-spot job on gpu4-5.
    async fn load(&self) -> (Value, Value, Value) {
        let open = self
            .book(&self.stranger, "stranger", "open", 2, false)
            .await;
        assert_eq!(open["placement"]["unitIds"], json!(["n1-gpu6", "n1-gpu7"]));
        let spot = self.book(&self.stranger, "stranger", "spot", 4, true).await;
        assert_eq!(
            spot["placement"]["unitIds"],
            json!(["n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu3"])
        );
        let own = self.book(&self.anchor, "anchor", "own", 2, false).await;
        assert_eq!(own["placement"]["unitIds"], json!(["n1-gpu4", "n1-gpu5"]));
        (open, spot, own)
    }
}

on_both_databases!(
    a_strangers_spot_booking_lands_on_released_units_and_non_spot_does_not,
    a_dry_run_reports_what_the_reclaim_then_does_and_changes_nothing,
    reclaim_terminates_only_spot_work_refunds_it_and_audits_the_reason,
    reclaim_is_for_the_owner_and_managers_of_an_active_reservation,
    the_provider_reclaims_spot_work_on_its_whole_node_but_never_non_spot,
    a_managing_org_reaches_only_released_units_of_reservations_it_manages_in_term,
    a_non_spot_create_preempts_the_newest_spot_work_with_the_default_preemptor,
    a_custom_preemptor_plugin_chooses_the_victims,
    a_preemptor_that_fails_or_names_what_it_was_not_offered_terminates_nothing,
    a_preemptor_that_terminates_nothing_leaves_the_create_waiting,
    spot_requests_never_preempt_and_non_spot_work_is_never_preempted,
    sixteen_concurrent_non_spot_creates_preempt_each_spot_booking_once,
    what_a_preemption_frees_beyond_its_need_goes_to_waiting_reservations_at_once,
    a_waiting_reservation_tried_again_preempts_spot_work_booked_after_it,
    a_reclaim_hands_the_units_it_frees_to_waiting_reservations_at_once,
);

async fn a_strangers_spot_booking_lands_on_released_units_and_non_spot_does_not(db: Db) {
    let m = market(db).await;
    let open = m.book(&m.stranger, "stranger", "open", 2, false).await;
    assert_eq!(open["placement"]["unitIds"], json!(["n1-gpu6", "n1-gpu7"]));
    let refused = m.book(&m.stranger, "stranger", "more", 1, false).await;
    assert_eq!(
        refused["state"], "pending",
        "a stranger's non-spot request never lands on released units: {refused}"
    );
    let spot = m.book(&m.stranger, "stranger", "spot", 4, true).await;
    assert_eq!(spot["state"], "placed", "{spot}");
    assert_eq!(
        spot["placement"]["unitIds"],
        json!(["n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu3"])
    );
    let spot_on_reserved = m.book(&m.stranger, "stranger", "spot-2", 1, true).await;
    assert_eq!(
        spot_on_reserved["state"], "pending",
        "units reserved and not released are the audience's alone, even for spot"
    );
}

async fn a_dry_run_reports_what_the_reclaim_then_does_and_changes_nothing(db: Db) {
    let m = market(db).await;
    let (_, spot, own) = m.load().await;
    let units = json!([
        "n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu3", "n1-gpu4", "n1-gpu5"
    ]);
    let audit_before = crate::support::audit_count(&m.server).await;

    let (status, dry) = m
        .broker
        .post(
            &m.reclaim_path(),
            json!({ "unitIds": units, "dryRun": true }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(dry["wouldTerminate"], json!([spot["id"]]));
    assert_eq!(dry["wouldSkip"], json!([own["id"]]));
    assert!(dry.get("terminated").is_none(), "{dry}");
    assert_eq!(dry["releasedUnitIds"].as_array().unwrap().len(), 4);
    assert_eq!(
        m.state_of(&m.stranger, "stranger", &spot).await["state"],
        "placed"
    );
    assert_eq!(crate::support::audit_count(&m.server).await, audit_before);

    let (status, real) = m
        .broker
        .post(
            &m.reclaim_path(),
            json!({ "unitIds": units, "reason": "anchor needs them" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{real}");
    assert_eq!(real["terminated"], dry["wouldTerminate"]);
    assert_eq!(real["skipped"], dry["wouldSkip"]);
    assert_eq!(real["releasedUnitIds"], json!([]));
    assert!(real.get("wouldTerminate").is_none(), "{real}");
}

async fn reclaim_terminates_only_spot_work_refunds_it_and_audits_the_reason(db: Db) {
    let m = market(db).await;
    let (open, spot, own) = m.load().await;
    assert_eq!(m.gpus_used_by("stranger").await, 6);

    let (status, body) = m
        .acme
        .post(
            &m.reclaim_path(),
            json!({ "unitIds": ["n1-gpu2", "n1-gpu4"], "reason": "maintenance" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["terminated"], json!([spot["id"]]));
    assert_eq!(body["skipped"], json!([own["id"]]));
    assert_eq!(
        body["releasedUnitIds"],
        json!(["n1-gpu0", "n1-gpu1", "n1-gpu3"]),
        "only the named units return to exclusive use"
    );

    let ended = m.state_of(&m.stranger, "stranger", &spot).await;
    assert_eq!(ended["state"], "released", "{ended}");
    assert_eq!(ended["reason"], "capacity-reclaim");
    assert_eq!(
        m.gpus_used_by("stranger").await,
        2,
        "the spot quota is refunded"
    );
    for (api, tenant, r) in [
        (&m.stranger, "stranger", &open),
        (&m.anchor, "anchor", &own),
    ] {
        assert_eq!(m.state_of(api, tenant, r).await["state"], "placed");
    }

    let (_, audit) = m.server.admin().get("/v1/audit?limit=200").await;
    let termination = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "compute-reservation.terminate")
        .unwrap_or_else(|| panic!("no termination audited: {audit}"));
    assert_eq!(termination["objectId"], spot["id"]);
    assert_eq!(termination["reason"], "maintenance");
    assert_eq!(termination["details"]["reason"], "capacity-reclaim");

    let (_, events) = m.stranger.get("/v1/events?limit=200").await;
    let event = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "reservation.released" && e["objectId"] == spot["id"])
        .unwrap_or_else(|| panic!("no release event for the tenant: {events}"));
    assert_eq!(event["payload"]["reason"], "capacity-reclaim");

    let again = m.book(&m.stranger, "stranger", "spot-again", 1, true).await;
    assert_eq!(
        again["placement"]["unitIds"],
        json!(["n1-gpu0"]),
        "the units still released take spot work again; the reclaimed one does not"
    );
}

async fn reclaim_is_for_the_owner_and_managers_of_an_active_reservation(db: Db) {
    let m = market(db).await;
    let body = json!({ "unitIds": ["n1-gpu0"], "dryRun": true });
    let (status, error) = m.stranger.post(&m.reclaim_path(), body.clone()).await;
    assert_error(status, &error, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, error) = m.anchor.post(&m.reclaim_path(), body.clone()).await;
    assert_error(status, &error, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, error) = m
        .broker
        .post(&m.reclaim_path(), json!({ "unitIds": ["n1-gpu7"] }))
        .await;
    assert_error(status, &error, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, error) = m
        .broker
        .post(&m.reclaim_path(), json!({ "unitIds": [] }))
        .await;
    assert_error(status, &error, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, error) = m
        .broker
        .post(
            &m.reclaim_path(),
            json!({ "unitIds": ["n1-gpu0"], "dryRun": "yes" }),
        )
        .await;
    assert_error(status, &error, StatusCode::BAD_REQUEST, "INVALID_INPUT");

    let (status, _) = m
        .server
        .admin()
        .post(
            &format!("/v1/nodes/n1/reservations/{}/end", m.nr),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, error) = m.broker.post(&m.reclaim_path(), body.clone()).await;
    assert_error(status, &error, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, error) = m.acme.post(&m.reclaim_path(), body).await;
    assert_error(status, &error, StatusCode::CONFLICT, "INVALID_STATE");
}

async fn the_provider_reclaims_spot_work_on_its_whole_node_but_never_non_spot(db: Db) {
    let m = market(db).await;
    let (open, spot, own) = m.load().await;
    let path = "/v1/orgs/acme/provider/nodes/n1/reclaim-spot";

    let (status, dry) = m.acme.post(path, json!({ "dryRun": true })).await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(dry["terminated"], json!([spot["id"]]));
    let mut skipped = vec![open["id"].clone(), own["id"].clone()];
    skipped.sort_by_key(|v| v.as_str().unwrap().to_string());
    assert_eq!(dry["skipped"], json!(skipped));
    assert_eq!(
        m.state_of(&m.stranger, "stranger", &spot).await["state"],
        "placed"
    );

    let (status, error) = m.acme.post(path, json!({ "unitIds": ["n1-gpu9"] })).await;
    assert_error(status, &error, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, error) = m
        .stranger
        .post(
            "/v1/orgs/stranger/provider/nodes/n1/reclaim-spot",
            json!({}),
        )
        .await;
    assert_error(status, &error, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, error) = m.stranger.post(path, json!({})).await;
    assert_error(status, &error, StatusCode::NOT_FOUND, "NOT_FOUND");

    let (status, body) = m.acme.post(path, json!({ "reason": "drain" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["terminated"], dry["terminated"]);
    assert_eq!(body["skipped"], dry["skipped"]);
    let ended = m.state_of(&m.stranger, "stranger", &spot).await;
    assert_eq!(
        (&ended["state"], &ended["reason"]),
        (&json!("released"), &json!("capacity-reclaim"))
    );
    for (api, tenant, r) in [
        (&m.stranger, "stranger", &open),
        (&m.anchor, "anchor", &own),
    ] {
        assert_eq!(m.state_of(api, tenant, r).await["state"], "placed");
    }
    let (status, nr) = m
        .acme
        .get(&format!("/v1/nodes/n1/reservations/{}", m.nr))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        nr["releasedUnitIds"].as_array().unwrap().len(),
        4,
        "a provider reclaim terminates work; the units stay released"
    );
}

async fn a_managing_org_reaches_only_released_units_of_reservations_it_manages_in_term(db: Db) {
    let m = market(db).await;
    let (_, spot, _) = m.load().await;
    let path = "/v1/orgs/broker/provider/nodes/n1/reclaim-spot";

    let (status, dry) = m.broker.post(path, json!({ "dryRun": true })).await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(
        (&dry["terminated"], &dry["skipped"]),
        (&json!([spot["id"]]), &json!([])),
        "a manager sees only the work on released units"
    );
    for unit in ["n1-gpu4", "n1-gpu6"] {
        let (status, error) = m.broker.post(path, json!({ "unitIds": [unit] })).await;
        assert_error(status, &error, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    }
    let (status, error) = m
        .broker
        .post("/v1/orgs/acme/provider/nodes/n1/reclaim-spot", json!({}))
        .await;
    assert_error(status, &error, StatusCode::NOT_FOUND, "NOT_FOUND");

    let (status, _) = m
        .server
        .admin()
        .post(
            &format!("/v1/nodes/n1/reservations/{}/end", m.nr),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, error) = m.broker.post(path, json!({ "dryRun": true })).await;
    assert_error(status, &error, StatusCode::NOT_FOUND, "NOT_FOUND");
    assert_eq!(
        m.state_of(&m.stranger, "stranger", &spot).await["state"],
        "placed"
    );
}

/// Provider `acme` with `nodes` nodes of 8 H100s in one pool, offered to `spotter` (who
/// buys spot) and `buyer` (who does not), 16 GPUs of quota each.
struct Contest {
    server: Server,
    acme: Api,
    spotter: Api,
    buyer: Api,
    pool: String,
}

async fn contest(db: Db, nodes: usize) -> Contest {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    let node_ids: Vec<String> = (1..=nodes).map(|n| format!("n{n}")).collect();
    for node in &node_ids {
        register_node(&acme, "acme", node, 8).await;
    }
    let spotter = server.org_with_key("spotter", "member").await;
    let buyer = server.org_with_key("buyer", "member").await;
    let admin = server.admin();
    let (status, pool) = admin
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": node_ids }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    for tenant in ["spotter", "buyer"] {
        let (status, offer) = admin
            .post(
                &format!("/v1/pools/{pool}/offers"),
                json!({ "tenantId": tenant, "quota": { "gpu": 16 } }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{offer}");
    }
    Contest {
        server,
        acme,
        spotter,
        buyer,
        pool,
    }
}

impl Contest {
    fn api(&self, tenant: &str) -> &Api {
        if tenant == "spotter" {
            &self.spotter
        } else {
            &self.buyer
        }
    }

    async fn create(&self, tenant: &str, key: &str, gpus: i64, spot: bool) -> Value {
        create(self.api(tenant), &self.pool, tenant, key, gpus, spot).await
    }

    async fn get(&self, tenant: &str, r: &Value) -> Value {
        get(self.api(tenant), tenant, r).await
    }

    async fn used(&self, tenant: &str) -> i64 {
        gpus_used(&self.server, &self.pool, tenant).await
    }

    /// Uploads the test component `file` (a preemptor) and has the pool's preemption
    /// decided by it, with `onPolicyFailure` as `on_failure`. Answers the plugin.
    async fn preempt_with(&self, file: &str, on_failure: &str) -> Value {
        let admin = self.server.admin();
        let (status, plugin) = admin
            .raw(
                Method::POST,
                &format!("/v1/plugins?name={}&version=1.0.0", file.replace('_', "-")),
                Some(std::fs::read(component(&format!("{file}.wasm"))).unwrap()),
                Some("application/wasm"),
            )
            .await;
        assert!(status.is_success(), "{plugin}");
        assert_eq!(plugin["world"], "preemptor");
        let (status, body) = admin
            .put(
                &format!("/v1/pools/{}/policies", self.pool),
                json!({ "preemption": plugin["id"], "onPolicyFailure": on_failure }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        plugin
    }

    /// A non-spot create of 4 GPUs (one NVLink domain) by `buyer` for `duration`.
    async fn buy(&self, key: &str, duration: &str) -> (StatusCode, Value) {
        let body = json!({ "tenantId": "buyer", "poolId": self.pool, "devices": [{ "class": "gpu", "count": 4, "topology": "nvlink-all" }],
                           "duration": duration, "spot": false, "idempotencyKey": key });
        self.buyer
            .post("/api/compute/reservations/create", body)
            .await
    }

    /// `spotter`'s reservations `jobs` as they are now.
    async fn spot_now(&self, [a, b]: [&Value; 2]) -> [Value; 2] {
        [self.get("spotter", a).await, self.get("spotter", b).await]
    }

    /// How many of the preemptor's decisions `/metrics` counts under `outcome`.
    async fn preemptor_decided(&self, outcome: &str) -> Option<f64> {
        let labels = [("world", "preemptor"), ("outcome", outcome)];
        let metrics = self.server.metrics().await;
        metrics.sum("orl_policy_decisions_total", &labels)
    }

    /// The audit entries of preemptions, oldest first.
    async fn preemptions(&self) -> Vec<Value> {
        let (_, audit) = self.server.admin().get("/v1/audit?limit=200").await;
        let mut entries: Vec<Value> = audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["action"] == "compute-reservation.preempt")
            .cloned()
            .collect();
        entries.reverse();
        entries
    }

    /// Two spot reservations of 4 GPUs filling node n1: `older` at T0, `newer` ten
    /// minutes later (the clock is left there).
    async fn two_spot_jobs(&self) -> (Value, Value) {
        let older = self.create("spotter", "older", 4, true).await;
        self.server.set_clock(T0 + 600_000).await;
        let newer = self.create("spotter", "newer", 4, true).await;
        assert_eq!(
            (&older["state"], &newer["state"]),
            (&json!("placed"), &json!("placed"))
        );
        (older, newer)
    }
}

async fn a_non_spot_create_preempts_the_newest_spot_work_with_the_default_preemptor(db: Db) {
    let c = contest(db, 1).await;
    let (older, newer) = c.two_spot_jobs().await;
    let body = json!({ "tenantId": "buyer", "poolId": c.pool, "devices": [{ "class": "gpu", "count": 4, "topology": "nvlink-all" }],
                       "duration": "2h", "spot": false, "idempotencyKey": "job" });
    let (status, plan) = c.buyer.post("/api/compute/reservations/plan", body).await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    assert_eq!(plan["outcome"], "placed", "{plan}");
    assert_eq!(
        plan["placement"]["preempts"],
        json!([newer["id"]]),
        "the plan names the victim"
    );

    let r = c.create("buyer", "job", 4, false).await;

    assert_eq!(r["state"], "placed", "{r}");
    assert_eq!(r["placement"]["unitIds"], newer["placement"]["unitIds"]);
    let victim = c.get("spotter", &newer).await;
    assert_eq!(
        (&victim["state"], &victim["reason"]),
        (&json!("released"), &json!("preempted"))
    );
    assert_eq!(
        c.get("spotter", &older).await["state"],
        "active",
        "the older work, running since T0, costs more and keeps running"
    );
    assert_eq!(c.used("spotter").await, 4, "the victim's quota is refunded");
    let preemptions = c.preemptions().await;
    assert_eq!(preemptions.len(), 1, "{preemptions:?}");
    assert_eq!(preemptions[0]["objectId"], newer["id"]);
    assert_eq!(preemptions[0]["details"]["preemptedFor"], r["id"]);
    assert!(
        preemptions[0]["details"]["decidedBy"]
            .as_str()
            .is_some_and(|p| p.starts_with("sha256:")),
        "{preemptions:?}"
    );
    // The preemptor decided twice (the plan, the create), each time on a victim.
    assert_eq!(c.preemptor_decided("preempted").await, Some(2.0));
    assert_eq!(c.preemptor_decided("nothing").await, None);
}

async fn a_custom_preemptor_plugin_chooses_the_victims(db: Db) {
    let c = contest(db, 1).await;
    let plugin = c.preempt_with("preempt_oldest", "fail").await;
    let (older, newer) = c.two_spot_jobs().await;

    let r = c.create("buyer", "job", 4, false).await;

    assert_eq!(r["state"], "placed", "{r}");
    assert_eq!(r["placement"]["unitIds"], older["placement"]["unitIds"]);
    assert_eq!(c.get("spotter", &older).await["reason"], "preempted");
    assert_eq!(c.get("spotter", &newer).await["state"], "placed");
    assert_eq!(
        c.preemptions().await[0]["details"]["decidedBy"],
        plugin["id"]
    );
}

/// A preemptor that fails (a trap), or answers spot work it was not offered (an id past
/// the last, or one twice), fails the create with `POLICY_FAILED` and terminates nothing;
/// with `onPolicyFailure: fallback` the built-in preemptor chooses instead.
async fn a_preemptor_that_fails_or_names_what_it_was_not_offered_terminates_nothing(db: Db) {
    let c = contest(db, 1).await;
    let (older, newer) = c.two_spot_jobs().await;
    let before = c.spot_now([&older, &newer]).await;
    let plugin = c.preempt_with("preempt_hostile", "fail").await;
    for (duration, kind) in [
        ("1h", "trap"),
        ("2h", "invalid-answer"),
        ("3h", "invalid-answer"),
    ] {
        let (status, err) = c.buy(&format!("job-{duration}"), duration).await;
        assert_error(status, &err, StatusCode::BAD_GATEWAY, "POLICY_FAILED");
        assert_eq!(err["error"]["details"]["kind"], kind, "{duration}: {err}");
        assert_eq!(err["error"]["details"]["pluginId"], plugin["id"], "{err}");
    }
    let after = c.spot_now([&older, &newer]).await;
    assert_eq!(after, before, "the spot work is left as it was");
    assert!(c.preemptions().await.is_empty());
    assert_eq!(c.used("buyer").await, 0);

    c.preempt_with("preempt_hostile", "fallback").await;
    let (status, r) = c.buy("job-fallback", "1h").await;
    assert_eq!(
        (status, &r["state"]),
        (StatusCode::OK, &json!("placed")),
        "{r}"
    );
    assert_eq!(r["placement"]["unitIds"], newer["placement"]["unitIds"]);
    assert_eq!(c.get("spotter", &newer).await["reason"], "preempted");
    assert_eq!(c.get("spotter", &older).await, before[0]);
}

/// A preemptor that answers nothing to terminate, where only terminating spot work would
/// make room, leaves the create waiting, and is counted as deciding `nothing`.
async fn a_preemptor_that_terminates_nothing_leaves_the_create_waiting(db: Db) {
    let c = contest(db, 1).await;
    let (older, newer) = c.two_spot_jobs().await;
    let before = c.spot_now([&older, &newer]).await;
    c.preempt_with("preempt_hostile", "fail").await;
    let (status, r) = c.buy("job", "4h").await;
    assert_eq!(
        (status, &r["state"]),
        (StatusCode::OK, &json!("pending")),
        "{r}"
    );
    let after = c.spot_now([&older, &newer]).await;
    assert_eq!(after, before, "the spot work is left as it was");
    assert_eq!(c.preemptor_decided("nothing").await, Some(1.0));
    assert_eq!(c.preemptor_decided("preempted").await, None);
}

async fn spot_requests_never_preempt_and_non_spot_work_is_never_preempted(db: Db) {
    let c = contest(db, 1).await;
    let spot = c.create("spotter", "spot", 4, true).await;
    let steady = c.create("buyer", "steady", 4, false).await;
    assert_eq!(steady["state"], "placed");

    let more_spot = c.create("spotter", "more-spot", 2, true).await;
    assert_eq!(more_spot["state"], "pending", "spot never preempts spot");
    let too_big = c.create("buyer", "too-big", 6, false).await;
    assert_eq!(
        too_big["state"], "pending",
        "only the spot half can give way, which is not enough: nothing is terminated"
    );
    assert_eq!(c.get("spotter", &spot).await["state"], "placed");
    assert!(c.preemptions().await.is_empty());
    assert_eq!(c.used("spotter").await, 4 + 2);
}

async fn a_reclaim_hands_the_units_it_frees_to_waiting_reservations_at_once(db: Db) {
    let c = contest(db, 1).await;
    let (older, newer) = c.two_spot_jobs().await;
    let waiting = c.create("buyer", "waiting", 4, true).await;
    assert_eq!(waiting["state"], "pending", "spot never preempts spot");

    let (status, body) = c
        .acme
        .post("/v1/orgs/acme/provider/nodes/n1/reclaim-spot", json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut terminated = vec![older["id"].clone(), newer["id"].clone()];
    terminated.sort_by_key(|v| v.as_str().unwrap().to_string());
    let mut answered = body["terminated"].as_array().unwrap().clone();
    answered.sort_by_key(|v| v.as_str().unwrap().to_string());
    assert_eq!(answered, terminated);
    // No clock step: the reconciler's 30-second retry has not come.
    assert_eq!(
        c.get("buyer", &waiting).await["state"],
        "placed",
        "the waiting reservation is placed as the reclaim commits"
    );
}

async fn what_a_preemption_frees_beyond_its_need_goes_to_waiting_reservations_at_once(db: Db) {
    let c = contest(db, 1).await;
    let six = c.create("spotter", "six", 6, true).await;
    assert_eq!(six["state"], "placed", "{six}");
    let waiting = c.create("spotter", "waiting", 4, true).await;
    assert_eq!(waiting["state"], "pending", "two GPUs are left: {waiting}");
    let buyer = c.create("buyer", "buyer", 4, false).await;
    assert_eq!(buyer["state"], "placed", "{buyer}");
    assert_eq!(c.get("spotter", &six).await["reason"], "preempted");
    // No clock step: the reconciler's 30-second retry has not come.
    let waiting = c.get("spotter", &waiting).await;
    assert_eq!(
        waiting["state"], "placed",
        "the NVLink domain the buyer left goes to the waiting reservation: {waiting}"
    );
    assert_eq!(c.used("spotter").await, 4);
}

async fn a_waiting_reservation_tried_again_preempts_spot_work_booked_after_it(db: Db) {
    let c = contest(db, 1).await;
    let steady = c.create("buyer", "steady", 4, false).await;
    let big = c.create("buyer", "big", 8, false).await;
    assert_eq!(
        big["state"], "pending",
        "no spot work to give way yet: {big}"
    );
    let spot = c.create("spotter", "spot", 4, true).await;
    assert_eq!(spot["state"], "placed", "{spot}");
    let (status, released) = c
        .buyer
        .post(
            "/api/compute/reservations/release",
            json!({ "tenantId": "buyer", "reservationId": steady["id"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    c.server.set_clock(T0 + 30_000).await;
    let big = c.get("buyer", &big).await;
    assert_eq!(
        big["state"], "placed",
        "tried again, the spot work gives way: {big}"
    );
    let victim = c.get("spotter", &spot).await;
    assert_eq!(
        (&victim["state"], &victim["reason"]),
        (&json!("released"), &json!("preempted"))
    );
    assert_eq!(c.preemptions().await.len(), 1);
}

async fn sixteen_concurrent_non_spot_creates_preempt_each_spot_booking_once(db: Db) {
    let c = contest(db, 2).await;
    let mut spot = Vec::new();
    for i in 0..16 {
        let r = c.create("spotter", &format!("spot-{i}"), 1, true).await;
        assert_eq!(r["state"], "placed");
        spot.push(r);
    }

    let creates = (0..16).map(|i| {
        let buyer = c.buyer.clone();
        let body = json!({ "tenantId": "buyer", "poolId": c.pool,
                           "devices": [{ "class": "gpu", "count": 1 }],
                           "duration": "2h", "idempotencyKey": format!("job-{i}") });
        tokio::spawn(async move { buyer.post("/api/compute/reservations/create", body).await })
    });
    let placed: Vec<Value> = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(|answer| {
            let (status, r) = answer.unwrap();
            assert_eq!(status, StatusCode::OK, "{r}");
            r
        })
        .collect();

    let mut units: Vec<String> = placed
        .iter()
        .map(|r| {
            assert_eq!(r["state"], "placed", "{r}");
            format!("{}", r["placement"]["unitIds"][0])
        })
        .collect();
    units.sort();
    units.dedup();
    assert_eq!(units.len(), 16, "no unit is booked twice");
    for r in &spot {
        let victim = c.get("spotter", r).await;
        assert_eq!(
            (&victim["state"], &victim["reason"]),
            (&json!("released"), &json!("preempted"))
        );
    }
    assert_eq!(
        c.preemptions().await.len(),
        16,
        "each spot booking is preempted once"
    );
    assert_eq!((c.used("spotter").await, c.used("buyer").await), (0, 16));
}
