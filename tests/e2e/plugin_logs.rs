//! The last log lines of each plugin, kept in memory by the server that ran its decisions:
//! `GET /v1/plugins/{id}/logs` and `orl plugins logs`.

use reqwest::StatusCode;
use serde_json::Value;

use crate::plugins::world;
use crate::support::{Db, Server, assert_error, list_params, on_both_databases, pages};

on_both_databases!(
    a_plugins_log_lines_are_read_newest_first_within_the_caps,
    a_plugins_log_lines_are_shown_only_to_platform_operators,
    the_cli_prints_a_plugins_log_lines,
);

/// Lines one call may keep (the WIT's per-call cap), and the lines `log_flood` writes.
const PER_CALL: usize = 64;
const FLOOD: usize = 10_000;
/// Lines the server keeps per plugin.
const KEPT: usize = 200;

fn messages(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap_or_else(|| panic!("no items: {page}"))
        .iter()
        .map(|l| l["message"].as_str().unwrap().to_string())
        .collect()
}

/// `log_flood` assigned to the world's pool, deciding `creates` times.
async fn flooded(db: Db, creates: usize) -> (crate::plugins::World, String) {
    let w = world(db).await;
    let flood = w.upload("log_flood.wasm").await;
    w.assign(
        &w.pool,
        serde_json::json!({ "placement": flood["id"], "deadlineMs": 5000 }),
    )
    .await;
    for i in 0..creates {
        let (status, placed) = w.create(&w.pool, &format!("flood-{i}"), 1).await;
        assert_eq!(
            (status, placed["state"].as_str()),
            (StatusCode::OK, Some("placed")),
            "{placed}"
        );
    }
    let id = flood["id"].as_str().unwrap().to_string();
    (w, id)
}

fn logs_path(id: &str) -> String {
    format!("/v1/plugins/{}/logs", id.replace(':', "%3A"))
}

