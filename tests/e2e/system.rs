use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Db, Options, Server, on_both_databases, register_node};

on_both_databases!(
    healthz_answers_ok,
    metrics_count_requests_by_route_and_status,
    openapi_describes_every_v1_route,
    demo_seeds_four_h100_nodes_and_prints_working_keys,
    demo_refuses_a_database_it_did_not_seed_and_changes_nothing,
);

async fn healthz_answers_ok(db: Db) {
    let server = Server::start(db).await;
    let (status, body) = server.anonymous().get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
}

async fn metrics_count_requests_by_route_and_status(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 1).await;
    provider.get("/v1/nodes/missing").await;
    provider.get("/v1/nodes/missing-too").await;
    let (status, text) = server.anonymous().get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().unwrap();
    assert!(
        text.contains(
            r#"orl_http_requests_total{method="GET",route="/v1/nodes/{nodeId}",status="404"} 2"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"orl_http_request_duration_seconds_count{method="PUT",route="/v1/orgs/{orgId}/provider/nodes/{nodeId}",status="201"} 1"#));
}

async fn openapi_describes_every_v1_route(db: Db) {
    let server = Server::start(db).await;
    let (status, doc) = server.anonymous().get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/orgs",
        "/v1/orgs/{orgId}",
        "/v1/orgs/{orgId}/api-keys",
        "/v1/orgs/{orgId}/api-keys/{keyId}",
        "/v1/orgs/{orgId}/provider/nodes",
        "/v1/orgs/{orgId}/provider/nodes/{nodeId}",
        "/v1/nodes/{nodeId}",
        "/v1/audit",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "{path} missing from /openapi.json"
        );
    }
    assert!(doc["components"]["schemas"].get("NodeInventory").is_some());
    assert!(doc["components"]["securitySchemes"].get("apiKey").is_some());
    // Every operation has an id of its own (clients are generated from them).
    let mut ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|ops| ops.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    let operations = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), operations, "operation ids repeat: {ids:?}");
    // A body that may be left out is not required; none is declared as `null`, which the
    // server refuses (a body is a JSON object).
    let end = &doc["paths"]["/v1/nodes/{nodeId}/reservations/{id}/end"]["post"]["requestBody"];
    assert!(end.get("required").is_none_or(|r| r == false), "{end}");
    assert_eq!(
        end["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/Because"
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let content = op["requestBody"]["content"].to_string();
            assert!(
                !content.contains(r#"{"type":"null"}"#),
                "{method} {path} declares a null body: {content}"
            );
        }
    }
}

async fn demo_refuses_a_database_it_did_not_seed_and_changes_nothing(db: Db) {
    let mut server = Server::start(db).await;
    let provider = server.org_with_key("acme-gpu", "provider").await;
    let mut inventory = crate::support::h100_inventory("h100-1", 2);
    inventory["labels"] = json!({ "rack": "r7" });
    let (status, node) = provider
        .put("/v1/orgs/acme-gpu/provider/nodes/h100-1", inventory)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    let audit_before = crate::support::audit_count(&server).await;

    let stderr = server
        .restart_refused(Options {
            demo: true,
            admin_key: Some(server.admin.clone()),
            ..Options::default()
        })
        .await;
    assert!(
        stderr.contains("--demo seeds an empty database") && stderr.contains("nothing was changed"),
        "{stderr}"
    );

    server
        .restart_with(Options {
            admin_key: Some(server.admin.clone()),
            ..Options::default()
        })
        .await;
    let (_, after) = server.admin().get("/v1/nodes/h100-1").await;
    assert_eq!(after["units"].as_array().unwrap().len(), 2, "{after}");
    assert_eq!(after["labels"], json!({ "rack": "r7" }));
    assert_eq!(crate::support::audit_count(&server).await, audit_before);
    let (_, orgs) = server.admin().get("/v1/orgs/tenant-a").await;
    assert_eq!(
        orgs["error"]["code"], "NOT_FOUND",
        "no demo org was added: {orgs}"
    );
}

async fn demo_seeds_four_h100_nodes_and_prints_working_keys(db: Db) {
    let mut server = Server::start_with(
        db,
        Options {
            demo: true,
            ..Options::default()
        },
    )
    .await;
    let provider_key = banner_value(&server.banner, "provider key:");
    let tenant_key = banner_value(&server.banner, "tenant key:");
    let provider = server.as_key(&provider_key);
    let (status, nodes) = provider.get("/v1/orgs/acme-gpu/provider/nodes").await;
    assert_eq!(status, StatusCode::OK, "{nodes}");
    let nodes = nodes["items"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    for node in nodes {
        let units = node["units"].as_array().unwrap();
        assert_eq!(units.len(), 8);
        assert_eq!(
            units.iter().filter(|u| u["nvlinkDomain"] == "nvl0").count(),
            4
        );
        assert_eq!(units[0]["model"], "H100-SXM5-80GB");
    }
    assert_eq!(
        server.as_key(&tenant_key).get("/v1/nodes/h100-1").await.0,
        StatusCode::NOT_FOUND
    );
    assert!(server.banner.contains("curl"));

    server
        .restart_with(Options {
            demo: true,
            admin_key: Some(server.admin.clone()),
            ..Options::default()
        })
        .await;
    assert_eq!(
        banner_value(&server.banner, "provider key:"),
        provider_key,
        "a restart keeps the demo keys"
    );
    let (_, nodes) = server
        .as_key(&provider_key)
        .get("/v1/orgs/acme-gpu/provider/nodes")
        .await;
    assert_eq!(
        nodes["items"][0]["topologyGen"], 1,
        "re-seeding changes nothing"
    );
}

fn banner_value(banner: &str, label: &str) -> String {
    banner
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("{label} not in banner:\n{banner}"))
        .trim()
        .to_string()
}
