//! Containment that holds for every plugin: the deadline bounds the whole decision (host
//! calls and start functions included), a call's log is capped, compiles happen once per
//! component, decisions never read a plugin's bytes, and components that import or export
//! outside the served interfaces are refused at upload, before anything is compiled.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::plugins::{World, world, world_on};
use crate::support::{Db, Options, Server, T0, assert_error, component, on_both_databases};

on_both_databases!(
    a_plugin_blocked_in_a_host_call_fails_at_its_deadline,
    a_start_function_that_loops_is_stopped_at_its_deadline,
    ten_concurrent_uploads_of_the_same_bytes_compile_once,
    a_decision_never_reads_the_plugins_bytes,
    foreign_packages_versions_and_imports_are_refused_at_upload_before_compiling,
    drafts_of_creates_that_failed_are_swept_after_a_day,
    a_plugin_call_logs_at_most_its_cap_tagged_with_the_plugins_name,
);

/// `bytes` uploaded as plugin `name`: the status and answer.
async fn upload_bytes(w: &World, name: &str, bytes: Vec<u8>) -> (StatusCode, Value) {
    w.server
        .admin()
        .raw(
            Method::POST,
            &format!("/v1/plugins?name={name}&version=1.0.0"),
            Some(bytes),
            Some("application/wasm"),
        )
        .await
}

/// The server's count of components compiled, from `/metrics`.
async fn compiles(w: &World) -> u64 {
    let metrics = w.server.metrics().await;
    (metrics.get("orl_plugin_compiles_total")).expect("orl_plugin_compiles_total in /metrics")
        as u64
}

/// A create on `pool` that a plugin fails: asserts `POLICY_FAILED` of `kind` and answers
/// how long the create took.
async fn failed_create(w: &World, pool: &str, key: &str, kind: &str) -> Duration {
    let started = Instant::now();
    let (status, err) = w.create(pool, key, 1).await;
    let took = started.elapsed();
    assert_error(status, &err, StatusCode::BAD_GATEWAY, "POLICY_FAILED");
    assert_eq!(err["error"]["details"]["kind"], kind, "{err}");
    took
}

async fn a_plugin_blocked_in_a_host_call_fails_at_its_deadline(db: Db) {
    let w = world(db).await;
    // Sleeps 10 s in `wasi:io/poll` on every call.
    let sleeper = w.upload("sleep_forever.wasm").await;
    w.assign(
        &w.pool,
        json!({ "placement": sleeper["id"], "deadlineMs": 200 }),
    )
    .await;
    for key in ["asleep-1", "asleep-2"] {
        let took = failed_create(&w, &w.pool, key, "deadline").await;
        assert!(
            took < Duration::from_millis(1_500),
            "a 200 ms deadline answered after {took:?}"
        );
    }
    // The other pool keeps placing meanwhile.
    let (status, ok) = w.create(&w.other_pool, "other", 1).await;
    assert_eq!(
        (status, ok["state"].as_str()),
        (StatusCode::OK, Some("placed")),
        "{ok}"
    );
}

/// A placer component whose core module's start function never returns: `place` is never
/// reached, only instantiation runs it.
fn looping_start_function() -> Vec<u8> {
    let (mut resolve, placer) = policy_wit(|wit| wit);
    let _ = &mut resolve;
    let mut module = wat::parse_str(
        r#"(module
             (memory (export "memory") 1)
             (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
             (func (export "place") (param i32) (result i32) unreachable)
             (func $spin (loop $forever (br $forever)))
             (start $spin))"#,
    )
    .unwrap();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        placer,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    encode(&module)
}

async fn a_start_function_that_loops_is_stopped_at_its_deadline(db: Db) {
    let w = world(db).await;
    let (status, plugin) = upload_bytes(&w, "spin-at-start", looping_start_function()).await;
    assert_eq!(status, StatusCode::CREATED, "{plugin}");
    w.assign(
        &w.pool,
        json!({ "placement": plugin["id"], "deadlineMs": 300 }),
    )
    .await;
    let took = failed_create(&w, &w.pool, "spin", "deadline").await;
    assert!(
        took < Duration::from_millis(300 + 900),
        "a 300 ms deadline answered after {took:?}"
    );
}