async fn a_plugins_log_lines_are_read_newest_first_within_the_caps(db: Db) {
    let (w, id) = flooded(db, 1).await;
    let admin = w.server.admin();
    let path = logs_path(&id);
    let (status, page) = admin.get(&format!("{path}?limit=200")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.get("cursor").is_none(), "one page holds them: {page}");
    let lines = page["items"].as_array().unwrap();
    // The per-call cap kept the first 64 lines; one more line says how many were dropped.
    assert_eq!(lines.len(), PER_CALL + 1, "{page}");
    let dropped = &lines[0];
    assert_eq!(dropped["level"], "warn", "{dropped}");
    let said = dropped["message"].as_str().unwrap();
    assert!(
        said.contains(&format!(
            "{} lines of this call were dropped",
            FLOOD - PER_CALL
        )),
        "{said}"
    );
    let padding = "x".repeat(190);
    for (line, i) in lines[1..].iter().zip((0..PER_CALL).rev()) {
        assert_eq!(line["level"], "info", "{line}");
        assert_eq!(
            line["message"],
            format!("FLOOD {i:05} {padding}"),
            "newest first"
        );
        assert_eq!(line["at"], "2026-12-01T00:00:00.000Z", "the server's clock");
        assert!(
            line["replica"].as_str().unwrap().starts_with("rep_"),
            "{line}"
        );
    }
    let ids: Vec<u64> = lines
        .iter()
        .map(|l| l["id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|p| p[0] > p[1]), "{ids:?}");

    // By default, a page of 50.
    let (_, first) = admin.get(&path).await;
    assert_eq!(first["items"].as_array().unwrap().len(), 50, "{first}");
    assert_eq!(first["cursor"], first["items"][49]["id"]);

    // More decisions: only the last 200 lines are kept, paged by the one cursor scheme.
    for i in 1..4 {
        let (status, placed) = w.create(&w.pool, &format!("flood-{i}"), 1).await;
        assert_eq!(status, StatusCode::OK, "{placed}");
    }
    let every = pages(&admin, &path, 70, "id").await;
    assert_eq!(
        every.iter().map(Vec::len).collect::<Vec<_>>(),
        [70, 70, 60],
        "{every:?}"
    );
    let (_, newest) = admin.get(&format!("{path}?limit=200")).await;
    let kept = messages(&newest);
    assert_eq!(kept.len(), KEPT);
    assert_eq!(every.concat().len(), KEPT);
    assert!(kept[0].contains("were dropped"), "{}", kept[0]);
    assert_eq!(kept[1], format!("FLOOD {:05} {padding}", PER_CALL - 1));
    assert_eq!(
        kept.iter().filter(|m| m.contains("were dropped")).count(),
        4,
        "one per call: 4 x 65 lines written, the oldest 60 dropped"
    );

    // The limit and the cursor are checked like every list's.
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=ten", "limit"),
        ("cursor=abc", "cursor"),
        ("cursor=", "cursor"),
        ("page=2", "page"),
    ] {
        let (status, err) = admin.get(&format!("{path}?{query}")).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(err["error"]["details"]["field"], field, "{query}: {err}");
    }
    let params = list_params(&w.server, "/v1/plugins/{id}/logs").await;
    assert_eq!(params, ["id", "limit", "cursor"]);
    let (_, doc) = w.server.anonymous().get("/openapi.json").await;
    let operation = &doc["paths"]["/v1/plugins/{id}/logs"]["get"];
    let limit = &operation["parameters"][1]["schema"];
    assert_eq!(
        (&limit["minimum"], &limit["maximum"]),
        (&1.into(), &200.into())
    );
    assert!(
        operation["description"]
            .as_str()
            .is_some_and(|d| d.contains("in memory") && d.contains("restart")),
        "{operation}"
    );
}

async fn a_plugins_log_lines_are_shown_only_to_platform_operators(db: Db) {
    let (w, id) = flooded(db, 1).await;
    let path = logs_path(&id);
    // Plugins are read with `pools.manage` or `plugins.manage`: a tenant's member and
    // another provider have neither.
    let stranger = w.server.org_with_key("rival", "provider").await;
    for api in [&w.tenant, &stranger] {
        let (status, plugin) = api
            .get(&format!("/v1/plugins/{}", id.replace(':', "%3A")))
            .await;
        assert_error(status, &plugin, StatusCode::NOT_FOUND, "NOT_FOUND");
        let (status, err) = api.get(&path).await;
        assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
        assert!(!err.to_string().contains("FLOOD"), "{err}");
    }
    // The pool's owner manages pools: it reads the plugin, but not its lines, which may
    // describe other orgs' requests.
    let owner = w
        .server
        .key_in("acme", serde_json::json!({ "role": "operator" }))
        .await;
    let owner = w.server.as_key(&owner);
    let (status, plugin) = owner
        .get(&format!("/v1/plugins/{}", id.replace(':', "%3A")))
        .await;
    assert_eq!(status, StatusCode::OK, "{plugin}");
    let (status, err) = owner.get(&path).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    assert!(!err.to_string().contains("FLOOD"), "{err}");
    let (status, logs) = w.server.admin().get(&path).await;
    assert_eq!(status, StatusCode::OK, "{logs}");
    assert_eq!(logs["items"].as_array().unwrap().len(), 50, "{logs}");
    // A plugin nobody stored, and a built-in that logged nothing.
    let (status, err) = w
        .server
        .admin()
        .get(&logs_path(&format!("sha256:{}", "0".repeat(64))))
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (_, plugins) = w.server.admin().get("/v1/plugins").await;
    let built_in = plugins["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["builtIn"] == true && p["world"] == "spend-guard")
        .unwrap_or_else(|| panic!("{plugins}"));
    let built_in = built_in["id"].as_str().unwrap();
    let (status, page) = w.server.admin().get(&logs_path(built_in)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page["items"].is_array(), "{page}");
    let (status, err) = w.tenant.get(&logs_path(built_in)).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}

async fn orl(server: &Server, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(args)
        .env("ORL_URL", &server.url)
        .env("ORL_KEY", &server.admin)
        .output()
        .await
        .unwrap()
}

async fn the_cli_prints_a_plugins_log_lines(db: Db) {
    let (w, id) = flooded(db, 1).await;
    for plugin in ["log-flood", id.as_str()] {
        let output = orl(&w.server, &["plugins", "logs", plugin, "--limit", "3"]).await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{stdout} {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains("were dropped"), "{stdout}");
        assert!(
            stdout.contains("FLOOD 00063") && stdout.contains("FLOOD 00062"),
            "{stdout}"
        );
        assert!(!stdout.contains("FLOOD 00061"), "three lines: {stdout}");
        assert!(stdout.contains("more: --cursor"), "{stdout}");
        assert!(
            stdout.contains("warn") && stdout.contains("info"),
            "{stdout}"
        );
    }
    let output = orl(&w.server, &["--json", "plugins", "logs", "log-flood"]).await;
    let page: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 50, "{page}");
    let output = orl(&w.server, &["plugins", "logs", "no-such-plugin"]).await;
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no plugin named"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let help = orl(&w.server, &["plugins", "logs", "--help"]).await;
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("in memory") && help.contains("--limit"),
        "{help}"
    );
}
