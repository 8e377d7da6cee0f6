//! The placer examples in Python (`examples/placer-python`, componentize-py) and JavaScript
//! (`examples/placer-js`, jco with QuickJS), built from source by
//! `examples/build-components.sh`, uploaded to a real server and assigned to a pool: where
//! the built-in placer packs consecutive single GPUs onto one node, the example spreads
//! them, and each placement names the plugin that made it.
//!
//! The script installs its pinned toolchains under `target/examples/toolchains/` and
//! reuses a component while its sources and `wit/` are unchanged. A machine that cannot
//! install them (no python3 or node, no network to PyPI or npm) fails these tests with the
//! script's reason; they never skip.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Api, Db, Server, on_both_databases, pools_for_tenant_a, register_node};

on_both_databases!(
    the_python_example_spreads_what_the_default_packs,
    the_javascript_example_spreads_what_the_default_packs,
);

async fn the_python_example_spreads_what_the_default_packs(db: Db) {
    spreads_what_the_default_packs(db, "python", "spread-python").await;
}

async fn the_javascript_example_spreads_what_the_default_packs(db: Db) {
    spreads_what_the_default_packs(db, "js", "spread-js").await;
}

/// The component of `language` (`python` or `js`), built or reused by
/// `examples/build-components.sh` once per test run; both databases' runs of a test share
/// it. A build that fails panics with the script's own reason in every test that needs it.
async fn example(language: &'static str) -> Vec<u8> {
    static BUILT: OnceLock<Mutex<HashMap<&'static str, Result<PathBuf, String>>>> = OnceLock::new();
    let path = tokio::task::spawn_blocking(move || {
        let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
        built
            .entry(language)
            .or_insert_with(|| build(language))
            .clone()
    })
    .await
    .unwrap()
    .unwrap_or_else(|reason| panic!("{reason}"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn build(language: &str) -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let script = root.join("examples/build-components.sh");
    let started = Instant::now();
    let output = std::process::Command::new("bash")
        .arg(&script)
        .arg(language)
        .current_dir(root)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "examples/build-components.sh {language} could not build the {language} example \
             ({}); this test needs its toolchain (python3 3.11+ with venv and pip for \
             Python, node 20+ with npm for JavaScript) and network access to PyPI and npm \
             the first time:\n{stderr}",
            output.status
        ));
    }
    let path = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .map(PathBuf::from)
        .ok_or_else(|| format!("examples/build-components.sh {language} named no component"))?;
    eprintln!(
        "examples/build-components.sh {language}: {} in {:.1} s\n{stderr}",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(path)
}

/// A provider with four 8-GPU nodes in two pools of two (`n1`, `n2` and `n3`, `n4`), both
/// offered to `tenant-a`; the first keeps the built-in placer.
struct Pools {
    server: Server,
    tenant: Api,
    packed: String,
    spread: String,
}

async fn pools(db: Db) -> Pools {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    for n in 1..=4 {
        register_node(&provider, "acme", &format!("n{n}"), 8).await;
    }
    let tenant = server.org_with_key("tenant-a", "member").await;
    let ids = pools_for_tenant_a(&server, &[&["n1", "n2"], &["n3", "n4"]]).await;
    Pools {
        server,
        tenant,
        packed: ids[0].clone(),
        spread: ids[1].clone(),
    }
}

impl Pools {
    /// Books one GPU for two hours in `pool`; answers the placement.
    async fn one_gpu(&self, pool: &str, key: &str) -> Value {
        let body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 1 }], "duration": "2h", "idempotencyKey": key });
        let (status, r) = self
            .tenant
            .post("/api/compute/reservations/create", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert!(r["placement"]["nodeId"].is_string(), "not placed: {r}");
        r["placement"].clone()
    }

    /// The plugin deciding `pool`'s placements (`effective.placement`).
    async fn placer_of(&self, pool: &str) -> Value {
        let (status, policies) = self
            .server
            .admin()
            .get(&format!("/v1/pools/{pool}/policies"))
            .await;
        assert_eq!(status, StatusCode::OK, "{policies}");
        policies["effective"]["placement"].clone()
    }
}