async fn ten_concurrent_uploads_of_the_same_bytes_compile_once(db: Db) {
    let w = world(db).await;
    let bytes = std::fs::read(component("read_config.wasm")).unwrap();
    let before = compiles(&w).await;
    let uploads: Vec<_> = (0..10)
        .map(|_| {
            let (admin, bytes) = (w.server.admin(), bytes.clone());
            tokio::spawn(async move {
                admin
                    .raw(
                        Method::POST,
                        "/v1/plugins?name=read-config&version=1.0.0",
                        Some(bytes),
                        Some("application/wasm"),
                    )
                    .await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    let mut ids = Vec::new();
    for upload in uploads {
        let (status, plugin) = upload.await.unwrap();
        statuses.push(status);
        ids.push(plugin["id"].clone());
    }
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "one upload stores it, the others find it: {statuses:?}"
    );
    assert!(statuses.iter().all(|s| s.is_success()), "{statuses:?}");
    assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
    assert_eq!(compiles(&w).await - before, 1, "compiled once");
    // The same bytes under another name are the stored plugin, not a second one.
    let (status, err) = upload_bytes(&w, "another-name", bytes).await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(err["error"]["details"]["pluginId"], ids[0], "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("read-config"),
        "{err}"
    );
    assert_eq!(compiles(&w).await - before, 1);
}

async fn a_decision_never_reads_the_plugins_bytes(db: Db) {
    let w = world(db).await;
    let spread = w.upload("orl_placer_spread.wasm").await;
    w.assign(&w.pool, json!({ "placement": spread["id"] }))
        .await;
    let (_, placed) = w.create(&w.pool, "before", 1).await;
    assert_eq!(placed["placement"]["placedBy"], spread["id"], "{placed}");
    // The stored bytes are no component any more: a decision that read (or hashed) them
    // could not run the plugin.
    let mut conn = w.server.database().await;
    sqlx::query("UPDATE plugins SET bytes = $1 WHERE id = $2")
        .bind(b"not the plugin".to_vec())
        .bind(spread["id"].as_str().unwrap())
        .execute(&mut conn)
        .await
        .unwrap();
    // A new assignment (a new settings version) resolves the plugin again.
    w.assign(
        &w.pool,
        json!({ "placement": spread["id"], "config": { "after": true } }),
    )
    .await;
    for key in ["after-1", "after-2"] {
        let (status, placed) = w.create(&w.pool, key, 1).await;
        assert_eq!(status, StatusCode::OK, "{placed}");
        assert_eq!(placed["placement"]["placedBy"], spread["id"], "{placed}");
    }
}

/// `wit/policy.wit` as `edit` rewrites it, parsed with a stand-in `wasi:http` package; and
/// its `placer` world.
fn policy_wit(edit: impl FnOnce(String) -> String) -> (wit_parser::Resolve, wit_parser::WorldId) {
    policy_wit_at("policy.wit", edit)
}

/// [`policy_wit`] of `file` under `wit/` (`v0.1/policy.wit` for the older package).
fn policy_wit_at(
    file: &str,
    edit: impl FnOnce(String) -> String,
) -> (wit_parser::Resolve, wit_parser::WorldId) {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../wit")
            .join(file),
    )
    .unwrap();
    let mut resolve = wit_parser::Resolve::default();
    resolve
        .push_str(
            "http.wit",
            "package wasi:http@0.2.0;\ninterface outgoing-handler { handle: func(request: u32) -> u32; }\n",
        )
        .unwrap();
    let package = resolve.push_str("policy.wit", &edit(text)).unwrap();
    let world = resolve.select_world(&[package], Some("placer")).unwrap();
    (resolve, world)
}

/// A component of the `placer` world of `wit/policy.wit` as `edit` rewrites it: every
/// function a stub.
fn placer_component(edit: impl FnOnce(String) -> String) -> Vec<u8> {
    placer_component_at("policy.wit", edit)
}

/// [`placer_component`] of `file` under `wit/`.
fn placer_component_at(file: &str, edit: impl FnOnce(String) -> String) -> Vec<u8> {
    let (resolve, world) = policy_wit_at(file, edit);
    let mangling = wit_parser::ManglingAndAbi::Legacy(wit_parser::LiftLowerAbi::Sync);
    let mut module = wit_component::dummy_module(&resolve, world, mangling);
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .unwrap();
    encode(&module)
}

fn encode(module: &[u8]) -> Vec<u8> {
    wit_component::ComponentEncoder::default()
        .validate(true)
        .module(module)
        .unwrap()
        .encode()
        .unwrap()
}

async fn foreign_packages_versions_and_imports_are_refused_at_upload_before_compiling(db: Db) {
    let w = world(db).await;
    let before = compiles(&w).await;
    // The same world as served, for contrast: accepted.
    let served = placer_component(|wit| wit);
    let (status, plugin) = upload_bytes(&w, "stubs", served).await;
    assert_eq!(status, StatusCode::CREATED, "{plugin}");
    assert_eq!(plugin["world"], "placer");
    assert_eq!(plugin["policyVersion"], "orl:policy@0.2.0");
    // And the older package, still served.
    let older = placer_component_at("v0.1/policy.wit", |wit| wit);
    let (status, plugin) = upload_bytes(&w, "stubs-0-1", older).await;
    assert_eq!(status, StatusCode::CREATED, "{plugin}");
    assert_eq!(plugin["policyVersion"], "orl:policy@0.1.0");
    let compiled = compiles(&w).await;
    assert_eq!(compiled - before, 2);
    for (name, edit, named) in [
        (
            "foreign-package",
            Box::new(|wit: String| {
                wit.replace("package orl:policy@0.2.0;", "package acme:policy@0.2.0;")
            }) as Box<dyn FnOnce(String) -> String>,
            "`acme:policy/",
        ),
        (
            "wrong-version",
            Box::new(|wit: String| {
                wit.replace("package orl:policy@0.2.0;", "package orl:policy@0.3.0;")
            }),
            "@0.3.0`",
        ),
        (
            "wants-http",
            Box::new(|wit: String| {
                wit.replace(
                    "world placer {\n    import log;",
                    "world placer {\n    import log;\n    import wasi:http/outgoing-handler@0.2.0;",
                )
            }),
            "wasi:http/outgoing-handler@0.2.0",
        ),
    ] {
        let (status, err) = upload_bytes(&w, name, placer_component(edit)).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        let message = err["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{name}: {message}");
        assert_eq!(err["error"]["details"]["field"], "body", "{err}");
    }
    assert_eq!(compiles(&w).await, compiled, "nothing refused was compiled");
    let (_, listed) = w.server.admin().get("/v1/plugins").await;
    let names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(names.contains(&"stubs"), "{listed}");
    assert!(
        !names
            .iter()
            .any(|n| ["foreign-package", "wrong-version", "wants-http"].contains(n)),
        "{listed}"
    );
}

async fn a_plugin_call_logs_at_most_its_cap_tagged_with_the_plugins_name(db: Db) {
    // Plugins log at their own levels; the server is asked to write info and above.
    let options = Options {
        env: vec![("ORL_LOG".into(), "info".into())],
        ..Options::default()
    };
    let w = world_on(Server::start_with(db, options).await).await;
    let flood = w.upload("log_flood.wasm").await;
    assert_eq!(flood["name"], "log-flood");
    w.assign(
        &w.pool,
        json!({ "placement": flood["id"], "deadlineMs": 5000 }),
    )
    .await;
    let (status, placed) = w.create(&w.pool, "flood", 1).await;
    assert_eq!(
        (status, placed["state"].as_str()),
        (StatusCode::OK, Some("placed")),
        "{placed}"
    );
    let stderr = w.server.stderr();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("FLOOD ")).collect();
    assert!(
        !lines.is_empty() && lines.len() <= 64,
        "{} of 10,000 lines written",
        lines.len()
    );
    assert!(
        lines.iter().all(|l| l.contains("log-flood")),
        "every line names the plugin: {}",
        lines[0]
    );
    let dropped = stderr
        .lines()
        .find(|l| l.contains("past its cap"))
        .unwrap_or_else(|| panic!("no line says lines were dropped"));
    assert!(
        dropped.contains("log-flood") && dropped.contains(&(10_000 - lines.len()).to_string()),
        "{dropped}"
    );
}

async fn drafts_of_creates_that_failed_are_swept_after_a_day(db: Db) {
    let w = world(db).await;
    let trap = w.upload("trap.wasm").await;
    w.assign(&w.pool, json!({ "placement": trap["id"] })).await;
    failed_create(&w, &w.pool, "failed", "trap").await;
    let drafts = || async {
        let mut conn = w.server.database().await;
        sqlx::query_scalar::<_, String>(
            "SELECT idempotency_key FROM compute_reservations WHERE state = 'draft'",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap()
    };
    assert_eq!(
        drafts().await,
        vec!["failed".to_string()],
        "a retry may find it"
    );
    let hour = 60 * 60 * 1000;
    w.server.set_clock(T0 + 23 * hour).await;
    assert_eq!(drafts().await.len(), 1, "kept for a day");
    w.server.set_clock(T0 + 24 * hour + 60_000).await;
    assert_eq!(drafts().await, Vec::<String>::new(), "swept after a day");
    let (_, audit) = w.server.admin().get("/v1/audit?limit=200").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "compute-reservation.draft-swept"),
        "{audit}"
    );
    // A create with the same key starts afresh.
    w.assign(&w.pool, json!({})).await;
    let (status, placed) = w.create(&w.pool, "failed", 1).await;
    assert_eq!(
        (status, placed["state"].as_str()),
        (StatusCode::OK, Some("placed")),
        "{placed}"
    );
}
