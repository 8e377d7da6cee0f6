use std::os::unix::fs::PermissionsExt as _;

use reqwest::StatusCode;

use crate::support::{Db, Options, Server, on_both_databases, random_key};

on_both_databases!(
    bootstrap_uses_the_admin_key_from_the_environment,
    bootstrap_without_a_key_generates_one_printed_once_and_saved_0600,
    restart_on_a_non_empty_database_changes_nothing,
    sigterm_stops_the_server_cleanly,
    sigterm_lets_a_request_in_flight_finish,
);

async fn bootstrap_uses_the_admin_key_from_the_environment(db: Db) {
    let key = random_key();
    let server = Server::start_with(
        db,
        Options {
            admin_key: Some(key.clone()),
            demo: false,
            ..Options::default()
        },
    )
    .await;
    let (status, org) = server.as_key(&key).get("/v1/orgs/ops").await;
    assert_eq!(status, StatusCode::OK, "{org}");
    assert_eq!(org["id"], "ops");
    assert!(
        !server.data_dir.path().join("admin.key").exists(),
        "a given key is not written out"
    );
    assert!(
        !server.stderr().contains(&key),
        "a given key is not printed"
    );
}

async fn bootstrap_without_a_key_generates_one_printed_once_and_saved_0600(db: Db) {
    let mut server = Server::start_with(
        db,
        Options {
            admin_key: None,
            demo: false,
            ..Options::default()
        },
    )
    .await;
    let path = server.data_dir.path().join("admin.key");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(server.admin.starts_with("or_"));
    assert_eq!(
        server.stderr().matches(&server.admin).count(),
        1,
        "printed once to stderr"
    );
    let (status, _) = server.admin().get("/v1/orgs/ops").await;
    assert_eq!(status, StatusCode::OK);

    server
        .restart_with(Options {
            admin_key: None,
            demo: false,
            ..Options::default()
        })
        .await;
    assert_eq!(
        server.stderr().matches(&server.admin).count(),
        1,
        "not printed again on restart"
    );
    let (status, _) = server.admin().get("/v1/orgs/ops").await;
    assert_eq!(status, StatusCode::OK);
}

async fn restart_on_a_non_empty_database_changes_nothing(db: Db) {
    let mut server = Server::start(db).await;
    let first_admin = server.admin.clone();
    let (_, keys_before) = server.admin().get("/v1/orgs/ops/api-keys").await;
    let audit_before = crate::support::audit_count(&server).await;

    let other = random_key();
    server
        .restart_with(Options {
            admin_key: Some(other.clone()),
            demo: false,
            ..Options::default()
        })
        .await;
    let (status, _) = server.as_key(&other).get("/v1/orgs/ops").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a new ORL_ADMIN_KEY is ignored once bootstrapped"
    );
    let (status, keys_after) = server
        .as_key(&first_admin)
        .get("/v1/orgs/ops/api-keys")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys_before, keys_after);
    assert_eq!(crate::support::audit_count(&server).await, audit_before);
}

async fn sigterm_stops_the_server_cleanly(db: Db) {
    let mut server = Server::start(db).await;
    crate::support::register_node(
        &server.org_with_key("acme", "provider").await,
        "acme",
        "n1",
        8,
    )
    .await;
    assert!(server.stop().await, "exit status 0 after SIGTERM");
}

/// A create waiting for capacity (`wait.timeoutMs`) when SIGTERM arrives still gets its
/// answer, and the server then exits cleanly.
async fn sigterm_lets_a_request_in_flight_finish(db: Db) {
    let mut f = crate::races::fleet(db, 1, 64, serde_json::json!({})).await;
    let full = f.create(0, f.ask("k-full", 8, None)).await;
    assert_eq!(full["state"], "placed", "{full}");
    let mut waiting = f.ask("k-wait", 1, None);
    waiting["wait"] = serde_json::json!({ "timeoutMs": 2000 });
    let tenant = f.tenant(0);
    let in_flight =
        tokio::spawn(async move { crate::races::rpc(&tenant, "create", waiting).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!in_flight.is_finished(), "the create waits for capacity");
    for server in f.servers.iter_mut().rev() {
        assert!(server.stop().await, "exit status 0 after SIGTERM");
    }
    let (status, answer) = in_flight.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["state"], "pending", "{answer}");
}
