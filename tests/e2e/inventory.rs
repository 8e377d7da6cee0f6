use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{
    Db, Server, assert_error, audit_count, h100_inventory, on_both_databases, register_node,
};

on_both_databases!(
    registering_a_node_starts_at_topology_generation_one,
    resending_the_same_inventory_changes_nothing,
    non_topology_changes_update_without_a_bump,
    adding_removing_or_moving_units_bumps_topology_gen,
    mixed_gpu_classes_make_a_node_not_single_class,
    nodes_are_visible_to_ops_and_their_owner_only,
    another_org_cannot_take_over_a_node,
    concurrent_first_registrations_create_one_node,
    the_node_list_pages_by_id_over_rest_and_graphql,
);

async fn the_node_list_pages_by_id_over_rest_and_graphql(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let other = server.org_with_key("bcme", "provider").await;
    for node in ["n3", "n1", "n5", "n2", "n4"] {
        register_node(&provider, "acme", node, 1).await;
    }
    register_node(&other, "bcme", "n0", 1).await;

    let mut pages = Vec::new();
    let mut path = "/v1/orgs/acme/provider/nodes?limit=2".to_string();
    loop {
        let (status, page) = provider.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let ids: Vec<&str> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap())
            .collect();
        pages.push(ids.join(","));
        match page["cursor"].as_str() {
            Some(cursor) => path = format!("/v1/orgs/acme/provider/nodes?limit=2&cursor={cursor}"),
            None => break,
        }
        assert!(pages.len() < 5, "the cursor must end: {pages:?}");
    }
    assert_eq!(pages, ["n1,n2", "n3,n4", "n5"]);

    let (status, body) = provider
        .post(
            "/graphql",
            json!({ "query": "{ nodes(first: 2, after: \"n2\") { edges { node { id } cursor } pageInfo { hasNextPage } } }" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["data"]["nodes"],
        json!({
            "edges": [{ "node": { "id": "n3" }, "cursor": "n3" }, { "node": { "id": "n4" }, "cursor": "n4" }],
            "pageInfo": { "hasNextPage": true },
        })
    );

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("cursor=%00", "cursor"),
    ] {
        let (status, err) = provider
            .get(&format!("/v1/orgs/acme/provider/nodes?{query}"))
            .await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(err["error"]["details"]["field"], field, "{err}");
    }
}

async fn registering_a_node_starts_at_topology_generation_one(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let (status, node) = provider
        .put("/v1/orgs/acme/provider/nodes/n1", h100_inventory("n1", 8))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    assert_eq!(node["id"], "n1");
    assert_eq!(node["orgId"], "acme");
    assert_eq!(node["topologyGen"], 1);
    assert_eq!(node["singleClass"], true);
    assert_eq!(node["units"].as_array().unwrap().len(), 8);
    assert_eq!(node["units"][5]["nvlinkDomain"], "nvl1");
    assert_eq!(node["host"]["memoryGiB"], 2048);
    let (_, list) = provider.get("/v1/orgs/acme/provider/nodes").await;
    assert_eq!(list, json!({ "items": [node] }));
}

async fn resending_the_same_inventory_changes_nothing(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let first = register_node(&provider, "acme", "n1", 8).await;
    let audit_before = audit_count(&server).await;
    server.set_clock(crate::support::T0 + 60_000).await;
    let (status, again) = provider
        .put("/v1/orgs/acme/provider/nodes/n1", h100_inventory("n1", 8))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["topologyGen"], 1);
    assert_eq!(again["updatedAt"], first["updatedAt"]);
    assert_eq!(again["units"], first["units"]);
    assert_eq!(audit_count(&server).await, audit_before, "nothing to audit");
}

async fn non_topology_changes_update_without_a_bump(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let mut inv = h100_inventory("n1", 8);
    inv["units"][0]["sellable"] = json!(false);
    inv["units"][1]["model"] = json!("H100-NVL-94GB");
    inv["host"]["vcpu"] = json!(192);
    inv["region"] = json!("eu-west-2");
    let (status, node) = provider.put("/v1/orgs/acme/provider/nodes/n1", inv).await;
    assert_eq!(status, StatusCode::OK, "{node}");
    assert_eq!(node["topologyGen"], 1);
    assert_eq!(node["units"][0]["sellable"], false);
    assert_eq!(node["host"]["vcpu"], 192);
    assert_eq!(node["region"], "eu-west-2");
}

