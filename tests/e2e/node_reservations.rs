//! Node reservations over HTTP (seeds 000, 001, 002).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{
    Api, Db, HOUR, Server, T0, assert_error, at, audit_count, h100_inventory, on_both_databases,
    register_node,
};

/// A provider `acme` with node `n1` of 8 H100s, and tenant orgs `tenant-a`, `broker`,
/// `stranger`, each with a key of `role`.
struct World {
    server: Server,
    provider: Api,
    tenant: Api,
    broker: Api,
    stranger: Api,
}

async fn world(db: Db) -> World {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let tenant = server.org_with_key("tenant-a", "member").await;
    let broker = server.org_with_key("broker", "provider").await;
    let stranger = server.org_with_key("stranger", "member").await;
    World {
        server,
        provider,
        tenant,
        broker,
        stranger,
    }
}

impl World {
    async fn reserve(&self, body: Value) -> Value {
        let (status, r) = self
            .server
            .admin()
            .post("/v1/nodes/n1/reservations", body)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        r
    }

    /// Puts `n1` in a pool offered to `tenant-a` and `stranger`: the catalog shows an org
    /// the nodes of the pools it may book into. Answers the pool's id.
    async fn offer_n1(&self) -> String {
        let admin = self.server.admin();
        let (status, pool) = admin
            .post(
                "/v1/pools",
                json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": ["n1"] }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{pool}");
        for tenant in ["tenant-a", "stranger"] {
            let (status, offer) = admin
                .post(
                    &format!("/v1/pools/{}/offers", pool["id"].as_str().unwrap()),
                    json!({ "tenantId": tenant, "quota": { "gpu": 8 } }),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{offer}");
        }
        pool["id"].as_str().unwrap().to_string()
    }

    async fn catalog_units(&self, api: &Api, org: &str) -> Vec<Value> {
        let (status, catalog) = api.get(&format!("/v1/orgs/{org}/catalog")).await;
        assert_eq!(status, StatusCode::OK, "{catalog}");
        catalog["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|n| n["units"].as_array().unwrap().clone())
            .collect()
    }
}

fn unit_ids(units: &[Value]) -> Vec<String> {
    units
        .iter()
        .map(|u| u["id"].as_str().unwrap().to_string())
        .collect()
}

on_both_databases!(
    the_seed_example_request_reserves_units_for_an_audience,
    only_platform_admins_reserve_and_others_get_404,
    invalid_reservations_are_refused_and_write_nothing,
    overlapping_reservation_is_rejected_naming_the_conflict,
    thirty_two_concurrent_overlapping_creates_yield_exactly_one,
    the_database_itself_refuses_overlapping_claims,
    visibility_matrix_of_a_nodes_reservations,
    an_org_sees_the_capacity_reserved_to_it,
    released_units_go_on_the_spot_market,
    managing_org_releases_only_while_active_and_in_term,
    ending_a_reservation_returns_units_to_the_public_pool,
    status_follows_the_clock_from_pending_to_expired,
    topology_change_puts_reservations_in_review_until_reaffirmed,
    reaffirm_is_refused_when_units_are_gone,
    catalog_shows_reserved_units_only_to_their_audience,
    an_extend_stops_where_a_node_reservation_of_another_audience_begins,
);

async fn the_seed_example_request_reserves_units_for_an_audience(db: Db) {
    let w = world(db).await;
    let body = json!({ "unitIds": ["n1-gpu0", "n1-gpu1"], "allowedOrgIds": ["tenant-a"] });
    let (status, r) = w
        .server
        .admin()
        .post("/v1/nodes/n1/reservations", body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert!(r["id"].as_str().unwrap().starts_with("nrsv_"));
    assert_eq!(r["nodeId"], "n1");
    assert_eq!(r["reservedUnitIds"], json!(["n1-gpu0", "n1-gpu1"]));
    assert_eq!(r["releasedUnitIds"], json!([]));
    assert_eq!(
        r["allowedOrgIds"],
        json!(["tenant-a", "ops"]),
        "the ops org is added"
    );
    assert_eq!(r["managingOrgIds"], json!([]));
    assert_eq!(r["status"], "active");
    assert_eq!(r["startsAt"], at(0), "defaults to now");
    assert!(r.get("endsAt").is_none(), "open-ended");
    assert_eq!(r["topologyGen"], 1);
    let (status, read) = w
        .provider
        .get(&format!(
            "/v1/nodes/n1/reservations/{}",
            r["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read, r);

    let full = w
        .reserve(json!({
            "unitIds": ["n1-gpu4"], "allowedOrgIds": ["tenant-a", "stranger"], "managingOrgIds": ["broker"],
            "startsAt": at(1), "endsAt": at(720), "contractRef": "MSA-2026-17", "reason": "annual deal",
        }))
        .await;
    assert_eq!(full["status"], "pending");
    assert_eq!(full["endsAt"], at(720));
    assert_eq!(full["contractRef"], "MSA-2026-17");
    assert_eq!(full["reason"], "annual deal");
    assert_eq!(full["managingOrgIds"], json!(["broker"]));
    let (_, audit) = w.server.admin().get("/v1/audit?orgId=acme&limit=1").await;
    assert_eq!(audit["items"][0]["action"], "node-reservation.create");
    assert_eq!(audit["items"][0]["reason"], "annual deal");
}

async fn only_platform_admins_reserve_and_others_get_404(db: Db) {
    let w = world(db).await;
    let body = json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"] });
    let owner_admin = w
        .server
        .as_key(&w.server.key_in("acme", json!({ "role": "admin" })).await);
    for api in [&w.provider, &w.tenant, &owner_admin] {
        let (status, err) = api.post("/v1/nodes/n1/reservations", body.clone()).await;
        assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    }
    let ops_operator = w
        .server
        .as_key(&w.server.key_in("ops", json!({ "role": "operator" })).await);
    let (status, r) = ops_operator.post("/v1/nodes/n1/reservations", body).await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let ops_viewer = w
        .server
        .as_key(&w.server.key_in("ops", json!({ "role": "viewer" })).await);
    let body = json!({ "unitIds": ["n1-gpu1"], "allowedOrgIds": ["tenant-a"] });
    let (status, err) = ops_viewer.post("/v1/nodes/n1/reservations", body).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}

async fn invalid_reservations_are_refused_and_write_nothing(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    let mut inv = h100_inventory("n2", 4);
    inv["units"][3]["sellable"] = json!(false);
    w.provider.put("/v1/orgs/acme/provider/nodes/n2", inv).await;
    let mig = json!({ "host": { "vcpu": 64, "memoryGiB": 512 }, "units": [
        { "id": "n4-mig0", "class": "mig", "deviceClass": "gpu.mig", "model": "H100 1g.10gb", "memoryGiB": 10, "sellable": true }
    ]});
    w.provider.put("/v1/orgs/acme/provider/nodes/n4", mig).await;
    let mut mixed = h100_inventory("n3", 2);
    mixed["units"][1]["class"] = json!("device-request");
    w.provider
        .put("/v1/orgs/acme/provider/nodes/n3", mixed)
        .await;
    let before = audit_count(&w.server).await;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "n1",
            json!({ "unitIds": [], "allowedOrgIds": ["tenant-a"] }),
            "unitIds",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0", "n1-gpu0"], "allowedOrgIds": ["tenant-a"] }),
            "unitIds[1]",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu9"], "allowedOrgIds": ["tenant-a"] }),
            "n1-gpu9",
        ),
        (
            "n2",
            json!({ "unitIds": ["n2-gpu3"], "allowedOrgIds": ["tenant-a"] }),
            "not sellable",
        ),
        (
            "n4",
            json!({ "unitIds": ["n4-mig0"], "allowedOrgIds": ["tenant-a"] }),
            "reservable",
        ),
        (
            "n3",
            json!({ "unitIds": ["n3-gpu0"], "allowedOrgIds": ["tenant-a"] }),
            "single-class",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["nobody"] }),
            "nobody",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "managingOrgIds": ["ghost"] }),
            "ghost",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "startsAt": at(5), "endsAt": at(4) }),
            "endsAt",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "startsAt": at(-5), "endsAt": at(-4) }),
            "endsAt",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "startsAt": "next tuesday" }),
            "startsAt",
        ),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant a"] }),
            "allowedOrgIds[0]",
        ),
        ("n1", json!({ "unitIds": ["n1-gpu0"] }), "allowedOrgIds"),
        (
            "n1",
            json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": [], "colour": "red" }),
            "colour",
        ),
        (
            "n1",
            json!({ "unitIds": "n1-gpu0", "allowedOrgIds": [] }),
            "unitIds",
        ),
    ];
    for (node, body, mention) in cases {
        let message = admin
            .expect_error(
                Method::POST,
                &format!("/v1/nodes/{node}/reservations"),
                Some(body.clone()),
                StatusCode::BAD_REQUEST,
                "INVALID_INPUT",
            )
            .await;
        assert!(
            message.contains(mention),
            "{body}: {message:?} should mention {mention}"
        );
    }
    let (status, err) = admin
        .post(
            "/v1/nodes/nope/reservations",
            json!({ "unitIds": ["x"], "allowedOrgIds": [] }),
        )
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    assert_eq!(audit_count(&w.server).await, before, "nothing written");
    assert_eq!(admin.get("/v1/nodes/n1/reservations").await.1, json!([]));
}

