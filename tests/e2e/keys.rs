use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Api, Db, Server, assert_error, on_both_databases};

/// How long another replica may go on accepting a key revoked through one.
const REVOCATION_REACHES_REPLICAS: std::time::Duration = std::time::Duration::from_secs(1);

on_both_databases!(
    a_created_key_shows_its_secret_once_and_authenticates,
    a_key_with_explicit_permissions_holds_exactly_those,
    a_revoked_key_stops_authenticating_at_once,
    a_key_revoked_through_one_replica_stops_on_the_others,
    a_key_cannot_grant_what_it_does_not_hold,
    an_agent_key_only_creates_agent_keys,
    role_and_permissions_together_are_refused,
    legacy_vl_keys_still_authenticate,
    keys_of_another_org_are_not_found,
);

async fn a_created_key_shows_its_secret_once_and_authenticates(db: Db) {
    let server = Server::start(db).await;
    server
        .admin()
        .post("/v1/orgs", json!({ "id": "acme", "name": "Acme" }))
        .await;
    let (status, created) = server
        .admin()
        .post(
            "/v1/orgs/acme/api-keys",
            json!({ "name": "ci", "role": "provider", "agent": true }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let secret = created["key"].as_str().unwrap();
    assert!(secret.starts_with("or_"));
    assert_eq!(created["role"], "provider");
    assert_eq!(created["agent"], true);
    assert!(
        created["permissions"]
            .as_array()
            .unwrap()
            .contains(&json!("inventory.write"))
    );

    let (status, list) = server.admin().get("/v1/orgs/acme/api-keys").await;
    assert_eq!(status, StatusCode::OK);
    let listed = list["items"].as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], created["id"]);
    assert!(listed[0].get("key").is_none(), "no secret in the list");
    assert!(!list.to_string().contains(secret));

    let (status, org) = server.as_key(secret).get("/v1/orgs/acme").await;
    assert_eq!(status, StatusCode::OK, "{org}");
}

async fn a_key_with_explicit_permissions_holds_exactly_those(db: Db) {
    let server = Server::start(db).await;
    server
        .admin()
        .post("/v1/orgs", json!({ "id": "acme", "name": "Acme" }))
        .await;
    let secret = server
        .key_in("acme", json!({ "permissions": ["provider.read"] }))
        .await;
    let reader = server.as_key(&secret);
    assert_eq!(
        reader.get("/v1/orgs/acme/provider/nodes").await.0,
        StatusCode::OK
    );
    let (status, body) = reader
        .put(
            "/v1/orgs/acme/provider/nodes/n1",
            crate::support::h100_inventory("n1", 2),
        )
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, body) = server
        .admin()
        .post(
            "/v1/orgs/acme/api-keys",
            json!({ "permissions": ["provider.fly"] }),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("provider.fly")
    );
}

