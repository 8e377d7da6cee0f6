//! The README's walk-through, `examples/walkthrough.sh`, run as printed against a fresh
//! server: if a command of it breaks, or the README shows anything else, a test fails.

use std::path::{Path, PathBuf};
use std::process::Output;

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Db, Server, on_both_databases};

on_both_databases!(the_readme_walkthrough_runs_as_printed_on_a_fresh_server);

/// The repository's root, where the walk-through runs.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn script() -> String {
    std::fs::read_to_string(root().join("examples/walkthrough.sh")).unwrap()
}

/// Runs the walk-through with `bash -euo pipefail` from the repository's root, the built
/// `orl` first on `PATH`, and `ORL_URL`/`ORL_KEY` naming `server` and its admin key (and
/// no profile file of the machine's user).
async fn run_walkthrough(server: &Server) -> Output {
    let bin = Path::new(env!("CARGO_BIN_EXE_orl")).parent().unwrap();
    let path = match std::env::var_os("PATH") {
        Some(path) => {
            let mut dirs = vec![bin.to_path_buf()];
            dirs.extend(std::env::split_paths(&path));
            std::env::join_paths(dirs).unwrap()
        }
        None => bin.as_os_str().to_owned(),
    };
    let config = tempfile::tempdir().unwrap();
    tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "examples/walkthrough.sh"])
        .current_dir(root())
        .env("PATH", path)
        .env("ORL_URL", &server.url)
        .env("ORL_KEY", &server.admin)
        .env("XDG_CONFIG_HOME", config.path())
        .env_remove("ORL_PROFILE")
        .output()
        .await
        .unwrap()
}

async fn the_readme_walkthrough_runs_as_printed_on_a_fresh_server(db: Db) {
    let server = Server::start(db).await;
    let output = run_walkthrough(&server).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the walk-through failed:\n{stdout}\n--- stderr ---\n{stderr}"
    );
    // What it says along the way.
    for shown in [
        "h100-3",
        "msa-7",
        "capacity-reclaim",
        "waits for a person",
        "approved",
        "context.confirmed",
        "contract over",
    ] {
        assert!(stdout.contains(shown), "{shown:?} not shown:\n{stdout}");
    }
    assert!(stderr.contains("403 CONFIRMATION_REQUIRED"), "{stderr}");
    assert!(
        stdout.contains(include_str!("../../examples/policy.cedar")),
        "the policy is printed as it was set:\n{stdout}"
    );

    // And what it did, as the API tells it.
    let admin = server.admin();
    let (status, nodes) = admin.get("/v1/orgs/acme-gpu/provider/nodes").await;
    assert_eq!(status, StatusCode::OK, "{nodes}");
    let ids: Vec<&str> = (nodes["items"].as_array().unwrap().iter())
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["h100-1", "h100-2", "h100-3"]);
    let (_, contracts) = admin.get("/v1/nodes/h100-1/reservations").await;
    assert_eq!(contracts.as_array().unwrap().len(), 1, "{contracts}");
    assert_eq!(contracts[0]["status"], "cancelled", "{contracts}");
    assert!(
        (contracts[0]["releasedUnitIds"].as_array()).is_none_or(Vec::is_empty),
        "reclaimed: {contracts}"
    );

    let (_, listed) = admin
        .post(
            "/api/compute/reservations/list",
            json!({ "tenantId": "tenant-a", "scope": "all", "limit": 10 }),
        )
        .await;
    let mut seen: Vec<(String, String, String)> = (listed["items"].as_array().unwrap().iter())
        .map(|r| {
            let units = r["placement"]["unitIds"].as_array().unwrap();
            let mut units = units
                .iter()
                .map(|u| u.as_str().unwrap())
                .collect::<Vec<_>>();
            units.sort();
            (
                r["state"].as_str().unwrap().to_string(),
                r["reason"].as_str().unwrap_or_default().to_string(),
                units.join(","),
            )
        })
        .collect();
    seen.sort();
    let agents = seen
        .iter()
        .find(|(state, ..)| state == "placed" || state == "active")
        .expect("the agent's approved request is placed")
        .2
        .clone();
    assert!(
        agents.starts_with("h100-2-") || agents.starts_with("h100-3-"),
        "{seen:?}"
    );
    let released: Vec<(&str, &str)> = (seen.iter())
        .filter(|(state, ..)| state == "released")
        .map(|(_, reason, units)| (reason.as_str(), units.as_str()))
        .collect();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        released.contains(&("capacity-reclaim", "h100-1-gpu6,h100-1-gpu7")),
        "the spot work on the released units was reclaimed: {seen:?}"
    );
    assert!(
        released
            .iter()
            .any(|(_, units)| *units == "h100-1-gpu0,h100-1-gpu1,h100-1-gpu2,h100-1-gpu3"),
        "request.json took the first NVLink domain: {seen:?}"
    );
}

/// The README's walk-through section shows the script itself, whole and unchanged, so
/// what a reader types is what this suite runs.
#[test]
fn the_readme_shows_the_walkthrough_script_verbatim() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let script = script();
    assert!(
        readme.contains(&format!("```sh\n{script}```\n")),
        "README.md must show examples/walkthrough.sh verbatim in a sh block"
    );
    for file in [
        "inventory.json",
        "nodes.json",
        "request.json",
        "policy.cedar",
    ] {
        assert!(
            script.contains(&format!("examples/{file}")),
            "the walk-through uses examples/{file}"
        );
        assert!(root().join("examples").join(file).exists(), "{file}");
    }
}
