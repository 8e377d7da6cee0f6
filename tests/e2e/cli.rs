//! The `orl` client commands against a live server.

use std::process::{Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::support::{
    Db, HOUR, Options, Server, T0, component, h100_inventory, on_both_databases, random_key,
};

/// Runs `orl args…` as `key` against `server`, whatever its outcome.
async fn run_orl(server: &Server, key: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(args)
        .env("ORL_URL", &server.url)
        .env("ORL_KEY", key)
        .output()
        .await
        .unwrap()
}

/// Runs `orl args…` as `key` against `server`; returns stdout, or panics with stderr.
async fn orl(server: &Server, key: &str, args: &[&str]) -> String {
    let output = run_orl(server, key, args).await;
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

/// A command line as arguments, split at whitespace.
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// Runs `orl args…`, expecting it to fail; returns stderr.
async fn orl_fails(server: &Server, key: &str, args: &[&str]) -> String {
    let output = run_orl(server, key, args).await;
    assert!(
        !output.status.success(),
        "orl {args:?} succeeded: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stderr).unwrap()
}

on_both_databases!(
    the_cli_reserves_and_releases_units_as_in_the_seed,
    cli_errors_show_the_api_error,
    the_cli_pools_offers_and_books_compute_through_its_lifecycle,
    the_cli_sets_a_cedar_policy_and_a_person_confirms_an_agents_request,
    the_cli_takes_a_url_without_a_scheme_and_says_when_no_server_answers,
    the_cli_uploads_lists_gets_and_deletes_a_plugin,
    setting_one_pool_policy_from_the_cli_keeps_the_others,
    the_cli_builds_a_request_from_its_flags_and_takes_a_pool_by_name,
    a_policy_printed_by_get_sets_back_unchanged,
    policy_get_with_json_or_field_prints_the_answer_alone,
);

async fn the_cli_takes_a_url_without_a_scheme_and_says_when_no_server_answers(db: Db) {
    let server = Server::start(db).await;
    let bare = server.url.trim_start_matches("http://").to_string();
    let run = |url: String| {
        let admin = server.admin.clone();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
                .args(["orgs", "get", "ops"])
                .env("ORL_URL", url)
                .env("ORL_KEY", admin)
                .output()
                .await
                .unwrap()
        }
    };
    let output = run(bare).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("ops"));

    // Nothing listens on port 1.
    let output = run("127.0.0.1:1".to_string()).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stderr.trim(),
        "orl: cannot reach the orl server at http://127.0.0.1:1 (is it running? set --url or ORL_URL)"
    );
}

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
    let reclaim = format!("reservations unit reclaim n1 {id} --unit-ids n1-gpu1");
    let dry = orl_json(&server, &provider, &words(&format!("{reclaim} --dry-run"))).await;
    assert_eq!(
        (&dry["wouldTerminate"], &dry["releasedUnitIds"]),
        (&json!([]), &json!(["n1-gpu1"]))
    );
    let reclaimed = orl_json(&server, &provider, &words(&reclaim)).await;
    assert_eq!(
        (&reclaimed["terminated"], &reclaimed["releasedUnitIds"]),
        (&json!([]), &json!([]))
    );
    orl_json(
        &server,
        &provider,
        &words(&format!(
            "reservations unit release n1 {id} --unit-ids n1-gpu1"
        )),
    )
    .await;
    let spot = orl_json(
        &server,
        &provider,
        &words("provider spot-workload reclaim n1 --org acme --dry-run"),
    )
    .await;
    assert_eq!(spot, json!({ "terminated": [], "skipped": [] }));
    let listed = orl(&server, &provider, &["reservations", "list", "n1"]).await;
    assert!(listed.contains(id) && listed.contains("active"), "{listed}");
    pool_offered_to_tenant(&server).await;
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

/// Org `acme` with a provider key and node `n1` of 8 H100s, and org `tenant-a` with a
/// member key; returns (provider key, tenant key).
async fn provider_and_tenant(server: &Server) -> (String, String) {
    let admin = &server.admin;
    for (org, name) in [("acme", "Acme"), ("tenant-a", "Tenant-A")] {
        orl(
            server,
            admin,
            &words(&format!("orgs create {org} --name {name}")),
        )
        .await;
    }
    let provider = orl_json(server, admin, &words("keys create acme --role provider")).await;
    let tenant = orl_json(server, admin, &words("keys create tenant-a --role member")).await;
    let file = server.data_dir.path().join("n1.json");
    std::fs::write(&file, h100_inventory("n1", 8).to_string()).unwrap();
    let provider = provider["key"].as_str().unwrap().to_string();
    let put = format!("nodes put acme n1 --file {}", file.display());
    orl(server, &provider, &words(&put)).await;
    (provider, tenant["key"].as_str().unwrap().to_string())
}

/// Pool `h100` of `n1` owned by acme, offered to tenant-a with 8 GPUs; returns its id.
async fn pool_offered_to_tenant(server: &Server) -> String {
    let admin = &server.admin;
    let create = r#"pools create --name h100 --owner acme --node-ids n1 --policy {"budgetCheck":true} --placer pool-lease"#;
    let pool = orl_json(server, admin, &words(create)).await;
    assert_eq!(pool["policy"]["placer"], "pool-lease", "{pool}");
    assert_eq!(pool["policy"]["budgetCheck"], true, "{pool}");
    assert_eq!(pool["nodeIds"], json!(["n1"]));
    let id = pool["id"].as_str().unwrap().to_string();
    let offer = format!(
        "pools offer {id} --tenant tenant-a --quota gpu=8,vcpu=64 --price-per-gpu-hour 250 --budget 1000000"
    );
    let offer = orl_json(server, admin, &words(&offer)).await;
    assert_eq!(offer["quota"], json!({ "gpu": 8, "vcpu": 64 }));
    assert_eq!(offer["pricePerGpuHour"], 250);
    id
}