/// Revokes acme's one key (as the ops admin); answers its id.
async fn revoke_the_acme_key(server: &Server) -> String {
    let (_, list) = server.admin().get("/v1/orgs/acme/api-keys").await;
    let id = list["items"][0]["id"].as_str().unwrap().to_string();
    let (status, _) = server
        .admin()
        .delete(&format!("/v1/orgs/acme/api-keys/{id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    id
}

async fn a_revoked_key_stops_authenticating_at_once(db: Db) {
    let server = Server::start(db).await;
    let member = server.org_with_key("acme", "member").await;
    assert_eq!(member.get("/v1/orgs/acme").await.0, StatusCode::OK);
    let id = revoke_the_acme_key(&server).await;
    let (status, body) = member.get("/v1/orgs/acme").await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
    let (_, list) = server.admin().get("/v1/orgs/acme/api-keys").await;
    assert!(list["items"][0]["revokedAt"].is_string());
    let (status, _) = server
        .admin()
        .delete(&format!("/v1/orgs/acme/api-keys/{id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "revoking twice is harmless");
    let (status, body) = server
        .admin()
        .delete("/v1/orgs/acme/api-keys/key_nope")
        .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "NOT_FOUND");
}

/// Replicas keep the keys they authenticated in memory; a revocation through one reaches
/// the others (PostgreSQL), and the revoking one refuses the key at once (both databases).
async fn a_key_revoked_through_one_replica_stops_on_the_others(db: Db) {
    let server = Server::start(db).await;
    let member = server.org_with_key("acme", "member").await;
    let replica = match db {
        Db::Postgres => Some(server.replica().await),
        Db::Sqlite => None,
    };
    // Each replica has authenticated the key, and holds it.
    for _ in 0..2 {
        assert_eq!(member.get("/v1/orgs/acme").await.0, StatusCode::OK);
        if let Some(replica) = &replica {
            assert_eq!(
                member.on(replica).get("/v1/orgs/acme").await.0,
                StatusCode::OK
            );
        }
    }
    revoke_the_acme_key(&server).await;
    let (status, body) = member.get("/v1/orgs/acme").await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
    let Some(replica) = replica else { return };
    refused_soon(&member.on(&replica)).await;
    // A key created after the revocation authenticates on both.
    let other = server.as_key(&server.key_in("acme", json!({ "role": "member" })).await);
    assert_eq!(other.get("/v1/orgs/acme").await.0, StatusCode::OK);
    assert_eq!(
        other.on(&replica).get("/v1/orgs/acme").await.0,
        StatusCode::OK
    );
    // However a key is revoked, each replica hears of it: here in the database itself.
    let mut db = server.database().await;
    sqlx::query("UPDATE api_keys SET revoked_at = 1 WHERE revoked_at IS NULL AND org_id = 'acme'")
        .execute(&mut db)
        .await
        .unwrap();
    refused_soon(&other).await;
    refused_soon(&other.on(&replica)).await;
}

/// Waits until `api`'s key is refused, failing if that takes longer than
/// [`REVOCATION_REACHES_REPLICAS`].
async fn refused_soon(api: &Api) {
    let revoked = std::time::Instant::now();
    loop {
        let (status, body) = api.get("/v1/orgs/acme").await;
        if status == StatusCode::UNAUTHORIZED {
            assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
            return;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(
            revoked.elapsed() < REVOCATION_REACHES_REPLICAS,
            "a replica still accepts the revoked key"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn a_key_cannot_grant_what_it_does_not_hold(db: Db) {
    let server = Server::start(db).await;
    server
        .admin()
        .post("/v1/orgs", json!({ "id": "acme", "name": "Acme" }))
        .await;
    let key_manager = server.as_key(
        &server
            .key_in(
                "acme",
                json!({ "permissions": ["keys.manage", "provider.read"] }),
            )
            .await,
    );
    let (status, body) = key_manager
        .post("/v1/orgs/acme/api-keys", json!({ "role": "admin" }))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, body) = key_manager
        .post(
            "/v1/orgs/acme/api-keys",
            json!({ "permissions": ["provider.read"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

async fn an_agent_key_only_creates_agent_keys(db: Db) {
    let server = Server::start(db).await;
    server
        .admin()
        .post("/v1/orgs", json!({ "id": "acme", "name": "Acme" }))
        .await;
    let agent = server.as_key(
        &server
            .key_in("acme", json!({ "role": "admin", "agent": true }))
            .await,
    );
    let (status, body) = agent
        .post("/v1/orgs/acme/api-keys", json!({ "role": "viewer" }))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, body) = agent
        .post(
            "/v1/orgs/acme/api-keys",
            json!({ "role": "viewer", "agent": true }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

async fn role_and_permissions_together_are_refused(db: Db) {
    let server = Server::start(db).await;
    server
        .admin()
        .post("/v1/orgs", json!({ "id": "acme", "name": "Acme" }))
        .await;
    let message = server
        .admin()
        .expect_error(
            Method::POST,
            "/v1/orgs/acme/api-keys",
            Some(json!({ "role": "viewer", "permissions": ["provider.read"] })),
            StatusCode::BAD_REQUEST,
            "INVALID_INPUT",
        )
        .await;
    assert!(message.starts_with("permissions:"), "{message}");
    let (status, body) = server
        .admin()
        .post("/v1/orgs/acme/api-keys", json!({ "role": "superuser" }))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(
        server.admin().get("/v1/orgs/acme/api-keys").await.1,
        json!({ "items": [] })
    );
}

async fn legacy_vl_keys_still_authenticate(db: Db) {
    let server = Server::start(db).await;
    server
        .admin()
        .post("/v1/orgs", json!({ "id": "acme", "name": "Acme" }))
        .await;
    let legacy = "vl_legacy0123456789abcdef";
    let (status, body) = server
        .admin()
        .post(
            "/v1/orgs/acme/api-keys",
            json!({ "role": "viewer", "legacyKey": legacy }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["legacy"], true);
    let (status, org) = server.as_key(legacy).get("/v1/orgs/acme").await;
    assert_eq!(status, StatusCode::OK, "{org}");
    let tenant = server.org_with_key("tenant", "admin").await;
    let (status, body) = tenant
        .post(
            "/v1/orgs/tenant/api-keys",
            json!({ "role": "viewer", "legacyKey": "vl_legacy0123456789zzzzzz" }),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
}

async fn keys_of_another_org_are_not_found(db: Db) {
    let server = Server::start(db).await;
    let a = server.org_with_key("tenant-a", "admin").await;
    server.org_with_key("tenant-b", "admin").await;
    let (_, b_keys) = server.admin().get("/v1/orgs/tenant-b/api-keys").await;
    let b_key = b_keys["items"][0]["id"].as_str().unwrap();
    for (method, path) in [
        (Method::GET, "/v1/orgs/tenant-b/api-keys".to_string()),
        (Method::POST, "/v1/orgs/tenant-b/api-keys".to_string()),
        (
            Method::DELETE,
            format!("/v1/orgs/tenant-b/api-keys/{b_key}"),
        ),
    ] {
        let body = (method == Method::POST).then(|| json!({ "role": "viewer" }));
        a.expect_error(method, &path, body, StatusCode::NOT_FOUND, "NOT_FOUND")
            .await;
    }
    let (_, b_keys_after) = server.admin().get("/v1/orgs/tenant-b/api-keys").await;
    assert_eq!(b_keys, b_keys_after, "nothing changed in tenant-b");
}