async fn overlapping_reservation_is_rejected_naming_the_conflict(db: Db) {
    let w = world(db).await;
    let first = w
        .reserve(json!({ "unitIds": ["n1-gpu0", "n1-gpu1"], "allowedOrgIds": ["tenant-a"], "endsAt": at(10) }))
        .await;
    let (status, err) = w
        .server
        .admin()
        .post("/v1/nodes/n1/reservations", json!({ "unitIds": ["n1-gpu1", "n1-gpu2"], "allowedOrgIds": ["stranger"], "startsAt": at(5) }))
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(
        err["error"]["details"]["conflicts"],
        json!([{ "reservationId": first["id"], "unitIds": ["n1-gpu1"] }])
    );
    // Terms are half-open: one that starts when the first ends does not overlap.
    w.reserve(json!({ "unitIds": ["n1-gpu1"], "allowedOrgIds": ["stranger"], "startsAt": at(10) }))
        .await;
    // Other units of the node are free.
    w.reserve(json!({ "unitIds": ["n1-gpu2"], "allowedOrgIds": ["stranger"] }))
        .await;
    // An open-ended reservation collides with everything after it.
    let (status, _) = w
        .server
        .admin()
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": ["n1-gpu2"], "allowedOrgIds": ["stranger"], "startsAt": at(1000) }),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
}

