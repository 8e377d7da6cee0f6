//! When can I get it, and what would happen: the availability search
//! (`POST /api/compute/reservations/availability`, GraphQL `availability`,
//! `orl compute reservations availability`) and the dry-run plan
//! (`POST /api/compute/reservations/plan`), neither of which writes anything.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{
    Api, Db, HOUR, Server, T0, assert_error, audit_count, h100_inventory, on_both_databases,
};

/// Provider `acme` with `nodes` nodes of 8 H100s (`n1`…, each labelled `node: <id>` so a
/// booking can name its node) in one pool offered to `tenant-a` with a quota of 32 GPUs
/// (`gpu_quota` for [`world_with`]);
/// `tenant` is a member key of tenant-a.
struct World {
    server: Server,
    tenant: Api,
    pool: String,
}

async fn world(db: Db, nodes: usize) -> World {
    world_with(db, nodes, json!({}), 32).await
}

async fn world_with(db: Db, nodes: usize, policy: Value, gpu_quota: i64) -> World {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let node_ids: Vec<String> = (1..=nodes).map(|n| format!("n{n}")).collect();
    for node in &node_ids {
        let mut inventory = h100_inventory(node, 8);
        inventory["labels"] = json!({ "node": node });
        let (status, body) = provider
            .put(&format!("/v1/orgs/acme/provider/nodes/{node}"), inventory)
            .await;
        assert!(status.is_success(), "{status} {body}");
    }
    let tenant = server.org_with_key("tenant-a", "member").await;
    let (status, pool) = server
        .admin()
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": node_ids, "policy": policy }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    let (status, offer) = server
        .admin()
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": gpu_quota } }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
    World {
        server,
        tenant,
        pool,
    }
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl World {
    /// Books all 8 GPUs of `node` from `start` for `hours`; answers the reservation.
    async fn book_node(&self, node: &str, start: i64, hours: i64) -> Value {
        let devices =
            json!([{ "class": "gpu", "count": 8, "selector": { "labels": { "node": node } } }]);
        let key = format!("busy-{node}-{start}");
        let body = json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": devices,
                           "start": start, "duration": hours * 3600, "idempotencyKey": key });
        let (status, r) = self
            .tenant
            .post("/api/compute/reservations/create", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r["state"], "placed", "{r}");
        r
    }

    /// An availability request for `gpus` (in one NVLink domain up to 4) over `[from, to)`.
    fn ask(&self, gpus: i64, hours: i64, from: i64, to: i64) -> Value {
        let topology = if gpus <= 4 { "nvlink-all" } else { "any" };
        json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": [{ "class": "gpu", "count": gpus, "topology": topology }],
                "duration": format!("{hours}h"), "window": { "from": from, "to": to } })
    }

    async fn search(&self, body: Value) -> (StatusCode, Value) {
        self.tenant
            .post("/api/compute/reservations/availability", body)
            .await
    }
}

on_both_databases!(
    a_search_answers_each_nodes_earliest_start_and_a_create_at_that_start_is_placed_there,
    a_search_passes_over_units_reserved_to_another_org_and_counts_quota,
    a_search_checks_its_input_and_its_caller_and_writes_nothing,
    graphql_availability_and_plan_answer_what_the_rpcs_answer,
    a_plan_answers_what_the_create_after_it_does_and_writes_nothing,
    a_plan_reports_the_iam_decision_and_the_quota_that_refuse_a_create,
    a_plan_by_a_key_that_may_not_create_for_the_tenant_finds_no_pool,
    operators_find_nodes_with_units_free_of_bookings_and_claims_over_a_term,
    a_plan_waits_behind_the_queue_as_the_create_does_in_a_pool_lease_pool_only,
    every_slot_found_over_a_random_booking_history_is_booked_at_its_start_and_not_before,
);