async fn the_cli_pools_offers_and_books_compute_through_its_lifecycle(db: Db) {
    let server = Server::start(db).await;
    let admin = &server.admin;
    let (_, tenant) = provider_and_tenant(&server).await;
    let tenant = &tenant;
    let pool = pool_offered_to_tenant(&server).await;
    let pools = orl(&server, tenant, &["pools", "list"]).await;
    assert!(
        pools.contains(&pool) && pools.contains("pool-lease"),
        "{pools}"
    );

    let create = format!(
        "compute reservations create --tenant tenant-a --pool {pool} --gpus 4 \
         --model H100-SXM5-80GB --nvlink-all --duration 2h --idempotency-key cli-k1"
    );
    let plan = orl(&server, tenant, &words(&format!("{create} --plan"))).await;
    assert!(
        plan.contains("outcome") && plan.contains("placed") && plan.contains("n1-gpu"),
        "{plan}"
    );
    assert!(plan.contains("4 gpu (used 0 of 8)"), "{plan}");
    let created = orl_json(&server, tenant, &words(&create)).await;
    assert_eq!(created["state"], "placed", "{created}");
    assert_eq!(created["start"], T0);
    assert_eq!(created["end"], T0 + 2 * HOUR);
    assert_eq!(created["placement"]["unitIds"].as_array().unwrap().len(), 4);
    let id = created["id"].as_str().unwrap().to_string();

    // The same key is a replay: the same reservation, nothing charged twice.
    let replay = orl(&server, tenant, &words(&create)).await;
    assert!(
        replay.contains(&id) && replay.contains("placed"),
        "{replay}"
    );
    let offers = orl(&server, admin, &words(&format!("pools offers {pool}"))).await;
    assert!(
        offers.contains("gpu 4/8") && offers.contains("tenant-a"),
        "{offers}"
    );

    // Without --idempotency-key a fresh key is made and printed to stderr.
    let later = format!(
        "--json compute reservations create --tenant tenant-a --pool {pool} --gpus 1 \
         --start 2026-12-02T00:00:00Z --duration 3600"
    );
    let output = run_orl(&server, tenant, &words(&later)).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("idempotency key: cli-"), "{stderr}");
    let later: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(later["start"], T0 + 24 * HOUR);
    assert_eq!(later["end"], T0 + 25 * HOUR);
    let later_id = later["id"].as_str().unwrap();

    // When 8 GPUs could start: after the 4 booked now; quota leaves 3, the budget is ample.
    let search = format!(
        "compute reservations availability --tenant tenant-a --pool {pool} --gpus 8 \
         --duration 1h --from {T0} --to 2026-12-02T00:00:00Z"
    );
    let slots = orl(&server, tenant, &words(&search)).await;
    assert!(
        slots.contains("2026-12-01T02:00:00Z") && slots.contains("n1-gpu7"),
        "{slots}"
    );
    assert!(
        slots.contains("quota refuses: 8 gpu (used 5 of 8)") && slots.contains("budget admits"),
        "{slots}"
    );

    let list = "compute reservations list --tenant tenant-a";
    let listed = orl(&server, tenant, &words(list)).await;
    assert!(
        listed.contains(&id) && listed.contains(later_id),
        "{listed}"
    );
    assert!(
        listed.contains("2026-12-01T02:00:00Z"),
        "ends shown as RFC 3339: {listed}"
    );
    let page = orl_json(&server, tenant, &words(&format!("{list} --limit 1"))).await;
    assert_eq!(page["items"][0]["id"], later_id, "newest first");
    let cursor = page["cursor"].as_str().unwrap();
    let next = format!("{list} --limit 1 --cursor {cursor}");
    let next = orl(&server, tenant, &words(&next)).await;
    assert!(next.contains(&id) && !next.contains("more:"), "{next}");

    let on = |method: &str| format!("compute reservations {method} --tenant tenant-a {id}");
    let extended = orl_json(
        &server,
        tenant,
        &words(&format!("{} --by 1h", on("extend"))),
    )
    .await;
    assert_eq!(extended["extended"], true, "{extended}");
    assert_eq!(extended["reservation"]["end"], T0 + 3 * HOUR);
    let until = format!("{} --until 2026-12-01T03:00:00Z", on("extend"));
    let until = orl(&server, tenant, &words(&until)).await;
    assert!(
        until.contains("not extended"),
        "an end already reached: {until}"
    );
    let stderr = orl_fails(&server, tenant, &words(&on("extend"))).await;
    assert!(
        stderr.contains("--until") && stderr.contains("--by"),
        "{stderr}"
    );

    let fetched = orl_json(&server, tenant, &words(&on("get"))).await;
    assert_eq!(fetched["end"], T0 + 3 * HOUR);
    let stderr = orl_fails(&server, tenant, &words(&on("renew"))).await;
    assert!(
        stderr.contains("409 INVALID_STATE"),
        "no lease to renew: {stderr}"
    );
    let cancel = format!("compute reservations cancel --tenant tenant-a {later_id}");
    let cancelled = orl_json(&server, tenant, &words(&cancel)).await;
    assert_eq!(cancelled["state"], "cancelled");
    let released = orl(&server, tenant, &words(&on("release"))).await;
    assert!(
        released.contains("released") && released.contains("reason: release"),
        "{released}"
    );
    let offers = orl_json(&server, admin, &words(&format!("pools offers {pool}"))).await;
    assert_eq!(
        offers["items"][0]["used"],
        json!({}),
        "quota refunded: {offers}"
    );

    let events = orl(&server, tenant, &["events"]).await;
    for kind in [
        "reservation.placed",
        "reservation.extended",
        "reservation.released",
    ] {
        assert!(events.contains(kind), "{kind} missing: {events}");
    }
    let archived = orl_json(&server, admin, &words(&format!("pools archive {pool}"))).await;
    assert_eq!(archived["archived"], true);
    let create = format!("compute reservations create --tenant tenant-a --pool {pool} --gpus 1");
    let stderr = orl_fails(&server, tenant, &words(&create)).await;
    assert!(
        stderr.contains("404 NOT_FOUND"),
        "an archived pool takes nothing: {stderr}"
    );
}