async fn thirty_two_concurrent_overlapping_creates_yield_exactly_one(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    let calls = (0..32).map(|i| {
        let admin = admin.clone();
        // Every request shares n1-gpu3 with every other; each also takes a unit of its own pair.
        let body = json!({ "unitIds": [format!("n1-gpu{}", i % 3), "n1-gpu3"], "allowedOrgIds": ["tenant-a"] });
        tokio::spawn(async move { admin.post("/v1/nodes/n1/reservations", body).await })
    });
    let results: Vec<(StatusCode, Value)> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let created = results
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    let conflicts = results
        .iter()
        .filter(|(s, b)| *s == StatusCode::CONFLICT && b["error"]["code"] == "CONFLICT")
        .count();
    assert_eq!((created, conflicts), (1, 31), "{results:?}");
    let (_, list) = admin.get("/v1/nodes/n1/reservations").await;
    assert_eq!(list.as_array().unwrap().len(), 1);
}

async fn visibility_matrix_of_a_nodes_reservations(db: Db) {
    let w = world(db).await;
    let managed = w
        .reserve(json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "managingOrgIds": ["broker"], "startsAt": at(1), "endsAt": at(10) }))
        .await;
    let id = managed["id"].as_str().unwrap();
    let list = "/v1/nodes/n1/reservations";
    let one = format!("/v1/nodes/n1/reservations/{id}");
    let readable = |api: &Api| {
        let api = api.clone();
        let one = one.clone();
        async move {
            let (list_status, _) = api.get(list).await;
            let (one_status, _) = api.get(&one).await;
            assert_eq!(list_status, one_status);
            list_status == StatusCode::OK
        }
    };
    let ops_viewer = w
        .server
        .as_key(&w.server.key_in("ops", json!({ "role": "viewer" })).await);
    // Before the term: ops and the owner read; the managing org does not yet.
    assert!(readable(&ops_viewer).await);
    assert!(readable(&w.provider).await);
    assert!(!readable(&w.broker).await, "managing org before its term");
    assert!(
        !readable(&w.tenant).await,
        "the audience reads via its org, not the node"
    );
    assert!(!readable(&w.stranger).await);
    // Inside the term the managing org reads.
    w.server.set_clock(T0 + 2 * HOUR).await;
    assert!(readable(&w.broker).await, "managing org inside its term");
    assert!(!readable(&w.tenant).await);
    // After the term it does not.
    w.server.set_clock(T0 + 11 * HOUR).await;
    assert!(!readable(&w.broker).await, "managing org after its term");
    assert!(readable(&w.provider).await);
    let (status, err) = w.stranger.get(&one).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, _) = w.provider.get("/v1/nodes/n1/reservations/nrsv_nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

async fn an_org_sees_the_capacity_reserved_to_it(db: Db) {
    let w = world(db).await;
    let mine = w
        .reserve(json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "endsAt": at(24) }))
        .await;
    w.reserve(json!({ "unitIds": ["n1-gpu1"], "allowedOrgIds": ["stranger"] }))
        .await;
    let (status, list) = w.tenant.get("/v1/orgs/tenant-a/reservations").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list, json!([mine]));
    let (_, active) = w
        .tenant
        .get("/v1/orgs/tenant-a/reservations?status=active")
        .await;
    assert_eq!(active.as_array().unwrap().len(), 1);
    let (_, expired) = w
        .tenant
        .get("/v1/orgs/tenant-a/reservations?status=expired")
        .await;
    assert_eq!(expired, json!([]));
    let (status, err) = w
        .tenant
        .get("/v1/orgs/tenant-a/reservations?status=soon")
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = w.stranger.get("/v1/orgs/tenant-a/reservations").await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, ops_view) = w.server.admin().get("/v1/orgs/tenant-a/reservations").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ops_view, json!([mine]));
    let (_, all) = w.server.admin().get("/v1/orgs/ops/reservations").await;
    assert_eq!(all.as_array().unwrap().len(), 2, "ops is in every audience");
}

