use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Db, Server, assert_error, on_both_databases};

on_both_databases!(
    ops_admin_creates_an_org_and_reads_it_back,
    creating_an_existing_org_is_a_conflict,
    only_platform_admins_create_orgs,
    an_org_is_invisible_to_other_orgs,
);

async fn ops_admin_creates_an_org_and_reads_it_back(db: Db) {
    let server = Server::start(db).await;
    let (status, org) = server
        .admin()
        .post("/v1/orgs", json!({ "id": "acme-gpu", "name": "Acme GPU" }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{org}");
    assert_eq!(org["id"], "acme-gpu");
    assert_eq!(org["name"], "Acme GPU");
    assert_eq!(org["createdAt"], "2026-12-01T00:00:00.000Z");
    let (status, read) = server.admin().get("/v1/orgs/acme-gpu").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read, org);
}

async fn creating_an_existing_org_is_a_conflict(db: Db) {
    let server = Server::start(db).await;
    let admin = server.admin();
    admin
        .post("/v1/orgs", json!({ "id": "acme", "name": "A" }))
        .await;
    let (status, body) = admin
        .post("/v1/orgs", json!({ "id": "acme", "name": "B" }))
        .await;
    assert_error(status, &body, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(body["error"]["details"]["orgId"], "acme");
    assert_eq!(admin.get("/v1/orgs/acme").await.1["name"], "A");
}

async fn only_platform_admins_create_orgs(db: Db) {
    let server = Server::start(db).await;
    let tenant_admin = server.org_with_key("tenant-a", "admin").await;
    tenant_admin
        .expect_error(
            Method::POST,
            "/v1/orgs",
            Some(json!({ "id": "x", "name": "x" })),
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    let ops_operator = server.as_key(&server.key_in("ops", json!({ "role": "operator" })).await);
    ops_operator
        .expect_error(
            Method::POST,
            "/v1/orgs",
            Some(json!({ "id": "x", "name": "x" })),
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    let (status, _) = server.admin().get("/v1/orgs/x").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
}

async fn an_org_is_invisible_to_other_orgs(db: Db) {
    let server = Server::start(db).await;
    let a = server.org_with_key("tenant-a", "admin").await;
    server.org_with_key("tenant-b", "admin").await;
    assert_eq!(a.get("/v1/orgs/tenant-a").await.0, StatusCode::OK);
    let hidden = a
        .expect_error(
            Method::GET,
            "/v1/orgs/tenant-b",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    let missing = a
        .expect_error(
            Method::GET,
            "/v1/orgs/nope",
            None,
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
        )
        .await;
    assert_eq!(
        hidden.replace("tenant-b", "X"),
        missing.replace("nope", "X"),
        "existence is not leaked"
    );
}