async fn the_cli_sets_a_cedar_policy_and_a_person_confirms_an_agents_request(db: Db) {
    let server = Server::start(db).await;
    let admin = &server.admin;
    let (_, person) = provider_and_tenant(&server).await;
    let person = &person;
    let pool = pool_offered_to_tenant(&server).await;
    let agent = words("keys create tenant-a --role member --agent");
    let agent = orl_json(&server, admin, &agent).await;
    let agent = agent["key"].as_str().unwrap();
    let file = server.data_dir.path().join("policy.cedar");
    std::fs::write(
        &file,
        r#"permit(principal, action, resource) when { !principal.agent };
permit(principal, action == Orl::Action::"compute:reservations:create", resource)
  when { context.gpuCount <= 2 || context.confirmed };
"#,
    )
    .unwrap();
    let set = format!("iam policy set tenant-a --file {}", file.display());
    orl(&server, admin, &words(&set)).await;
    let shown = orl(&server, admin, &words("iam policy get tenant-a")).await;
    assert!(
        shown.starts_with("permit(") && shown.contains("context.confirmed"),
        "{shown}"
    );

    let create = format!(
        "compute reservations create --tenant tenant-a --pool {pool} --gpus 4 \
         --idempotency-key agent-k1"
    );
    let stderr = orl_fails(&server, agent, &words(&create)).await;
    assert!(stderr.contains("403 CONFIRMATION_REQUIRED"), "{stderr}");
    let list = words("confirmations list tenant-a");
    let pending = orl_json(&server, person, &list).await;
    assert_eq!(pending["items"][0]["state"], "pending", "{pending}");
    let confirmation = pending["items"][0]["id"].as_str().unwrap();
    let table = orl(&server, person, &list).await;
    assert!(
        table.contains(confirmation) && table.contains("gpuCount=4"),
        "{table}"
    );
    let approve = format!("confirmations approve tenant-a {confirmation}");
    let stderr = orl_fails(&server, agent, &words(&approve)).await;
    assert!(
        stderr.contains("403 ACCESS_DENIED"),
        "an agent cannot approve: {stderr}"
    );
    let approved = orl(&server, person, &words(&approve)).await;
    assert!(approved.contains("approved"), "{approved}");
    let placed = orl_json(&server, agent, &words(&create)).await;
    assert_eq!(placed["state"], "placed", "the retry continues: {placed}");

    // With scope all every item is decided as a read, which this policy gives agents none of.
    let list = "compute reservations list --tenant tenant-a --scope all";
    let listed = orl_json(&server, agent, &words(list)).await;
    assert_eq!(listed["items"], json!([]), "{listed}");

    std::fs::write(&file, "").unwrap();
    orl(&server, admin, &words(&set)).await;
    let shown = run_orl(&server, admin, &words("iam policy get tenant-a")).await;
    assert!(
        shown.stdout.is_empty() && String::from_utf8_lossy(&shown.stderr).contains("no policy"),
        "an empty file removes it: {shown:?}"
    );
}

/// Runs `orl args…` with no server and no key; returns its output.
async fn orl_alone(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(args)
        .env_remove("ORL_URL")
        .env_remove("ORL_KEY")
        .env_remove("DATABASE_URL")
        .output()
        .await
        .unwrap()
}

#[tokio::test]
async fn completions_for_every_shell_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = orl_alone(&["completions", shell]).await;
        assert!(
            output.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let script = String::from_utf8(output.stdout).unwrap();
        for word in [
            "serve",
            "compute",
            "plugins",
            "policies",
            "backup",
            "completions",
        ] {
            assert!(script.contains(word), "{shell} script lacks {word}");
        }
    }
    let output = orl_alone(&["completions", "tcsh"]).await;
    assert!(!output.status.success(), "an unknown shell is refused");
}