async fn released_units_go_on_the_spot_market(db: Db) {
    let w = world(db).await;
    let r = w
        .reserve(
            json!({ "unitIds": ["n1-gpu0", "n1-gpu1", "n1-gpu2"], "allowedOrgIds": ["tenant-a"] }),
        )
        .await;
    let path = format!(
        "/v1/nodes/n1/reservations/{}/release",
        r["id"].as_str().unwrap()
    );
    let (status, released) = w
        .provider
        .post(
            &path,
            json!({ "unitIds": ["n1-gpu2", "n1-gpu0"], "reason": "idle this week" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["releasedUnitIds"], json!(["n1-gpu0", "n1-gpu2"]));
    assert_eq!(
        released["reservedUnitIds"], r["reservedUnitIds"],
        "released units stay the reservation's"
    );
    let (_, again) = w
        .server
        .admin()
        .post(&path, json!({ "unitIds": ["n1-gpu0"] }))
        .await;
    assert_eq!(
        again["releasedUnitIds"],
        json!(["n1-gpu0", "n1-gpu2"]),
        "releasing twice is harmless"
    );
    let message = w
        .provider
        .expect_error(
            Method::POST,
            &path,
            Some(json!({ "unitIds": ["n1-gpu5"] })),
            StatusCode::BAD_REQUEST,
            "INVALID_INPUT",
        )
        .await;
    assert!(message.contains("n1-gpu5"), "{message}");
    for api in [&w.tenant, &w.stranger] {
        let (status, err) = api.post(&path, json!({ "unitIds": ["n1-gpu1"] })).await;
        assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    }
    let (_, audit) = w.server.admin().get("/v1/audit?orgId=acme&limit=5").await;
    let releases: Vec<&Value> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "node-reservation.release-units")
        .collect();
    assert_eq!(
        releases.len(),
        1,
        "releasing what is released records nothing"
    );
    assert_eq!(releases[0]["reason"], "idle this week");

    let pending = w
        .reserve(
            json!({ "unitIds": ["n1-gpu5"], "allowedOrgIds": ["tenant-a"], "startsAt": at(2) }),
        )
        .await;
    let path = format!(
        "/v1/nodes/n1/reservations/{}/release",
        pending["id"].as_str().unwrap()
    );
    let (status, err) = w
        .provider
        .post(&path, json!({ "unitIds": ["n1-gpu5"] }))
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
}

async fn managing_org_releases_only_while_active_and_in_term(db: Db) {
    let w = world(db).await;
    let r = w
        .reserve(json!({ "unitIds": ["n1-gpu0", "n1-gpu1"], "allowedOrgIds": ["tenant-a"], "managingOrgIds": ["broker"], "startsAt": at(1), "endsAt": at(10) }))
        .await;
    let path = format!(
        "/v1/nodes/n1/reservations/{}/release",
        r["id"].as_str().unwrap()
    );
    let body = json!({ "unitIds": ["n1-gpu0"] });
    let (status, err) = w.broker.post(&path, body.clone()).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    w.server.set_clock(T0 + 2 * HOUR).await;
    let (status, released) = w.broker.post(&path, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{released}");
    assert_eq!(released["releasedUnitIds"], json!(["n1-gpu0"]));
    let broker_viewer = w
        .server
        .as_key(&w.server.key_in("broker", json!({ "role": "viewer" })).await);
    let (status, _) = broker_viewer
        .post(&path, json!({ "unitIds": ["n1-gpu1"] }))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "reservation.capacity is required"
    );
    w.server.set_clock(T0 + 10 * HOUR).await;
    let (status, err) = w
        .broker
        .post(&path, json!({ "unitIds": ["n1-gpu1"] }))
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}

async fn ending_a_reservation_returns_units_to_the_public_pool(db: Db) {
    let w = world(db).await;
    w.offer_n1().await;
    let r = w
        .reserve(json!({ "unitIds": ["n1-gpu0", "n1-gpu1"], "allowedOrgIds": ["tenant-a"] }))
        .await;
    let id = r["id"].as_str().unwrap();
    assert!(
        !unit_ids(&w.catalog_units(&w.stranger, "stranger").await).contains(&"n1-gpu0".to_string())
    );
    let end = format!("/v1/nodes/n1/reservations/{id}/end");
    let (status, err) = w.provider.post(&end, json!({})).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, ended) = w.server.admin().raw(Method::POST, &end, None, None).await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert_eq!(ended["status"], "cancelled");
    assert!(
        unit_ids(&w.catalog_units(&w.stranger, "stranger").await).contains(&"n1-gpu0".to_string())
    );
    let (status, again) = w
        .server
        .admin()
        .post(&end, json!({ "reason": "twice" }))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["status"], "cancelled");
    assert_eq!(
        again["updatedAt"], ended["updatedAt"],
        "ending twice changes nothing"
    );
    w.reserve(json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["stranger"] }))
        .await;
}

