use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Db, Server, on_both_databases, register_node};

on_both_databases!(
    every_mutation_is_audited_with_actor_and_object,
    org_admins_read_only_their_own_orgs_audit,
    audit_pages_follow_the_cursor_without_gaps,
);

async fn every_mutation_is_audited_with_actor_and_object(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let (_, page) = server.admin().get("/v1/audit?orgId=acme").await;
    let items = page["items"].as_array().unwrap();
    let actions: Vec<&str> = items
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["node.register", "api-key.create", "org.create"]);
    let register = &items[0];
    assert_eq!(register["objectType"], "node");
    assert_eq!(register["objectId"], "n1");
    assert_eq!(register["actorOrgId"], "acme");
    assert!(register["actorKeyId"].as_str().unwrap().starts_with("key_"));
    assert_eq!(register["at"], "2026-12-01T00:00:00.000Z");
    assert_eq!(items[2]["actorOrgId"], "ops");
}

async fn org_admins_read_only_their_own_orgs_audit(db: Db) {
    let server = Server::start(db).await;
    let acme_admin = server.org_with_key("acme", "admin").await;
    let rival_admin = server.org_with_key("rival", "admin").await;
    register_node(&acme_admin, "acme", "n1", 2).await;
    let (status, own) = acme_admin.get("/v1/audit").await;
    assert_eq!(status, StatusCode::OK, "{own}");
    assert!(
        own["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["orgId"] == "acme")
    );
    assert!(!own["items"].as_array().unwrap().is_empty());
    rival_admin
        .expect_error(
            Method::GET,
            "/v1/audit?orgId=acme",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    let member = server.org_with_key("acme", "member").await;
    member
        .expect_error(
            Method::GET,
            "/v1/audit",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
}

async fn audit_pages_follow_the_cursor_without_gaps(db: Db) {
    let server = Server::start(db).await;
    for i in 0..7 {
        server
            .admin()
            .post("/v1/orgs", json!({ "id": format!("org{i}"), "name": "x" }))
            .await;
    }
    let (_, all) = server.admin().get("/v1/audit?limit=200").await;
    let all_ids: Vec<String> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let mut paged = Vec::new();
    let mut path = "/v1/audit?limit=3".to_string();
    loop {
        let (_, page) = server.admin().get(&path).await;
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 3);
        paged.extend(items.iter().map(|e| e["id"].as_str().unwrap().to_string()));
        match page["cursor"].as_str() {
            Some(cursor) => path = format!("/v1/audit?limit=3&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(paged, all_ids);
    assert!(all_ids.len() >= 9);
}