async fn the_cli_uploads_lists_gets_and_deletes_a_plugin(db: Db) {
    let server = Server::start(db).await;
    let admin = &server.admin;
    provider_and_tenant(&server).await;
    let pool = pool_offered_to_tenant(&server).await;
    let file = component("orl_placer_spread.wasm");
    let file = file.to_str().unwrap();

    let uploaded = orl_json(&server, admin, &["plugins", "upload", file]).await;
    let id = uploaded["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("sha256:"), "{uploaded}");
    assert_eq!(
        (&uploaded["name"], &uploaded["world"], &uploaded["version"]),
        (
            &json!("orl-placer-spread"),
            &json!("placer"),
            &json!("unversioned")
        ),
        "the name comes from the file's: {uploaded}"
    );
    let again = orl_json(&server, admin, &["plugins", "upload", file]).await;
    assert_eq!(
        again, uploaded,
        "the same bytes under the same name are the plugin already stored"
    );
    let renamed = format!("plugins upload {file} --name spread --version 1.2.0");
    let stderr = orl_fails(&server, admin, &words(&renamed)).await;
    assert!(
        stderr.contains("409 CONFLICT"),
        "the same bytes under another name are refused: {stderr}"
    );

    let listed = orl(&server, admin, &["plugins", "list"]).await;
    assert!(
        listed.contains(&id) && listed.contains("orl-placer-spread") && listed.contains("placer"),
        "{listed}"
    );
    let set = format!("pools policies set {pool} --placement {id}");
    orl(&server, admin, &words(&set)).await;
    let got = orl_json(&server, admin, &["plugins", "get", &id]).await;
    assert_eq!(got["assignedTo"], json!([pool]), "{got}");
    let shown = orl(&server, admin, &["plugins", "get", &id]).await;
    assert!(shown.contains(&pool), "{shown}");

    let stderr = orl_fails(&server, admin, &["plugins", "delete", &id]).await;
    assert!(
        stderr.contains("409 CONFLICT"),
        "a plugin in use stays: {stderr}"
    );
    let back = format!("pools policies set {pool} --placement default");
    orl(&server, admin, &words(&back)).await;
    let deleted = orl_json(&server, admin, &["plugins", "delete", &id]).await;
    assert_eq!(deleted, json!({ "deleted": id }));
    let stderr = orl_fails(&server, admin, &["plugins", "get", &id]).await;
    assert!(stderr.contains("404 NOT_FOUND"), "{stderr}");
    let listed = orl_json(&server, admin, &["plugins", "list"]).await;
    let items = listed["items"].as_array().unwrap();
    assert!(
        items.len() == 3 && items.iter().all(|p| p["builtIn"] == true),
        "the built-ins alone: {listed}"
    );
    let table = orl(&server, admin, &["plugins", "list"]).await;
    assert!(
        table.contains("built in") && table.contains("placer-default") && table.contains("yes"),
        "{table}"
    );
    let page = orl(&server, admin, &words("plugins list --limit 2")).await;
    assert!(page.contains("more: --cursor sha256:"), "{page}");

    // A file that is not a component is refused by the server, saying why.
    let junk = server.data_dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not a component").unwrap();
    let stderr = orl_fails(
        &server,
        admin,
        &["plugins", "upload", junk.to_str().unwrap()],
    )
    .await;
    assert!(stderr.contains("400 INVALID_INPUT"), "{stderr}");
}

async fn setting_one_pool_policy_from_the_cli_keeps_the_others(db: Db) {
    let server = Server::start(db).await;
    let admin = &server.admin;
    provider_and_tenant(&server).await;
    let pool = pool_offered_to_tenant(&server).await;
    let mut ids = Vec::new();
    for file in ["orl_placer_spread.wasm", "preempt_oldest.wasm"] {
        let path = component(file);
        let upload = ["plugins", "upload", path.to_str().unwrap()];
        let plugin = orl_json(&server, admin, &upload).await;
        ids.push(plugin["id"].as_str().unwrap().to_string());
    }
    let (placer, preemptor) = (ids[0].clone(), ids[1].clone());
    let get = format!("pools policies get {pool}");
    let shown = orl(&server, admin, &words(&get)).await;
    assert!(
        shown.contains("default (built in)") && shown.contains("50 (default)"),
        "nothing assigned yet: {shown}"
    );

    let config = server.data_dir.path().join("config.json");
    std::fs::write(&config, r#"{"spreadBy": "nvlinkDomain"}"#).unwrap();
    let set = format!(
        "pools policies set {pool} --placement {placer} --deadline-ms 200 \
         --on-policy-failure fallback --config-file {}",
        config.display()
    );
    let first = orl_json(&server, admin, &words(&set)).await;
    assert_eq!(first["placement"], placer.as_str(), "{first}");

    let set = format!("pools policies set {pool} --preemption {preemptor}");
    let second = orl_json(&server, admin, &words(&set)).await;
    let kept = |policies: &Value| {
        (
            policies["deadlineMs"].clone(),
            policies["onPolicyFailure"].clone(),
            policies["config"].clone(),
        )
    };
    let expected = (
        json!(200),
        json!("fallback"),
        json!({ "spreadBy": "nvlinkDomain" }),
    );
    assert_eq!(second["placement"], placer.as_str(), "{second}");
    assert_eq!(second["preemption"], preemptor.as_str(), "{second}");
    assert_eq!(kept(&second), expected, "{second}");

    // What the server stores is what the CLI answered.
    let (status, stored) = server
        .admin()
        .get(&format!("/v1/pools/{pool}/policies"))
        .await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!(stored, second);

    let set = format!("pools policies set {pool} --placement default --no-config");
    let third = orl_json(&server, admin, &words(&set)).await;
    assert_eq!(third.get("placement"), None, "{third}");
    assert_eq!(third.get("config"), None, "{third}");
    assert_eq!(third["preemption"], preemptor.as_str(), "{third}");
    assert_eq!(
        (
            third["deadlineMs"].clone(),
            third["onPolicyFailure"].clone()
        ),
        (json!(200), json!("fallback")),
        "{third}"
    );
    let shown = orl(&server, admin, &words(&get)).await;
    assert!(
        shown.contains("default (built in)")
            && shown.contains(&preemptor)
            && shown.contains("fallback"),
        "{shown}"
    );

    // A refused change changes nothing.
    let set = format!("pools policies set {pool} --spend-guard {placer}");
    let stderr = orl_fails(&server, admin, &words(&set)).await;
    assert!(stderr.contains("400 INVALID_INPUT"), "{stderr}");
    let after = orl_json(&server, admin, &words(&get)).await;
    assert_eq!(after, third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_a_live_sqlite_database_restores_on_a_new_server() {
    let server = Server::start(Db::Sqlite).await;
    let api = server.admin();
    for n in 0..20 {
        let (status, body) = api
            .post(
                "/v1/orgs",
                json!({ "id": format!("before-{n}"), "name": "before" }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    // The server keeps writing while the backup runs.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn({
        let (api, stop) = (api.clone(), stop.clone());
        async move {
            let mut written = 0;
            while !stop.load(Ordering::Relaxed) {
                let org = json!({ "id": format!("during-{written}"), "name": "during" });
                let (status, body) = api.post("/v1/orgs", org).await;
                assert_eq!(status, StatusCode::CREATED, "{body}");
                written += 1;
            }
            written
        }
    });
    let copy_dir = tempfile::tempdir().unwrap();
    let copy = copy_dir.path().join("orl-backup.db");
    let data_dir = server.data_dir.path().to_str().unwrap();
    let copy_arg = copy.to_str().unwrap();
    let output = orl_alone(&["backup", copy_arg, "--data-dir", data_dir]).await;
    stop.store(true, Ordering::Relaxed);
    let written_during = writer.await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("backed up") && stdout.contains(copy_arg),
        "{stdout}"
    );
    assert!(written_during > 0, "the server wrote while the backup ran");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&copy).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the copy holds key hashes");

    // A second backup to the same file is refused and leaves the copy as it was.
    let before = std::fs::read(&copy).unwrap();
    let output = orl_alone(&["backup", copy_arg, "--data-dir", data_dir]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already exists"), "{stderr}");
    assert_eq!(std::fs::read(&copy).unwrap(), before);

    // A server started on the copy has every org written before the backup, and the
    // original admin key works there.
    let mut restored = Server::start(Db::Sqlite).await;
    assert!(restored.stop().await);
    let db = restored.data_dir.path().join("orl.db");
    for companion in ["orl.db-wal", "orl.db-shm"] {
        let _ = std::fs::remove_file(restored.data_dir.path().join(companion));
    }
    std::fs::copy(&copy, &db).unwrap();
    let options = Options {
        admin_key: Some(server.admin.clone()),
        ..Options::default()
    };
    restored.restart_with(options).await;
    let api = restored.as_key(&server.admin);
    for n in 0..20 {
        let (status, org) = api.get(&format!("/v1/orgs/before-{n}")).await;
        assert_eq!(status, StatusCode::OK, "{org}");
        assert_eq!(org["name"], "before");
    }
    let (status, audit) = api.get("/v1/audit?limit=200").await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["objectId"] == "before-19"),
        "{audit}"
    );
    // The restored server takes writes.
    let (status, body) = api
        .post("/v1/orgs", json!({ "id": "after", "name": "after" }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn a_backup_of_postgresql_says_to_use_pg_dump_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("orl.db");
    let url = "postgres://orl@127.0.0.1:5432/orl";
    let target_arg = target.to_str().unwrap();
    let output = orl_alone(&["backup", target_arg, "--database-url", url]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("pg_dump") && stderr.contains("pg_restore"),
        "{stderr}"
    );
    assert!(!target.exists());

    // Nor is an empty database made where none was.
    let missing = dir.path().join("no-data");
    let data_dir = missing.to_str().unwrap();
    let output = orl_alone(&["backup", target_arg, "--data-dir", data_dir]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no database at"), "{stderr}");
    assert!(!target.exists() && !missing.exists());
}

#[tokio::test]
async fn with_orl_log_format_json_every_server_log_line_is_a_json_object() {
    let data_dir = tempfile::tempdir().unwrap();
    let stderr = std::fs::File::create(data_dir.path().join("stderr.log")).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir.path().join("data"))
        .env_remove("DATABASE_URL")
        .env("ORL_ADMIN_KEY", random_key())
        .env("ORL_TEST_CLOCK_MS", T0.to_string())
        .env("ORL_LOG", "info")
        .env("ORL_LOG_FORMAT", "json")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.starts_with("orl listening on ") {
                return;
            }
        }
        panic!("orl exited before listening");
    })
    .await
    .expect("orl starts listening within 60 s");
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("the server stops on SIGTERM")
        .unwrap();
    assert!(status.success());

    let logs = std::fs::read_to_string(data_dir.path().join("stderr.log")).unwrap();
    let lines: Vec<Value> = logs
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    for line in &lines {
        assert!(
            line["timestamp"].is_string()
                && line["level"].is_string()
                && line["target"].is_string(),
            "{line}"
        );
    }
    let messages: Vec<&str> = lines.iter().filter_map(|l| l["message"].as_str()).collect();
    for expected in ["database ready", "stopped"] {
        assert!(messages.contains(&expected), "{expected} missing: {logs}");
    }
    let ready = lines
        .iter()
        .find(|l| l["message"] == "database ready")
        .unwrap();
    assert_eq!(
        (&ready["level"], &ready["backend"]),
        (&json!("INFO"), &json!("Sqlite")),
        "the event's fields are members of the line: {ready}"
    );
}

async fn the_cli_builds_a_request_from_its_flags_and_takes_a_pool_by_name(db: Db) {
    let server = Server::start(db).await;
    let (_, tenant) = provider_and_tenant(&server).await;
    let tenant = &tenant;
    let pool = pool_offered_to_tenant(&server).await;

    // By name wherever an id is taken.
    let got = orl_json(&server, &server.admin, &words("pools get h100")).await;
    assert_eq!(got["id"], pool.as_str());
    let missing = orl_fails(&server, tenant, &words("pools get h200")).await;
    assert!(missing.contains("no pool named \"h200\""), "{missing}");
    // Memory above the pool's per-GPU share is charged to the memoryGiB quota.
    let offer = "pools offer h100 --tenant tenant-a --quota gpu=8,vcpu=64,memoryGiB=1024";
    let offer = orl_json(&server, &server.admin, &words(offer)).await;
    assert_eq!(offer["poolId"], pool.as_str(), "{offer}");

    let create = "compute reservations create --tenant tenant-a --pool h100 --count 2 \
                  --class gpu --model H100-SXM5-80GB --label rack=r9 --label zone=a --nvlink-all \
                  --binding hold --vcpu 40 --memory-gib 64 --hugepages 2 --duration 1h \
                  --idempotency-key flags-1";
    let created = orl_json(&server, tenant, &words(create)).await;
    assert_eq!(created["poolId"], pool.as_str(), "{created}");
    assert_eq!(
        created["request"]["devices"],
        json!([{
            "class": "gpu",
            "count": 2,
            "selector": { "model": "H100-SXM5-80GB", "labels": { "rack": "r9", "zone": "a" } },
            "topology": "nvlink-all",
        }]),
        "{created}"
    );
    assert_eq!(created["request"]["binding"], "hold", "{created}");
    assert_eq!(
        created["request"]["resources"],
        json!({ "vcpu": 40, "memoryGiB": 64, "hugepages1Gi": 2 }),
        "{created}"
    );
    // No unit of n1 carries the labels: it waits, and says which constraint it fails.
    assert_eq!(created["state"], "pending", "{created}");
    let why = created["conditions"].to_string();
    assert!(why.contains("matching the request"), "{why}");

    let gang = "compute reservations create --tenant tenant-a --pool h100 --gpus 1 \
                --gang 2 --topology-key region --duration 1h --idempotency-key flags-2";
    let created = orl_json(&server, tenant, &words(gang)).await;
    assert_eq!(
        created["request"]["gang"],
        json!({ "size": 2, "topologyKey": "region" })
    );
    let listed = orl_json(
        &server,
        tenant,
        &words("compute reservations list --tenant tenant-a --pool h100"),
    )
    .await;
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );

    let refused = orl_fails(
        &server,
        tenant,
        &words("compute reservations create --tenant tenant-a --pool h100 --gpus 1 --label rack"),
    )
    .await;
    assert!(refused.contains("is not key=value"), "{refused}");
}