async fn a_search_answers_each_nodes_earliest_start_and_a_create_at_that_start_is_placed_there(
    db: Db,
) {
    let w = world(db, 3).await;
    w.book_node("n1", T0, 2).await;
    w.book_node("n2", T0, 5).await;
    w.book_node("n3", T0 + 3 * HOUR, 10).await;
    let (status, found) = w.search(w.ask(8, 2, T0, T0 + 24 * HOUR)).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let slots: Vec<(i64, i64, String)> = found["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["start"].as_i64().unwrap() - T0,
                s["latestStart"].as_i64().unwrap() - T0,
                s["members"][0]["nodeId"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // n3 is free until its booking at 3 h: two hours fit there from now to 1 h.
    assert_eq!(
        slots,
        vec![
            (0, HOUR, "n3".to_string()),
            (2 * HOUR, 22 * HOUR, "n1".to_string()),
            (5 * HOUR, 22 * HOUR, "n2".to_string()),
        ]
    );
    assert_eq!(found["searchedUntil"], T0 + 22 * HOUR);
    assert_eq!(found["slots"][0]["end"], T0 + 2 * HOUR);
    let (status, limited) = w
        .search({
            let mut ask = w.ask(8, 2, T0, T0 + 24 * HOUR);
            ask["limit"] = json!(1);
            ask
        })
        .await;
    assert_eq!(status, StatusCode::OK, "{limited}");
    assert_eq!(limited["slots"].as_array().unwrap().len(), 1);
    assert_eq!(limited["searchedUntil"], T0 + 2 * HOUR, "{limited}");
    // Booked at the slot's start, the request gets the slot's node and units.
    let slot = &found["slots"][0];
    let body = json!({ "tenantId": "tenant-a", "poolId": w.pool, "devices": [{ "class": "gpu", "count": 8 }],
                       "start": slot["start"], "duration": "2h", "idempotencyKey": "at-slot" });
    let (status, placed) = w
        .tenant
        .post("/api/compute/reservations/create", body)
        .await;
    assert_eq!(status, StatusCode::OK, "{placed}");
    assert_eq!(placed["state"], "placed", "{placed}");
    assert_eq!(placed["placement"]["nodeId"], slot["members"][0]["nodeId"]);
    assert_eq!(
        sorted_units(&placed["placement"]["unitIds"]),
        sorted_units(&slot["members"][0]["unitIds"])
    );
    // Four GPUs in one NVLink domain for an hour: n1 and n3 from 2 h, n2 from 5 h.
    let (_, half) = w.search(w.ask(4, 1, T0, T0 + 24 * HOUR)).await;
    let starts: Vec<i64> = half["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["start"].as_i64().unwrap() - T0)
        .collect();
    assert_eq!(starts, vec![2 * HOUR, 2 * HOUR, 5 * HOUR], "{half}");
}

async fn a_search_passes_over_units_reserved_to_another_org_and_counts_quota(db: Db) {
    let w = world(db, 2).await;
    w.server.org_with_key("anchor", "member").await;
    let units: Vec<String> = (0..8).map(|g| format!("n1-gpu{g}")).collect();
    let (status, nr) = w
        .server
        .admin()
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": units, "allowedOrgIds": ["anchor"], "endsAt": rfc3339(T0 + 6 * HOUR) }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");
    w.book_node("n2", T0, 3).await;
    let (status, found) = w.search(w.ask(8, 1, T0, T0 + 24 * HOUR)).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    let slots: Vec<(i64, &str)> = found["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["start"].as_i64().unwrap() - T0,
                s["members"][0]["nodeId"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(slots, vec![(3 * HOUR, "n2"), (6 * HOUR, "n1")], "{found}");
    assert_eq!(
        found["quota"],
        json!({ "admits": true, "resources": [{ "resource": "gpu", "requested": 8, "limit": 32, "used": 8 }] })
    );
    assert!(found.get("budget").is_none(), "{found}");
    // Units the reservation released to the spot market are open to spot requests only.
    let release = format!(
        "/v1/nodes/n1/reservations/{}/release",
        nr["id"].as_str().unwrap()
    );
    let (status, released) = w
        .server
        .admin()
        .post(
            &release,
            json!({ "unitIds": ["n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu3"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    let mut spot = w.ask(4, 1, T0, T0 + 24 * HOUR);
    spot["spot"] = json!(true);
    let (_, spot) = w.search(spot).await;
    assert_eq!(spot["slots"][0]["start"], T0, "{spot}");
    assert_eq!(spot["slots"][0]["members"][0]["nodeId"], "n1", "{spot}");
    let (_, steady) = w.search(w.ask(4, 1, T0, T0 + 24 * HOUR)).await;
    assert_eq!(steady["slots"][0]["start"], T0 + 3 * HOUR, "{steady}");
    assert_eq!(steady["slots"][0]["members"][0]["nodeId"], "n2", "{steady}");
    let mut gang = w.ask(8, 1, T0, T0 + 24 * HOUR);
    gang["gang"] = json!({ "size": 4 });
    let (status, too_many) = w.search(gang).await;
    assert_eq!(status, StatusCode::OK, "{too_many}");
    assert_eq!(
        too_many["quota"]["admits"], false,
        "32 more GPUs do not fit in 24 left"
    );
    assert_eq!(
        too_many["slots"],
        json!([]),
        "two nodes cannot hold four members"
    );
    let mut pair = w.ask(8, 1, T0, T0 + 24 * HOUR);
    pair["gang"] = json!({ "size": 2 });
    let (_, pair) = w.search(pair).await;
    let members: Vec<&str> = pair["slots"][0]["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["nodeId"].as_str().unwrap())
        .collect();
    assert_eq!(pair["slots"][0]["start"], T0 + 6 * HOUR, "{pair}");
    assert_eq!(members.len(), 2, "{pair}");
}

async fn a_search_checks_its_input_and_its_caller_and_writes_nothing(db: Db) {
    let w = world(db, 1).await;
    let stranger = w.server.org_with_key("stranger", "member").await;
    let audited = audit_count(&w.server).await;
    let day = T0 + 24 * HOUR;
    let cases: Vec<(Value, &str)> = vec![
        (json!({ "window": { "from": day, "to": T0 } }), "window.to"),
        (
            json!({ "window": { "from": T0, "to": T0 + HOUR } }),
            "window.to",
        ),
        (
            json!({ "window": { "from": T0, "to": T0 + 400 * 24 * HOUR } }),
            "window.to",
        ),
        (
            json!({ "window": { "from": -1, "to": day } }),
            "window.from",
        ),
        (json!({ "limit": 0 }), "limit"),
        (json!({ "limit": 51 }), "limit"),
        (json!({ "duration": "soon" }), "duration"),
        (json!({ "devices": [] }), "devices"),
        (json!({ "tenantId": "bad tenant" }), "tenantId"),
    ];
    for (patch, field) in cases {
        let mut body = w.ask(8, 2, T0, day);
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, err) = w.search(body.clone()).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(err["error"]["details"]["field"], field, "{body} → {err}");
    }
    let mut unknown = w.ask(8, 2, T0, day);
    unknown["idempotencyKey"] = json!("k-1");
    let (status, err) = w.search(unknown).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let mut binding = w.ask(8, 2, T0, day);
    binding["binding"] = json!("vm");
    let (status, err) = w.search(binding).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "UNSUPPORTED");
    let mut theirs = w.ask(8, 2, T0, day);
    theirs["tenantId"] = json!("stranger");
    let (status, err) = stranger
        .post("/api/compute/reservations/availability", theirs)
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = stranger
        .post(
            "/api/compute/reservations/availability",
            w.ask(8, 2, T0, day),
        )
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    // A window wholly in the past has no slots.
    let (status, past) = w.search(w.ask(8, 1, T0 - 48 * HOUR, T0 - 24 * HOUR)).await;
    assert_eq!(status, StatusCode::OK, "{past}");
    assert_eq!(past["slots"], json!([]));
    let (status, found) = w.search(w.ask(8, 2, T0, day)).await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(found["slots"][0]["start"], T0, "starts from now");
    assert_eq!(
        audit_count(&w.server).await,
        audited,
        "a search writes nothing"
    );
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM compute_reservations")
        .fetch_one(&mut w.server.database().await)
        .await
        .unwrap();
    assert_eq!(rows, 0, "no draft is left");
}

async fn graphql_availability_and_plan_answer_what_the_rpcs_answer(db: Db) {
    let w = world(db, 2).await;
    w.book_node("n1", T0, 4).await;
    let ask = w.ask(8, 2, T0, T0 + 48 * HOUR);
    let (_, rest) = w.search(ask.clone()).await;
    let query = "query($input: JSON!) { availability(input: $input) {
        slots { start end latestStart members { nodeId unitIds } }
        searchedUntil quota { admits resources { resource requested limit used } } budget { admits } } }";
    let (status, body) = w
        .tenant
        .post(
            "/graphql",
            json!({ "query": query, "variables": { "input": ask } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    let mut expected = rest.clone();
    expected["budget"] = Value::Null;
    assert_eq!(body["data"]["availability"], expected);
    let request = w.request("k-graphql", 8);
    let rest = w.plan(request.clone()).await;
    let query = "query($input: JSON!) { plan(input: $input) {
        reservationId outcome iam quota { admits resources { resource requested limit used } }
        placement { state members { nodeId unitIds } placedBy preempts } } }";
    let (status, body) = w
        .tenant
        .post(
            "/graphql",
            json!({ "query": query, "variables": { "input": request } }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(body["data"]["plan"], rest, "GraphQL's plan is the RPC's");
    assert_eq!(rest["placement"]["members"][0]["nodeId"], "n2", "{rest}");
}

/// Counts every reservation row, drafts included.
async fn reservation_rows(server: &Server) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM compute_reservations")
        .fetch_one(&mut server.database().await)
        .await
        .unwrap()
}

impl World {
    fn request(&self, key: &str, gpus: i64) -> Value {
        json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": [{ "class": "gpu", "count": gpus }],
                "duration": "1h", "idempotencyKey": key })
    }

    async fn plan(&self, body: Value) -> Value {
        let (status, plan) = self
            .tenant
            .post("/api/compute/reservations/plan", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{plan}");
        plan
    }
}

async fn a_plan_answers_what_the_create_after_it_does_and_writes_nothing(db: Db) {
    let w = world(db, 2).await;
    w.book_node("n1", T0, 2).await;
    let (audited, rows) = (
        audit_count(&w.server).await,
        reservation_rows(&w.server).await,
    );
    let plan = w.plan(w.request("k-1", 8)).await;
    assert_eq!(plan["outcome"], "placed", "{plan}");
    assert_eq!(plan["iam"], "allow");
    assert_eq!(
        plan["quota"],
        json!({ "admits": true, "resources": [{ "resource": "gpu", "requested": 8, "limit": 32, "used": 8 }] })
    );
    assert_eq!(plan["placement"]["members"][0]["nodeId"], "n2", "{plan}");
    assert_eq!(plan["placement"]["preempts"], json!([]));
    assert!(
        plan["placement"]["placedBy"]
            .as_str()
            .is_some_and(|p| p.starts_with("sha256:")),
        "{plan}"
    );
    assert_eq!(
        audit_count(&w.server).await,
        audited,
        "a plan writes nothing"
    );
    assert_eq!(reservation_rows(&w.server).await, rows, "not even a draft");
    let (status, created) = w
        .tenant
        .post("/api/compute/reservations/create", w.request("k-1", 8))
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert_eq!(created["id"], plan["reservationId"]);
    assert_eq!(created["state"], "placed");
    assert_eq!(
        created["placement"]["members"],
        plan["placement"]["members"]
    );
    assert_eq!(
        created["placement"]["placedBy"],
        plan["placement"]["placedBy"]
    );
    // The same key again is a replay; a request that no node can take now waits.
    let replay = w.plan(w.request("k-1", 8)).await;
    assert_eq!(
        (&replay["outcome"], &replay["replayed"]),
        (&json!("replayed"), &json!("placed")),
        "{replay}"
    );
    let (status, err) = w
        .tenant
        .post("/api/compute/reservations/plan", w.request("k-1", 4))
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    let waiting = w.plan(w.request("k-2", 8)).await;
    assert_eq!(waiting["outcome"], "pending", "{waiting}");
    assert_eq!(waiting["placement"]["members"], json!([]));
    assert!(
        waiting["placement"]["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{waiting}"
    );
    let (_, pending) = w
        .tenant
        .post("/api/compute/reservations/create", w.request("k-2", 8))
        .await;
    assert_eq!(pending["state"], "pending", "{pending}");
    assert_eq!(
        pending["conditions"][0]["message"],
        waiting["placement"]["reason"]
    );
}

async fn a_plan_by_a_key_that_may_not_create_for_the_tenant_finds_no_pool(db: Db) {
    let w = world(db, 1).await;
    let rival = w.server.org_with_key("rival", "admin").await;
    let without = w
        .server
        .key_in("tenant-a", json!({ "permissions": ["events.read"] }))
        .await;
    let request = w.request("k-plan", 1);
    for (who, api) in [
        ("another org's admin", rival),
        (
            "a key of the tenant without compute.create",
            w.server.as_key(&without),
        ),
    ] {
        let (status, err) = api
            .post("/api/compute/reservations/plan", request.clone())
            .await;
        assert_eq!(
            (status, err["error"]["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("NOT_FOUND")),
            "{who}: {err}"
        );
    }
    assert_eq!(w.plan(request).await["outcome"], "placed");
}

async fn a_plan_reports_the_iam_decision_and_the_quota_that_refuse_a_create(db: Db) {
    let w = world(db, 4).await;
    let policy = r#"permit(principal, action == Orl::Action::"compute:reservations:create", resource) when { context.gpuCount <= 16 };"#;
    let (status, body) = w
        .server
        .admin()
        .put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": policy }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let mut big = w.request("k-big", 8);
    big["gang"] = json!({ "size": 3 });
    let plan = w.plan(big.clone()).await;
    assert_eq!(
        (&plan["outcome"], &plan["iam"]),
        (&json!("ACCESS_DENIED"), &json!("deny")),
        "{plan}"
    );
    let (status, err) = w
        .tenant
        .post("/api/compute/reservations/create", big.clone())
        .await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");
    let refused = w.plan(big).await;
    assert_eq!(
        (&refused["outcome"], &refused["replayed"]),
        (&json!("ACCESS_DENIED"), &json!("denied")),
        "a refused key stays refused: {refused}"
    );
    w.book_node("n1", T0, 1).await;
    w.book_node("n2", T0, 1).await;
    w.book_node("n3", T0, 1).await;
    let mut pair = w.request("k-pair", 8);
    pair["gang"] = json!({ "size": 2 });
    let plan = w.plan(pair.clone()).await;
    assert_eq!(
        (&plan["outcome"], &plan["iam"]),
        (&json!("QUOTA_EXCEEDED"), &json!("allow")),
        "{plan}"
    );
    assert_eq!(
        plan["quota"],
        json!({ "admits": false, "resources": [{ "resource": "gpu", "requested": 16, "limit": 32, "used": 24 }] })
    );
    let (status, err) = w
        .tenant
        .post("/api/compute/reservations/create", pair)
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "QUOTA_EXCEEDED");
}

async fn operators_find_nodes_with_units_free_of_bookings_and_claims_over_a_term(db: Db) {
    let w = world(db, 3).await;
    w.server.org_with_key("anchor", "member").await;
    w.book_node("n1", T0, 2).await;
    let claimed: Vec<String> = (0..6).map(|g| format!("n2-gpu{g}")).collect();
    let (status, nr) = w
        .server
        .admin()
        .post(
            "/v1/nodes/n2/reservations",
            json!({ "unitIds": claimed, "allowedOrgIds": ["anchor"], "endsAt": rfc3339(T0 + 10 * HOUR) }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");
    let admin = w.server.admin();
    let free = |query: String| {
        let admin = admin.clone();
        async move {
            let (status, page) = admin.get(&format!("/v1/nodes/availability?{query}")).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            let nodes: Vec<(String, usize)> = page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| {
                    let units = n["freeUnitIds"].as_array().unwrap().len();
                    (n["nodeId"].as_str().unwrap().to_string(), units)
                })
                .collect();
            (nodes, page["cursor"].clone())
        }
    };
    let hour = |h: i64| rfc3339(T0 + h * HOUR).replace('+', "%2B");
    let owned = |pairs: &[(&str, usize)]| -> Vec<(String, usize)> {
        pairs.iter().map(|(n, u)| (n.to_string(), *u)).collect()
    };
    let (now, _) = free(format!("unitCount=8&from={}&to={}", hour(0), hour(1))).await;
    assert_eq!(now, owned(&[("n3", 8)]));
    let (two, _) = free(format!("unitCount=2&from={}&to={}", hour(0), hour(1))).await;
    assert_eq!(two, owned(&[("n2", 2), ("n3", 8)]));
    let (later, _) = free(format!("unitCount=8&from={}&to={}", hour(3), hour(4))).await;
    assert_eq!(later, owned(&[("n1", 8), ("n3", 8)]));
    let (open_ended, _) = free(format!("unitCount=8&from={}", hour(3))).await;
    assert_eq!(
        open_ended,
        owned(&[("n1", 8), ("n3", 8)]),
        "the claim ends at 10 h"
    );
    let (none, _) = free("unitCount=1&model=L4".to_string()).await;
    assert!(none.is_empty());
    let (first, cursor) = free("unitCount=8&limit=1".to_string()).await;
    assert_eq!((first, cursor.clone()), (owned(&[("n3", 8)]), json!("n3")));
    let (rest, cursor) = free("unitCount=8&limit=1&cursor=n3".to_string()).await;
    assert_eq!((rest, cursor), (Vec::new(), Value::Null));
    for (query, field) in [
        ("unitCount=0", "unitCount"),
        ("unitCount=1&limit=201", "limit"),
        ("unitCount=1&from=yesterday", "from"),
        (
            &format!("unitCount=1&from={}&to={}", hour(2), hour(1)) as &str,
            "to",
        ),
    ] {
        let (status, err) = admin.get(&format!("/v1/nodes/availability?{query}")).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(err["error"]["details"]["field"], field, "{query}: {err}");
    }
    let (status, err) = w.tenant.get("/v1/nodes/availability?unitCount=1").await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}

async fn a_plan_waits_behind_the_queue_as_the_create_does_in_a_pool_lease_pool_only(db: Db) {
    for (policy, queued) in [
        (json!({ "placer": "pool-lease" }), true),
        (json!({}), false),
    ] {
        let w = world_with(db, 1, policy.clone(), 32).await;
        let (_, half) = w
            .tenant
            .post("/api/compute/reservations/create", w.request("k-half", 4))
            .await;
        assert_eq!(half["state"], "placed", "{half}");
        // Eight do not fit and wait; one would fit, but in a pool-lease pool nothing jumps
        // the queue.
        let (_, first) = w
            .tenant
            .post("/api/compute/reservations/create", w.request("k-first", 8))
            .await;
        assert_eq!(first["state"], "pending", "{first}");
        let plan = w.plan(w.request("k-small", 1)).await;
        let (_, small) = w
            .tenant
            .post("/api/compute/reservations/create", w.request("k-small", 1))
            .await;
        if queued {
            assert_eq!(plan["outcome"], "queued", "{policy}: {plan}");
            assert_eq!(small["state"], "pending", "{small}");
            assert_eq!(small["conditions"][0]["type"], "Queued", "{small}");
        } else {
            assert_eq!(plan["outcome"], "placed", "{policy}: {plan}");
            assert_eq!(small["state"], "placed", "{small}");
        }
    }
}

/// Random bookings over two days on five nodes, then searches for single nodes of 1, 2,
/// 4 and 8 GPUs, a whole-node binding and a gang: every slot answered is created at its
/// start and placed on its nodes and units, at its latest start too, and a millisecond
/// earlier its node does not take it.
async fn every_slot_found_over_a_random_booking_history_is_booked_at_its_start_and_not_before(
    db: Db,
) {
    use rand::{Rng as _, SeedableRng as _};
    let w = world_with(db, 5, json!({ "tenantRoot": true }), 100_000).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(20);
    for i in 0..25 {
        let node = format!("n{}", rng.random_range(1..=5));
        let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
        let topology = if gpus <= 4 { "nvlink-all" } else { "any" };
        let start = T0 + rng.random_range(1..48) * HOUR;
        let body = json!({ "tenantId": "tenant-a", "poolId": w.pool,
                           "devices": [{ "class": "gpu", "count": gpus, "topology": topology, "selector": { "labels": { "node": node } } }],
                           "start": start, "duration": rng.random_range(1..=8) * 3600, "idempotencyKey": format!("history-{i}") });
        let (status, r) = w
            .tenant
            .post("/api/compute/reservations/create", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        if r["state"] != "placed" {
            w.cancel(&r).await;
        }
    }
    let mut tried = 0;
    for (n, (gpus, extra)) in [
        (1, json!({})),
        (2, json!({})),
        (4, json!({})),
        (8, json!({})),
        (8, json!({ "binding": "node" })),
        (4, json!({ "gang": { "size": 2 } })),
    ]
    .into_iter()
    .enumerate()
    {
        let hours = rng.random_range(1..=6);
        // From an hour ahead: nothing found starts before the reconciler may activate it.
        let from = T0 + HOUR;
        let mut ask = w.ask(gpus, hours, from, T0 + 72 * HOUR);
        ask["limit"] = json!(50);
        for (k, v) in extra.as_object().unwrap() {
            ask[k] = v.clone();
        }
        let (status, found) = w.search(ask.clone()).await;
        assert_eq!(status, StatusCode::OK, "{found}");
        let slots = found["slots"].as_array().unwrap().clone();
        assert!(!slots.is_empty(), "{ask} → {found}");
        for (i, slot) in slots.iter().enumerate() {
            let start = slot["start"].as_i64().unwrap();
            let latest = slot["latestStart"].as_i64().unwrap();
            assert!(start <= latest, "{slot}");
            let members = slot["members"].as_array().unwrap();
            let pinned = |at: i64, key: &str| {
                let mut body = ask.clone();
                for field in ["window", "limit"] {
                    body.as_object_mut().unwrap().remove(field);
                }
                body["start"] = json!(at);
                body["idempotencyKey"] = json!(format!("{key}-{n}-{i}"));
                if members.len() == 1 {
                    body["devices"][0]["selector"] =
                        json!({ "labels": { "node": members[0]["nodeId"] } });
                }
                body
            };
            let created = w.create_at(pinned(start, "at-start")).await;
            assert_eq!(created["state"], "placed", "{slot} → {created}");
            let got: Vec<(Value, Vec<String>)> = created["placement"]["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| (m["nodeId"].clone(), sorted_units(&m["unitIds"])))
                .collect();
            let mut want: Vec<(Value, Vec<String>)> = members
                .iter()
                .map(|m| (m["nodeId"].clone(), sorted_units(&m["unitIds"])))
                .collect();
            let mut got = got;
            got.sort_by(|a, b| a.0.as_str().cmp(&b.0.as_str()));
            want.sort_by(|a, b| a.0.as_str().cmp(&b.0.as_str()));
            assert_eq!(got, want, "{slot} → {created}");
            w.cancel(&created).await;
            let created = w.create_at(pinned(latest, "at-latest")).await;
            assert_eq!(created["state"], "placed", "{slot} → {created}");
            w.cancel(&created).await;
            if members.len() == 1 && start > from {
                let early = w.create_at(pinned(start - 1, "early")).await;
                assert_eq!(early["state"], "pending", "{slot} → {early}");
                w.cancel(&early).await;
            }
            tried += 1;
        }
    }
    assert!(tried >= 12, "{tried} slots tried");
}

fn sorted_units(units: &Value) -> Vec<String> {
    let mut units: Vec<String> = serde_json::from_value(units.clone()).unwrap();
    units.sort();
    units
}

impl World {
    async fn create_at(&self, body: Value) -> Value {
        let (status, r) = self
            .tenant
            .post("/api/compute/reservations/create", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    async fn cancel(&self, r: &Value) {
        let (status, done) = self
            .tenant
            .post(
                "/api/compute/reservations/cancel",
                json!({ "tenantId": "tenant-a", "reservationId": r["id"] }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
    }
}