async fn spreads_what_the_default_packs(db: Db, language: &'static str, name: &'static str) {
    let bytes = example(language).await;
    let w = pools(db).await;

    // The built-in placer packs: the second GPU goes where the first is. Its deadline is as
    // generous as the example's: the other test's server may be compiling on every core.
    let (status, answer) = w
        .server
        .admin()
        .put(
            &format!("/v1/pools/{}/policies", w.packed),
            json!({ "deadlineMs": 2000 }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let builtin = w.placer_of(&w.packed).await;
    assert_eq!(builtin["builtIn"], true, "{builtin}");
    let packed = w.one_gpu(&w.packed, "packed-1").await;
    let second = w.one_gpu(&w.packed, "packed-2").await;
    assert_eq!(
        second["nodeId"], packed["nodeId"],
        "the default packs: {packed} {second}"
    );
    for placed in [&packed, &second] {
        assert_eq!(placed["placedBy"], builtin["pluginId"], "{placed}");
    }

    // The example, compiled by the server at upload (once per test: see `upload`).
    let plugin = upload(&w.server, name, bytes).await;
    assert_eq!(plugin["world"], "placer", "{plugin}");
    assert_eq!(plugin["name"], name, "{plugin}");
    let id = plugin["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("sha256:"), "{plugin}");
    // An interpreter answers in milliseconds; a generous deadline keeps a busy test
    // machine (another server compiling) from failing the decision.
    let (status, answer) = w
        .server
        .admin()
        .put(
            &format!("/v1/pools/{}/policies", w.spread),
            json!({ "placement": id, "deadlineMs": 2000, "onPolicyFailure": "fail" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let decider = w.placer_of(&w.spread).await;
    assert_eq!(decider["pluginId"], json!(id), "{decider}");
    assert_eq!(decider["name"], name, "{decider}");
    assert_eq!(decider["builtIn"], false, "{decider}");

    // The example spreads: each GPU goes to the node with the fewest busy units.
    let first = w.one_gpu(&w.spread, "spread-1").await;
    let second = w.one_gpu(&w.spread, "spread-2").await;
    assert_ne!(
        second["nodeId"], first["nodeId"],
        "{name} spreads: {first} {second}"
    );
    let third = w.one_gpu(&w.spread, "spread-3").await;
    let fourth = w.one_gpu(&w.spread, "spread-4").await;
    assert_ne!(
        fourth["nodeId"], third["nodeId"],
        "{name} keeps spreading: {third} {fourth}"
    );
    for placed in [&first, &second, &third, &fourth] {
        assert_eq!(
            placed["placedBy"],
            json!(id),
            "the plugin made the decision: {placed}"
        );
        assert_eq!(
            placed["unitIds"].as_array().map(Vec::len),
            Some(1),
            "{placed}"
        );
    }

    // The other pool still packs, with the built-in.
    let third = w.one_gpu(&w.packed, "packed-3").await;
    assert_eq!(third["nodeId"], packed["nodeId"], "{packed} {third}");
    assert_eq!(third["placedBy"], builtin["pluginId"], "{third}");
}

/// What one run's server compiled of an example: the file name in `<data-dir>/plugins/` and
/// its bytes.
type Compiled = Option<(String, Vec<u8>)>;

/// Each example's [`Compiled`], by plugin name, behind a lock its upload holds.
type Slots = Mutex<HashMap<&'static str, Arc<tokio::sync::Mutex<Compiled>>>>;

/// Uploads the example `bytes` as `name`, version `1.0.0`, expecting `201 Created`.
///
/// Compiling the Python example takes the server tens of seconds. The first of a test's two
/// runs (SQLite, PostgreSQL) to get here uploads while the other waits, and hands it the
/// precompiled artifact the server wrote to its data directory; the other run puts it in
/// its own server's data directory before uploading, where the server finds it as after a
/// restart (an artifact it cannot load is recompiled). So each test compiles its example
/// once, and each server still validates and stores the upload.
async fn upload(server: &Server, name: &'static str, bytes: Vec<u8>) -> Value {
    static COMPILED: OnceLock<Slots> = OnceLock::new();
    let slot = COMPILED
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(name)
        .or_default()
        .clone();
    let mut compiled = slot.lock().await;
    let cache = server.data_dir.path().join("plugins");
    if let Some((file, artifact)) = compiled.as_ref() {
        std::fs::write(cache.join(file), artifact).unwrap();
    }
    let started = Instant::now();
    let (status, plugin) = server
        .admin()
        .raw(
            Method::POST,
            &format!("/v1/plugins?name={name}&version=1.0.0"),
            Some(bytes),
            Some("application/wasm"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{plugin}");
    eprintln!(
        "{name}: uploaded in {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        if compiled.is_some() {
            "precompiled by the other run"
        } else {
            "compiled"
        }
    );
    if compiled.is_none() {
        let id = plugin["id"].as_str().unwrap_or_default();
        let file = format!("{}.cwasm", id.trim_start_matches("sha256:"));
        if let Ok(artifact) = std::fs::read(cache.join(&file)) {
            *compiled = Some((file, artifact));
        }
    }
    plugin
}