/// Runs `orl args…` with only `env` of the client's settings: none of the caller's `ORL_`
/// variables, and `HOME` and `XDG_CONFIG_HOME` as `env` gives them (unset otherwise).
async fn orl_with(env: &[(&str, String)], args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_orl"));
    command.args(args);
    for name in [
        "ORL_URL",
        "ORL_KEY",
        "ORL_PROFILE",
        "HOME",
        "XDG_CONFIG_HOME",
    ] {
        command.env_remove(name);
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    command.output().await.unwrap()
}

/// `HOME` set to `home`, and `more`.
fn env_with(home: &str, more: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut env = vec![("HOME", home.to_string())];
    env.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_beats_the_environment_which_beats_the_profile_file() {
    let server = Server::start(Db::Sqlite).await;
    let (status, body) = server
        .admin()
        .post("/v1/orgs", json!({ "id": "tenant-a", "name": "Tenant A" }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let tenant = server.key_in("tenant-a", json!({ "role": "member" })).await;
    let admin = server.admin.as_str();
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().to_str().unwrap();
    let dir = home.path().join(".config/orl");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("admin.key"), format!("{admin}\n")).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!(
            r#"url = "{url}"
key_file = "admin.key"

[profiles.tenant]
key = "{tenant}"

[profiles.elsewhere]
url = "http://127.0.0.1:1"
"#,
            url = server.url
        ),
    )
    .unwrap();
    // Which key called shows in whether it may read the ops org.
    let as_admin = |output: Output| {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "called as the admin: {stderr}");
    };
    let as_tenant = |output: Output| {
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            stderr.contains("404 NOT_FOUND"),
            "called as the tenant: {stderr}"
        );
    };
    let ops = ["orgs", "get", "ops"];
    let with_home = |more: &[(&'static str, &str)]| env_with(home_path, more);

    // The top level of ~/.config/orl/config.toml, its key read from key_file.
    as_admin(orl_with(&with_home(&[]), &ops).await);
    // A named profile, by flag or environment; its URL comes from the top level.
    as_tenant(
        orl_with(
            &with_home(&[]),
            &["--profile", "tenant", "orgs", "get", "ops"],
        )
        .await,
    );
    as_tenant(orl_with(&with_home(&[("ORL_PROFILE", "tenant")]), &ops).await);
    // The environment beats the profile, and a flag beats the environment.
    let (admin_env, tenant_env) = (admin, tenant.as_str());
    as_admin(
        orl_with(
            &with_home(&[("ORL_PROFILE", "tenant"), ("ORL_KEY", admin_env)]),
            &ops,
        )
        .await,
    );
    as_tenant(orl_with(&with_home(&[("ORL_KEY", tenant_env)]), &ops).await);
    as_admin(
        orl_with(
            &with_home(&[("ORL_KEY", tenant_env)]),
            &["--key", admin, "orgs", "get", "ops"],
        )
        .await,
    );
    // The same for the URL.
    let unreachable = "cannot reach the orl server at http://127.0.0.1:1";
    let output = orl_with(&with_home(&[("ORL_PROFILE", "elsewhere")]), &ops).await;
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(unreachable),
        "{output:?}"
    );
    let url_env = server.url.as_str();
    as_admin(
        orl_with(
            &with_home(&[("ORL_PROFILE", "elsewhere"), ("ORL_URL", url_env)]),
            &ops,
        )
        .await,
    );
    as_admin(
        orl_with(
            &with_home(&[("ORL_URL", "127.0.0.1:1")]),
            &["--url", server.url.as_str(), "orgs", "get", "ops"],
        )
        .await,
    );
    let output = orl_with(
        &with_home(&[]),
        &["--profile", "nope", "orgs", "get", "ops"],
    )
    .await;
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("has no [profiles.nope] table"),
        "{output:?}"
    );

    // XDG_CONFIG_HOME, when set, is where the file is looked for instead.
    let xdg = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(xdg.path().join("orl")).unwrap();
    std::fs::write(
        xdg.path().join("orl/config.toml"),
        format!("url = \"http://127.0.0.1:1\"\nkey = \"{admin}\"\n"),
    )
    .unwrap();
    let xdg_path = xdg.path().to_str().unwrap();
    let output = orl_with(&with_home(&[("XDG_CONFIG_HOME", xdg_path)]), &ops).await;
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(unreachable),
        "{output:?}"
    );
}