async fn status_follows_the_clock_from_pending_to_expired(db: Db) {
    let w = world(db).await;
    let r = w.reserve(json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "startsAt": at(1), "endsAt": at(3) })).await;
    let path = format!("/v1/nodes/n1/reservations/{}", r["id"].as_str().unwrap());
    let status_at = |hours: i64| {
        let server = &w.server;
        let provider = w.provider.clone();
        let path = path.clone();
        async move {
            server.set_clock(T0 + hours * HOUR).await;
            provider.get(&path).await.1["status"]
                .as_str()
                .unwrap()
                .to_string()
        }
    };
    assert_eq!(status_at(0).await, "pending");
    assert_eq!(status_at(1).await, "active");
    assert_eq!(status_at(2).await, "active");
    assert_eq!(status_at(3).await, "expired");
    let end = format!("{path}/end");
    let (status, err) = w.server.admin().post(&end, json!({})).await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
}

async fn topology_change_puts_reservations_in_review_until_reaffirmed(db: Db) {
    let w = world(db).await;
    w.offer_n1().await;
    let r = w
        .reserve(json!({ "unitIds": ["n1-gpu0", "n1-gpu1"], "allowedOrgIds": ["tenant-a"] }))
        .await;
    let id = r["id"].as_str().unwrap();
    let mut moved = h100_inventory("n1", 8);
    moved["units"][7]["nvlinkDomain"] = json!("nvl9");
    let (_, node) = w
        .provider
        .put("/v1/orgs/acme/provider/nodes/n1", moved)
        .await;
    assert_eq!(node["topologyGen"], 2);
    let (_, review) = w
        .provider
        .get(&format!("/v1/nodes/n1/reservations/{id}"))
        .await;
    assert_eq!(review["status"], "needs-review");
    assert_eq!(review["topologyGen"], 1);
    for (api, org) in [(&w.tenant, "tenant-a"), (&w.stranger, "stranger")] {
        let units = unit_ids(&w.catalog_units(api, org).await);
        assert!(
            !units.contains(&"n1-gpu0".to_string()),
            "{org} must not see a needs-review unit"
        );
        assert!(units.contains(&"n1-gpu2".to_string()));
    }
    assert!(
        !unit_ids(&w.catalog_units(&w.server.admin(), "ops").await)
            .contains(&"n1-gpu0".to_string())
    );
    let path = format!("/v1/nodes/n1/reservations/{id}/release");
    let (status, _) = w
        .provider
        .post(&path, json!({ "unitIds": ["n1-gpu0"] }))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "needs-review grants nothing");

    let reaffirm = format!("/v1/nodes/n1/reservations/{id}/reaffirm");
    let (status, err) = w.provider.post(&reaffirm, json!({})).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, ok) = w
        .server
        .admin()
        .post(&reaffirm, json!({ "reason": "checked the new NVLink map" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{ok}");
    assert_eq!(ok["status"], "active");
    assert_eq!(ok["topologyGen"], 2);
    assert!(
        unit_ids(&w.catalog_units(&w.tenant, "tenant-a").await).contains(&"n1-gpu0".to_string())
    );
    let (status, err) = w.server.admin().post(&reaffirm, json!({})).await;
    assert_error(status, &err, StatusCode::CONFLICT, "INVALID_STATE");
}

async fn reaffirm_is_refused_when_units_are_gone(db: Db) {
    let w = world(db).await;
    let r = w
        .reserve(json!({ "unitIds": ["n1-gpu6", "n1-gpu7"], "allowedOrgIds": ["tenant-a"] }))
        .await;
    let id = r["id"].as_str().unwrap();
    register_node(&w.provider, "acme", "n1", 7).await;
    let (status, err) = w
        .server
        .admin()
        .post(
            &format!("/v1/nodes/n1/reservations/{id}/reaffirm"),
            json!({}),
        )
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(
        err["error"]["details"]["missingUnitIds"],
        json!(["n1-gpu7"])
    );
    let (_, still) = w
        .provider
        .get(&format!("/v1/nodes/n1/reservations/{id}"))
        .await;
    assert_eq!(still["status"], "needs-review");
}

async fn catalog_shows_reserved_units_only_to_their_audience(db: Db) {
    let w = world(db).await;
    w.offer_n1().await;
    let r = w
        .reserve(json!({ "unitIds": ["n1-gpu0", "n1-gpu1"], "allowedOrgIds": ["tenant-a"] }))
        .await;
    w.reserve(json!({ "unitIds": ["n1-gpu7"], "allowedOrgIds": ["tenant-a"], "startsAt": at(5) }))
        .await;
    let release = format!(
        "/v1/nodes/n1/reservations/{}/release",
        r["id"].as_str().unwrap()
    );
    w.provider
        .post(&release, json!({ "unitIds": ["n1-gpu1"] }))
        .await;

    let tenant_units = w.catalog_units(&w.tenant, "tenant-a").await;
    let find = |units: &[Value], id: &str| units.iter().find(|u| u["id"] == id).cloned();
    assert_eq!(tenant_units.len(), 8);
    assert_eq!(find(&tenant_units, "n1-gpu0").unwrap()["tier"], "reserved");
    assert_eq!(
        find(&tenant_units, "n1-gpu0").unwrap()["reservationId"],
        r["id"]
    );
    assert_eq!(
        find(&tenant_units, "n1-gpu1").unwrap()["tier"],
        "reserved",
        "the audience keeps full rights"
    );
    assert!(
        find(&tenant_units, "n1-gpu7")
            .unwrap()
            .get("availableUntil")
            .is_none(),
        "tenant is in that audience"
    );

    let stranger_units = w.catalog_units(&w.stranger, "stranger").await;
    assert!(
        find(&stranger_units, "n1-gpu0").is_none(),
        "reserved units are hidden from others"
    );
    assert_eq!(
        find(&stranger_units, "n1-gpu1").unwrap()["tier"],
        "spot-only"
    );
    assert_eq!(find(&stranger_units, "n1-gpu2").unwrap()["tier"], "open");
    assert_eq!(
        find(&stranger_units, "n1-gpu7").unwrap()["availableUntil"],
        at(5)
    );
    assert_eq!(stranger_units.len(), 7);

    let (status, err) = w.stranger.get("/v1/orgs/tenant-a/catalog").await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}

/// A booking on units that a node reservation claims from a later start extends up to that
/// start for a tenant outside its audience (`availableUntil`), and past it for one inside.
async fn an_extend_stops_where_a_node_reservation_of_another_audience_begins(db: Db) {
    let w = world(db).await;
    let pool = w.offer_n1().await;
    let all: Vec<String> = (0..8).map(|u| format!("n1-gpu{u}")).collect();
    w.reserve(json!({ "unitIds": all, "allowedOrgIds": ["tenant-a"], "startsAt": at(3) }))
        .await;
    let call = |api: &Api, method: &str, body: Value| {
        let (api, path) = (api.clone(), format!("/api/compute/reservations/{method}"));
        async move { api.post(&path, body).await }
    };
    for (api, tenant) in [(&w.stranger, "stranger"), (&w.tenant, "tenant-a")] {
        let create = json!({ "tenantId": tenant, "poolId": pool, "devices": [{ "class": "gpu", "count": 4 }], "duration": "2h", "idempotencyKey": format!("c-{tenant}") });
        let (status, r) = call(api, "create", create).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r["state"], "placed", "{r}");
        let extend = json!({ "tenantId": tenant, "reservationId": r["id"], "by": "2h", "idempotencyKey": format!("e-{tenant}") });
        let (status, out) = call(api, "extend", extend).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        if tenant == "stranger" {
            assert_eq!(out["extended"], false, "{out}");
            assert_eq!(out["availableUntil"], T0 + 3 * HOUR, "{out}");
            assert_eq!(out["reservation"]["end"], T0 + 2 * HOUR, "all or nothing");
            let up_to = json!({ "tenantId": tenant, "reservationId": r["id"], "until": T0 + 3 * HOUR, "idempotencyKey": "e-up-to" });
            let (_, out) = call(api, "extend", up_to).await;
            assert_eq!(out["extended"], true, "up to the claim's start: {out}");
        } else {
            assert_eq!(out["extended"], true, "the audience books the term: {out}");
            assert_eq!(out["reservation"]["end"], T0 + 4 * HOUR);
        }
    }
}

async fn the_database_itself_refuses_overlapping_claims(db: Db) {
    let w = world(db).await;
    w.reserve(json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "endsAt": at(10) }))
        .await;
    let mut conn = w.server.database().await;
    sqlx::query(&format!(
        "INSERT INTO node_reservations (id, node_id, allowed_org_ids, managing_org_ids, starts_at, ends_at, lifecycle,
                                        topology_gen, created_at, updated_at)
         VALUES ('nrsv_raw', 'n1', '[]', '[]', {T0}, NULL, 'granted', 1, {T0}, {T0})"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let claim = |unit: &str, start_hours: i64, claiming: &str| {
        format!(
            "INSERT INTO node_reservation_units (reservation_id, node_id, unit_id, position, starts_at, ends_at, released, claiming)
             VALUES ('nrsv_raw', 'n1', '{unit}', 0, {}, NULL, FALSE, {claiming})",
            T0 + start_hours * HOUR
        )
    };
    let err = sqlx::query(&claim("n1-gpu0", 5, "TRUE"))
        .execute(&mut conn)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("node_reservation_units_no_overlap"),
        "{err}"
    );
    sqlx::query(&claim("n1-gpu1", 5, "TRUE"))
        .execute(&mut conn)
        .await
        .expect("another unit is free");
    sqlx::query(&claim("n1-gpu0", 5, "FALSE"))
        .execute(&mut conn)
        .await
        .expect("a non-claiming row never conflicts");
    // The raw rows go again: a reservation that is not cancelled never leaves a row that
    // does not claim, and the invariants checked after each test say so.
    for raw in [
        "DELETE FROM node_reservation_units WHERE reservation_id = 'nrsv_raw'",
        "DELETE FROM node_reservations WHERE id = 'nrsv_raw'",
    ] {
        sqlx::query(raw).execute(&mut conn).await.unwrap();
    }
}