async fn adding_removing_or_moving_units_bumps_topology_gen(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let put = |inv: Value| {
        let provider = provider.clone();
        async move {
            provider.put("/v1/orgs/acme/provider/nodes/n1", inv).await.1["topologyGen"].clone()
        }
    };
    assert_eq!(put(h100_inventory("n1", 7)).await, 2, "a unit removed");
    assert_eq!(put(h100_inventory("n1", 8)).await, 3, "a unit added");
    let mut moved = h100_inventory("n1", 8);
    moved["units"][3]["nvlinkDomain"] = json!("nvl1");
    assert_eq!(
        put(moved.clone()).await,
        4,
        "a unit moved to another NVLink domain"
    );
    assert_eq!(put(moved).await, 4, "the same again");
    let (_, events) = server.admin().get("/v1/audit?orgId=acme&limit=10").await;
    let actions: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions
            .iter()
            .filter(|a| **a == "node.update-inventory")
            .count(),
        3
    );
}

async fn mixed_gpu_classes_make_a_node_not_single_class(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let mut inv = h100_inventory("n1", 2);
    inv["units"][1]["class"] = json!("device-request");
    inv["units"].as_array_mut().unwrap().push(json!({
        "id": "n1-nic0", "class": "nic-vf", "deviceClass": "nic.vf", "model": "CX7", "memoryGiB": 0, "sellable": true
    }));
    let (status, node) = provider.put("/v1/orgs/acme/provider/nodes/n1", inv).await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    assert_eq!(node["singleClass"], false);
    assert!(node["units"][2].get("nvlinkDomain").is_none());
}

async fn nodes_are_visible_to_ops_and_their_owner_only(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let tenant = server.org_with_key("tenant-a", "admin").await;
    let node = register_node(&provider, "acme", "n1", 8).await;
    assert_eq!(provider.get("/v1/nodes/n1").await.1, node);
    assert_eq!(server.admin().get("/v1/nodes/n1").await.1, node);
    assert_eq!(
        server.admin().get("/v1/orgs/acme/provider/nodes").await.0,
        StatusCode::OK
    );
    for path in ["/v1/nodes/n1", "/v1/orgs/acme/provider/nodes"] {
        tenant
            .expect_error(Method::GET, path, None, StatusCode::NOT_FOUND, "NOT_FOUND")
            .await;
    }
    let hidden = tenant
        .expect_error(
            Method::GET,
            "/v1/nodes/n1",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    let missing = tenant
        .expect_error(
            Method::GET,
            "/v1/nodes/n2",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    assert_eq!(hidden.replace("n1", "X"), missing.replace("n2", "X"));
}

async fn another_org_cannot_take_over_a_node(db: Db) {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    let rival = server.org_with_key("rival", "provider").await;
    let node = register_node(&acme, "acme", "n1", 8).await;
    let (status, body) = rival
        .put("/v1/orgs/rival/provider/nodes/n1", h100_inventory("n1", 1))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, body) = rival
        .put("/v1/orgs/acme/provider/nodes/n1", h100_inventory("n1", 1))
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "NOT_FOUND");
    assert_eq!(acme.get("/v1/nodes/n1").await.1, node, "untouched");
}

async fn concurrent_first_registrations_create_one_node(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let calls = (0..16).map(|_| {
        let provider = provider.clone();
        tokio::spawn(async move {
            provider
                .put("/v1/orgs/acme/provider/nodes/n1", h100_inventory("n1", 8))
                .await
        })
    });
    let results = futures::future::join_all(calls).await;
    let statuses: Vec<StatusCode> = results.into_iter().map(|r| r.unwrap().0).collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    assert!(statuses.iter().all(|s| s.is_success()), "{statuses:?}");
    let (_, node) = provider.get("/v1/nodes/n1").await;
    assert_eq!(node["topologyGen"], 1);
    let (_, audit) = server.admin().get("/v1/audit?orgId=acme&limit=50").await;
    let registrations = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "node.register")
        .count();
    assert_eq!(registrations, 1);
}