/// `nodes import`'s file: `count` nodes `n1`… of 8 H100s, the `bad`-th (if any) with a
/// unit class that does not exist.
fn nodes_file(dir: &std::path::Path, count: usize, bad: Option<usize>) -> String {
    let nodes: serde_json::Map<String, Value> = (1..=count)
        .map(|n| {
            let id = format!("n{n}");
            let mut inventory = h100_inventory(&id, 8);
            if bad == Some(n) {
                inventory["units"][0]["class"] = json!("tpu");
            }
            (id, inventory)
        })
        .collect();
    let path = dir.join(format!("nodes-{count}-{bad:?}.json"));
    std::fs::write(&path, Value::Object(nodes).to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_import_registers_every_node_and_draws_progress_only_on_a_terminal() {
    let server = Server::start(Db::Sqlite).await;
    let admin = &server.admin;
    orl(&server, admin, &words("orgs create acme --name Acme")).await;
    let dir = server.data_dir.path();
    let file = nodes_file(dir, 12, None);
    let output = run_orl(
        &server,
        admin,
        &["nodes", "import", "acme", "--file", &file],
    )
    .await;
    assert!(output.status.success(), "{output:?}");
    let table = String::from_utf8(output.stdout).unwrap();
    for n in 1..=12 {
        assert!(table.contains(&format!("n{n} ")), "n{n} missing: {table}");
    }
    assert!(
        output.stderr.is_empty(),
        "no progress when stderr is not a terminal: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (_, nodes) = server
        .admin()
        .get("/v1/orgs/acme/provider/nodes?limit=200")
        .await;
    assert_eq!(nodes["items"].as_array().unwrap().len(), 12, "{nodes}");

    // On a terminal (`script` gives the command one), the bar is drawn on it.
    let line = format!(
        "{} nodes import acme --file {file} --parallel 2",
        env!("CARGO_BIN_EXE_orl")
    );
    let output = tokio::process::Command::new("script")
        .args(["--quiet", "--return", "--command", &line, "/dev/null"])
        .env("ORL_URL", &server.url)
        .env("ORL_KEY", admin)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("script(1) from util-linux");
    let screen = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{screen}");
    assert!(
        screen.contains("registering for acme") && screen.contains("/12 nodes"),
        "a progress bar: {screen}"
    );

    // The first refusal stops the import and names its node.
    let file = nodes_file(dir, 3, Some(2));
    let stderr = orl_fails(
        &server,
        admin,
        &["nodes", "import", "acme", "--file", &file],
    )
    .await;
    assert!(
        stderr.contains("node n2") && stderr.contains("400 INVALID_INPUT"),
        "{stderr}"
    );
}

async fn a_policy_printed_by_get_sets_back_unchanged(db: Db) {
    let server = Server::start(db).await;
    let admin = &server.admin;
    orl(&server, admin, &words("orgs create tenant-a --name Tenant")).await;
    let output = run_orl(&server, admin, &words("iam policy get tenant-a")).await;
    assert!(output.status.success(), "{output:?}");
    assert!(output.stdout.is_empty(), "no policy prints nothing");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("tenant-a has no policy"), "{stderr}");

    let original = include_str!("../../examples/policy.cedar");
    let file = server.data_dir.path().join("policy.cedar");
    std::fs::write(&file, original).unwrap();
    let file = file.to_str().unwrap();
    for round in 0..3 {
        orl(
            &server,
            admin,
            &["iam", "policy", "set", "tenant-a", "--file", file],
        )
        .await;
        let shown = orl(&server, admin, &words("iam policy get tenant-a")).await;
        assert_eq!(shown, original, "round {round}: get prints what set stored");
        std::fs::write(file, &shown).unwrap();
    }
    let (_, stored) = server.admin().get("/v1/orgs/tenant-a/iam/policy").await;
    assert_eq!(stored["policy"], original);

    // A policy naming what orl never sends is refused, and the one set stays.
    std::fs::write(
        file,
        original.replace("context.gpuModel", "context.gpuModelx"),
    )
    .unwrap();
    let stderr = orl_fails(
        &server,
        admin,
        &["iam", "policy", "set", "tenant-a", "--file", file],
    )
    .await;
    assert!(
        stderr.contains("400 INVALID_INPUT") && stderr.contains("gpuModelx"),
        "{stderr}"
    );
    let shown = orl(&server, admin, &words("iam policy get tenant-a")).await;
    assert_eq!(shown, original);
}

async fn policy_get_with_json_or_field_prints_the_answer_alone(db: Db) {
    let server = Server::start(db).await;
    let admin = &server.admin;
    orl(&server, admin, &words("orgs create tenant-a --name Tenant")).await;
    let quiet = |args: &'static str| {
        let server = &server;
        async move {
            let output = run_orl(server, admin, &words(args)).await;
            assert!(output.status.success(), "{args}: {output:?}");
            assert!(
                output.stderr.is_empty(),
                "{args} writes nothing but its answer: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).unwrap()
        }
    };
    let none: Value = serde_json::from_str(&quiet("--json iam policy get tenant-a").await).unwrap();
    assert_eq!(none["policy"], "", "{none}");

    let original = include_str!("../../examples/policy.cedar");
    let file = server.data_dir.path().join("policy.cedar");
    std::fs::write(&file, original).unwrap();
    let file = file.to_str().unwrap();
    orl(
        &server,
        admin,
        &["iam", "policy", "set", "tenant-a", "--file", file],
    )
    .await;
    let shown: Value =
        serde_json::from_str(&quiet("--json iam policy get tenant-a").await).unwrap();
    assert_eq!(shown["policy"], original, "{shown}");
    assert!(shown["updatedAt"].is_string(), "{shown}");
    let field = quiet("--field policy iam policy get tenant-a").await;
    assert_eq!(field.trim_end(), original.trim_end());
    // The table view still says when it was set, on stderr.
    let output = run_orl(&server, admin, &words("iam policy get tenant-a")).await;
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("tenant-a's policy, set"),
        "{output:?}"
    );
}

/// Runs `orl plugins test args…` with no server; answers its exit status, stdout and stderr.
async fn plugins_test(args: &[&str]) -> (bool, String, String) {
    // A generous deadline unless the test sets one: a loaded test machine may take more
    // than the default 50 ms to make an instance.
    let mut all = vec!["plugins", "test"];
    all.extend_from_slice(args);
    if !args.contains(&"--deadline-ms") && !args.contains(&"--help") {
        all.extend(["--deadline-ms", "5000"]);
    }
    let output = orl_alone(&all).await;
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The block `orl plugins test` printed for `scenario`: its first line names it.
fn scenario_block<'a>(stdout: &'a str, scenario: &str) -> &'a str {
    let title = format!(" {scenario}  (");
    stdout
        .split("\n\n")
        .find(|b| b.lines().next().is_some_and(|l| l.contains(&title)))
        .unwrap_or_else(|| panic!("no {scenario} in {stdout}"))
}

