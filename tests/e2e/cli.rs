//! The `orl` client commands against a live server.

use serde_json::Value;

use crate::support::{Db, Server, h100_inventory, on_both_databases};

/// Runs `orl args…` as `key` against `server`; returns stdout, or panics with stderr.
async fn orl(server: &Server, key: &str, args: &[&str]) -> String {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(args)
        .env("ORL_URL", &server.url)
        .env("ORL_KEY", key)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "orl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

async fn orl_json(server: &Server, key: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&orl(server, key, &all).await).unwrap()
}

on_both_databases!(
    the_cli_reserves_and_releases_units_as_in_the_seed,
    cli_errors_show_the_api_error
);

async fn the_cli_reserves_and_releases_units_as_in_the_seed(db: Db) {
    let server = Server::start(db).await;
    let admin = server.admin.clone();
    orl(
        &server,
        &admin,
        &["orgs", "create", "acme", "--name", "Acme"],
    )
    .await;
    orl(
        &server,
        &admin,
        &["orgs", "create", "tenant-a", "--name", "Tenant A"],
    )
    .await;
    let provider = orl_json(
        &server,
        &admin,
        &["keys", "create", "acme", "--role", "provider"],
    )
    .await;
    let provider = provider["key"].as_str().unwrap().to_string();
    let file = server.data_dir.path().join("n1.json");
    std::fs::write(&file, h100_inventory("n1", 8).to_string()).unwrap();
    let node = orl_json(
        &server,
        &provider,
        &[
            "nodes",
            "put",
            "acme",
            "n1",
            "--file",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(node["topologyGen"], 1);
    let table = orl(&server, &provider, &["nodes", "list", "acme"]).await;
    assert!(
        table.contains("n1") && table.contains("topologyGen"),
        "{table}"
    );

    let created = orl_json(
        &server,
        &admin,
        &[
            "reservations",
            "create",
            "n1",
            "--unit-ids",
            "n1-gpu0,n1-gpu1",
            "--allowed-org-ids",
            "tenant-a",
            "--reason",
            "pilot",
        ],
    )
    .await;
    let id = created["id"].as_str().unwrap();
    let released = orl_json(
        &server,
        &provider,
        &[
            "reservations",
            "unit",
            "release",
            "n1",
            id,
            "--unit-ids",
            "n1-gpu1",
        ],
    )
    .await;
    assert_eq!(released["releasedUnitIds"], serde_json::json!(["n1-gpu1"]));
    let listed = orl(&server, &provider, &["reservations", "list", "n1"]).await;
    assert!(listed.contains(id) && listed.contains("active"), "{listed}");
    let catalog = orl(&server, &admin, &["catalog", "tenant-a"]).await;
    assert!(
        catalog.contains("n1-gpu0") && catalog.contains("reserved"),
        "{catalog}"
    );
    let ended = orl_json(
        &server,
        &admin,
        &["reservations", "end", "n1", id, "--reason", "pilot over"],
    )
    .await;
    assert_eq!(ended["status"], "cancelled");
}

async fn cli_errors_show_the_api_error(db: Db) {
    let server = Server::start(db).await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(["nodes", "get", "nope"])
        .env("ORL_URL", &server.url)
        .env("ORL_KEY", &server.admin)
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("404 NOT_FOUND: node nope not found"),
        "{stderr}"
    );
}