#[tokio::test]
async fn plugins_test_runs_the_built_in_placer_on_its_scenarios_and_a_file() {
    let (ok, stdout, stderr) = plugins_test(&["placer-default"]).await;
    assert!(ok, "{stdout}\n{stderr}");
    let domains = scenario_block(&stdout, "two-nvlink-domains");
    assert!(domains.starts_with("ok   two-nvlink-domains"), "{domains}");
    // Three GPUs of the first domain are busy: four in one domain fit only in the second.
    assert!(domains.contains("decision: placed on n1: "), "{domains}");
    for gpu in ["n1-gpu4", "n1-gpu5", "n1-gpu6", "n1-gpu7"] {
        assert!(domains.contains(gpu), "{domains}");
    }
    let mixed = scenario_block(&stdout, "mixed-mig-and-nic");
    assert!(mixed.contains("decision: placed on m1: "), "{mixed}");
    assert!(
        mixed.contains("m1-mig1") && mixed.contains("m1-nic"),
        "{mixed}"
    );
    assert!(!mixed.contains("m1-mig0"), "busy: {mixed}");
    let full = scenario_block(&stdout, "almost-full");
    assert!(full.contains("decision: unschedulable"), "{full}");
    assert!(stdout.contains("3 scenarios: 3 ok, 0 failed"), "{stdout}");
    assert!(stdout.contains(" ms)"), "each decision is timed: {stdout}");

    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/scenario.json");
    let (ok, stdout, stderr) = plugins_test(&["placer-default", "--scenario", example]).await;
    assert!(ok, "{stdout}\n{stderr}");
    let sample = scenario_block(&stdout, "two-nodes-one-spot-job");
    assert!(sample.contains("decision: placed on n"), "{sample}");
    assert!(
        !sample.contains("n2-gpu0") && !sample.contains("n1-gpu0"),
        "busy: {sample}"
    );
    assert!(stdout.contains("4 scenarios: 4 ok, 0 failed"), "{stdout}");

    let (ok, stdout, _) = plugins_test(&[
        "--json",
        "placer-default",
        "--only-scenario",
        "--scenario",
        example,
    ])
    .await;
    assert!(ok, "{stdout}");
    let answer: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["plugin"]["world"], "placer", "{answer}");
    assert_eq!(answer["scenarios"].as_array().unwrap().len(), 1, "{answer}");
    assert_eq!(answer["scenarios"][0]["ok"], true, "{answer}");

    // A scenario that is not one says why, and runs nothing.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"name": "x", "nodes": {}, "request": {"devices": []}, "extra": 1}"#,
    )
    .unwrap();
    let (ok, _, stderr) =
        plugins_test(&["placer-default", "--scenario", bad.to_str().unwrap()]).await;
    assert!(!ok);
    assert!(
        stderr.contains("is not a scenario") && stderr.contains("extra"),
        "{stderr}"
    );
    let (ok, _, stderr) = plugins_test(&["no-such-file.wasm"]).await;
    assert!(!ok);
    assert!(
        stderr.contains("no-such-file.wasm") && stderr.contains("placer-default"),
        "{stderr}"
    );
}

#[tokio::test]
async fn plugins_test_fails_on_an_invalid_answer_or_a_failing_plugin_and_shows_its_log() {
    let invalid = component("invalid_answer.wasm");
    let (ok, stdout, stderr) = plugins_test(&[invalid.to_str().unwrap()]).await;
    assert!(!ok, "an invalid answer fails the run: {stdout}");
    let domains = scenario_block(&stdout, "two-nvlink-domains");
    assert!(domains.starts_with("FAIL two-nvlink-domains"), "{stdout}");
    assert!(stdout.contains("FAIL two-nvlink-domains"), "{stdout}");
    assert!(
        domains.contains("problem: invalid answer: unit "),
        "{domains}"
    );
    assert!(domains.contains("chosen twice"), "{domains}");
    // Where nothing fits there is nothing to break: it answers err, which is right.
    assert!(stdout.contains("ok   almost-full"), "{stdout}");
    assert!(stderr.contains("2 of 3 scenarios failed"), "{stderr}");

    let trap = component("trap.wasm");
    let (ok, stdout, _) = plugins_test(&[trap.to_str().unwrap()]).await;
    assert!(!ok);
    assert!(stdout.contains("decision: failed (trap)"), "{stdout}");
    let bomb = component("memory_bomb.wasm");
    let (ok, stdout, _) = plugins_test(&[bomb.to_str().unwrap(), "--deadline-ms", "5000"]).await;
    assert!(!ok);
    assert!(stdout.contains("decision: failed (memory)"), "{stdout}");
    let sleeper = component("sleep_forever.wasm");
    let (ok, stdout, _) = plugins_test(&[sleeper.to_str().unwrap(), "--deadline-ms", "20"]).await;
    assert!(!ok);
    assert!(stdout.contains("decision: failed (deadline)"), "{stdout}");
    // The config file is the plugin's `/config/config.json`. This one refuses every
    // request, which fails the scenario where the request fits.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.json");
    std::fs::write(&config, r#"{"spread": true}"#).unwrap();
    let reader = component("read_config.wasm");
    let (ok, stdout, _) = plugins_test(&[
        reader.to_str().unwrap(),
        "--config-file",
        config.to_str().unwrap(),
    ])
    .await;
    assert!(!ok);
    let domains = scenario_block(&stdout, "two-nvlink-domains");
    assert!(
        domains.contains("decision: unschedulable: CONFIG: {"),
        "{domains}"
    );
    assert!(domains.contains(r#""spread": true"#), "{domains}");
    assert!(
        domains.contains("problem: expected a placement"),
        "{domains}"
    );

    let flood = component("log_flood.wasm");
    let (ok, stdout, stderr) = plugins_test(&[flood.to_str().unwrap()]).await;
    assert!(ok, "{stdout}\n{stderr}");
    let domains = scenario_block(&stdout, "two-nvlink-domains");
    assert!(domains.contains("log (65 lines):"), "{domains}");
    assert!(domains.contains("info  FLOOD 00000"), "{domains}");
    assert!(
        domains.contains("FLOOD 00063") && !domains.contains("FLOOD 00064"),
        "{domains}"
    );
    assert!(
        domains.contains("warn  9936 lines of this call were dropped"),
        "{domains}"
    );
}

#[tokio::test]
async fn plugins_test_runs_preemptors_and_spend_guards() {
    let oldest = component("preempt_oldest.wasm");
    for plugin in [oldest.to_str().unwrap(), "preemptor-default"] {
        let (ok, stdout, stderr) = plugins_test(&[plugin]).await;
        assert!(ok, "{plugin}: {stdout}\n{stderr}");
        assert!(stdout.contains("(preemptor)"), "{stdout}");
        let full = scenario_block(&stdout, "almost-full");
        assert!(full.contains("decision: terminate busy["), "{full}");
        assert!(
            !full.contains("note:"),
            "the request fits afterwards: {full}"
        );
        // Only spot work is offered: n1's and n2's steady work never is.
        assert!(
            !full.contains("n1-gpu") && !full.contains("n2-gpu0"),
            "{full}"
        );
    }
    let (ok, stdout, stderr) = plugins_test(&["spend-guard-default"]).await;
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        scenario_block(&stdout, "within-budget").contains("decision: allowed"),
        "{stdout}"
    );
    assert!(
        scenario_block(&stdout, "over-budget").contains("decision: refused"),
        "{stdout}"
    );
    assert!(stdout.contains("2 scenarios: 2 ok, 0 failed"), "{stdout}");
}
