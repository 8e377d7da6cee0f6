use reqwest::StatusCode;
use serde_json::json;

use std::collections::{BTreeSet, HashMap};

use crate::exposition::Metrics;
use crate::support::{Api, Db, Options, Server, T0, on_both_databases, register_node};

on_both_databases!(
    healthz_answers_ok,
    metrics_count_requests_by_route_and_status,
    metrics_gauge_each_unit_in_one_state_and_reservations_by_state,
    metrics_time_each_policy_decision_by_plugin_and_world,
    metrics_count_the_write_turn_each_placement_took_and_its_group_commits,
    alert_rules_and_dashboard_name_only_metrics_the_server_exports,
    openapi_describes_every_v1_route,
    demo_seeds_four_h100_nodes_and_prints_working_keys,
    demo_refuses_a_database_it_did_not_seed_and_changes_nothing,
    status_names_the_database_the_replicas_seen_and_each_plugins_decisions,
);

async fn healthz_answers_ok(db: Db) {
    let server = Server::start(db).await;
    let (status, body) = server.anonymous().get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
}

async fn metrics_count_requests_by_route_and_status(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 1).await;
    provider.get("/v1/nodes/missing").await;
    provider.get("/v1/nodes/missing-too").await;
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.get(
            r#"orl_http_requests_total{method="GET",route="/v1/nodes/{nodeId}",status="404"}"#
        ),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metrics.get(r#"orl_http_request_duration_seconds_count{method="PUT",route="/v1/orgs/{orgId}/provider/nodes/{nodeId}",status="201"}"#),
        Some(1.0),
        "{metrics}"
    );
}

const MIN: i64 = 60_000;

/// Creates a non-spot reservation of `gpus` GPUs for two hours from now.
async fn book(api: &Api, pool: &str, tenant: &str, key: &str, gpus: i64) -> serde_json::Value {
    let (status, r) = api
        .post(
            "/api/compute/reservations/create",
            json!({ "tenantId": tenant, "poolId": pool, "devices": [{ "class": "gpu", "count": gpus }],
                    "duration": "2h", "spot": false, "idempotencyKey": key }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r
}

/// Pool `h100` of three 8-GPU nodes of `acme`: n3's agent polled once and then went
/// silent, so it is lost; a node reservation gives n1-gpu0-5 to `anchor` and releases
/// gpu0-3 to the spot market; `stranger` booked 8 GPUs (only n2 can hold them) and 1 (on
/// n1's open gpu6-7), both active, and waits for 2 more (only one unit is left it may use).
/// Answers the server, the pool id and the metrics scraped at T0 + 7 min.
async fn loaded_platform(db: Db) -> (Server, String, Metrics) {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    for node in ["n1", "n2", "n3"] {
        register_node(&acme, "acme", node, 8).await;
    }
    let stranger = server.org_with_key("stranger", "member").await;
    let broker = server.org_with_key("broker", "provider").await;
    server.org_with_key("anchor", "member").await;
    let admin = server.admin();
    let (status, pool) = admin
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": ["n1", "n2", "n3"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    let (status, offer) = admin
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "stranger", "quota": { "gpu": 16 } }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");

    let (status, polled) = acme.get("/v1/nodes/n3/bindings").await;
    assert_eq!(status, StatusCode::OK, "{polled}");
    server.set_clock(T0 + 6 * MIN).await;
    let (_, n3) = acme.get("/v1/nodes/n3").await;
    assert!(n3["conditions"].to_string().contains("NodeLost"), "{n3}");

    let units: Vec<String> = (0..6).map(|g| format!("n1-gpu{g}")).collect();
    let (status, nr) = admin
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": units, "allowedOrgIds": ["anchor"], "managingOrgIds": ["broker"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");
    let (status, body) = broker
        .post(
            &format!(
                "/v1/nodes/n1/reservations/{}/release",
                nr["id"].as_str().unwrap()
            ),
            json!({ "unitIds": ["n1-gpu0", "n1-gpu1", "n1-gpu2", "n1-gpu3"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let eight = book(&stranger, &pool, "stranger", "k-8", 8).await;
    assert_eq!(eight["state"], "placed", "{eight}");
    assert_eq!(eight["placement"]["nodeId"], "n2");
    let one = book(&stranger, &pool, "stranger", "k-1", 1).await;
    assert_eq!(one["placement"]["nodeId"], "n1", "{one}");
    let waiting = book(&stranger, &pool, "stranger", "k-2", 2).await;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    // A pass activates the two placed ones and retries the pending one, in vain.
    server.set_clock(T0 + 7 * MIN).await;
    let metrics = server.metrics().await;
    (server, pool, metrics)
}

async fn metrics_gauge_each_unit_in_one_state_and_reservations_by_state(db: Db) {
    let (_server, pool, metrics) = loaded_platform(db).await;
    let units = |state: &str| {
        metrics.get(&format!(
            r#"orl_units{{pool="{pool}",model="H100-SXM5-80GB",class="gpu",state="{state}"}}"#
        ))
    };
    // n3 lost; n2 booked whole and n1-gpu6 or 7 booked; n1-gpu0-3 released, gpu4-5
    // reserved; the other of gpu6-7 free.
    for (state, expected) in [
        ("lost", 8.0),
        ("booked", 9.0),
        ("reserved", 2.0),
        ("released", 4.0),
        ("free", 1.0),
    ] {
        assert_eq!(units(state), Some(expected), "{state}\n{metrics}");
    }
    assert_eq!(
        (metrics.samples())
            .filter(|(series, _)| series.starts_with("orl_units{"))
            .count(),
        5,
        "one series per state: {metrics}"
    );
    let reservations = |state: &str| {
        metrics.get(&format!(
            r#"orl_compute_reservations{{pool="{pool}",state="{state}"}}"#
        ))
    };
    for (state, expected) in [
        ("awaiting-confirmation", 0.0),
        ("queued", 0.0),
        ("pending", 1.0),
        ("placed", 0.0),
        ("binding", 0.0),
        ("active", 2.0),
        ("releasing", 0.0),
    ] {
        assert_eq!(reservations(state), Some(expected), "{state}\n{metrics}");
    }
    // The pending one was created at T0 + 6 min and scraped at T0 + 7 min.
    assert_eq!(
        metrics.get(&format!(
            r#"orl_oldest_pending_reservation_age_seconds{{pool="{pool}"}}"#
        )),
        Some(60.0),
        "{metrics}"
    );
    let get =
        |series: &str| (metrics.get(series)).unwrap_or_else(|| panic!("no {series}: {metrics}"));
    assert!(get("orl_events_outbox_position") > 0.0, "{metrics}");
    get("orl_events_outbox_newest_age_seconds");
    let max = get("orl_db_pool_max_connections");
    assert!(max >= 1.0, "{metrics}");
    let in_use = get(r#"orl_db_pool_connections{state="in_use"}"#);
    let idle = get(r#"orl_db_pool_connections{state="idle"}"#);
    assert!(in_use + idle <= max, "{metrics}");
    // Two passes ran (one per clock move); the last was a minute behind: the two placed at
    // T0 + 6 min were due to start then (the pending one only since T0 + 6.5 min).
    assert_eq!(
        metrics.get("orl_reconciler_pass_duration_seconds_count"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metrics.get("orl_reconciler_lag_seconds"),
        Some(60.0),
        "{metrics}"
    );
}

async fn metrics_count_the_write_turn_each_placement_took_and_its_group_commits(db: Db) {
    let (_server, _pool, metrics) = loaded_platform(db).await;
    // Three creates wrote their placement (two placed, one pending), one after another:
    // each in a group of its own.
    assert_eq!(
        metrics.get("orl_write_turn_writes_total"),
        Some(3.0),
        "{metrics}"
    );
    assert_eq!(
        metrics.get("orl_write_group_commits_total"),
        Some(3.0),
        "{metrics}"
    );
    let held = metrics.get("orl_write_turn_held_seconds_total");
    assert!(held.is_some_and(|s| s > 0.0 && s < 10.0), "{metrics}");
    // Nothing waits for the turn once every write answered.
    assert_eq!(
        metrics.get("orl_write_turn_waiting"),
        Some(0.0),
        "{metrics}"
    );
}

async fn metrics_time_each_policy_decision_by_plugin_and_world(db: Db) {
    let (_server, _pool, metrics) = loaded_platform(db).await;
    // Every placer call is timed: the histogram counts as many as the decision counter,
    // per plugin.
    let mut decided: HashMap<&str, f64> = HashMap::new();
    for (series, value) in metrics.samples() {
        if let Some(labels) = series.strip_prefix("orl_policy_decisions_total{")
            && labels.contains(r#"world="placer""#)
        {
            let plugin = labels.split('"').nth(1).unwrap();
            *decided.entry(plugin).or_default() += value;
        }
    }
    assert_eq!(decided.len(), 1, "one placer decided: {metrics}");
    for (plugin, count) in decided {
        assert!(plugin.starts_with("sha256:"), "{plugin}");
        // Two placements, the pending one's first attempt and its retry.
        assert!(count >= 4.0, "{metrics}");
        // The built-in placer: its built-in name and the server's version.
        let labels = format!(
            r#"plugin="{plugin}",name="placer-default",version="{}",world="placer""#,
            env!("CARGO_PKG_VERSION")
        );
        let timed = format!("orl_policy_decision_duration_seconds_count{{{labels}}}");
        assert_eq!(metrics.get(&timed), Some(count), "{metrics}");
        let inf = format!(r#"orl_policy_decision_duration_seconds_bucket{{le="+Inf",{labels}}}"#);
        assert_eq!(metrics.get(&inf), Some(count), "{metrics}");
    }
    // No plugin failed; the failure counter is declared all the same.
    assert!(
        (metrics.text().lines()).any(|l| l == "# TYPE orl_policy_failures counter"),
        "{metrics}"
    );
    assert_eq!(
        metrics.sum("orl_policy_failures_total", &[]),
        None,
        "{metrics}"
    );
}

/// The metric names an expression reads: identifiers starting `orl_`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("orl_") {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            names.push(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

async fn alert_rules_and_dashboard_name_only_metrics_the_server_exports(db: Db) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/prometheus/alerts.yml");
    let rules = std::fs::read_to_string(&path).unwrap();
    // The shape Prometheus reads: groups, each rule an alert with one expression.
    assert!(rules.lines().any(|l| l == "groups:"), "{rules}");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    let exprs: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .collect();
    assert_eq!(alerts.len(), exprs.len(), "{rules}");
    for wanted in [
        "OrlDown",
        "OrlPendingReservationTooOld",
        "OrlReconcilerLagging",
        "OrlPolicyFailuresRising",
        "OrlDatabasePoolSaturated",
        "OrlUnitsLost",
    ] {
        assert!(alerts.contains(&wanted), "{wanted} missing");
    }
    assert!(rules.contains("up{job=\"orl\"} == 0"));

    let (_server, _pool, metrics) = loaded_platform(db).await;
    // What the server exports: each sample's name, and each declared family (a counter
    // that has not counted yet has no sample) with the suffixes its samples take.
    let mut exported: BTreeSet<String> = BTreeSet::new();
    for line in metrics.text().lines() {
        if let Some(family) = line
            .strip_prefix("# TYPE ")
            .and_then(|t| t.split(' ').next())
        {
            for suffix in ["", "_total", "_bucket", "_count", "_sum", "_created"] {
                exported.insert(format!("{family}{suffix}"));
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            exported.insert(line[..end].to_string());
        }
    }
    let mut named = BTreeSet::new();
    for expr in &exprs {
        named.extend(metric_names(expr));
    }
    assert!(named.len() >= 7, "{named:?}");
    // The dashboard: valid JSON, its data source a template variable, and what its panels
    // query.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/grafana/orl.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables
            .iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus")
    );
    let mut queried = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{target}");
            named.extend(metric_names(target["expr"].as_str().unwrap()));
            queried += 1;
        }
    }
    assert!(queried >= 15, "{dashboard}");
    let unknown: Vec<&String> = named.iter().filter(|n| !exported.contains(*n)).collect();
    assert!(unknown.is_empty(), "not exported: {unknown:?}");
}

async fn openapi_describes_every_v1_route(db: Db) {
    let server = Server::start(db).await;
    let (status, doc) = server.anonymous().get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/v1/orgs",
        "/v1/orgs/{orgId}",
        "/v1/orgs/{orgId}/api-keys",
        "/v1/orgs/{orgId}/api-keys/{keyId}",
        "/v1/orgs/{orgId}/provider/nodes",
        "/v1/orgs/{orgId}/provider/nodes/{nodeId}",
        "/v1/nodes/{nodeId}",
        "/v1/audit",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "{path} missing from /openapi.json"
        );
    }
    assert!(doc["components"]["schemas"].get("NodeInventory").is_some());
    assert!(doc["components"]["securitySchemes"].get("apiKey").is_some());
    // Every operation has an id of its own (clients are generated from them).
    let mut ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|ops| ops.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();
    let operations = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), operations, "operation ids repeat: {ids:?}");
    // A body that may be left out is not required; none is declared as `null`, which the
    // server refuses (a body is a JSON object).
    let end = &doc["paths"]["/v1/nodes/{nodeId}/reservations/{id}/end"]["post"]["requestBody"];
    assert!(end.get("required").is_none_or(|r| r == false), "{end}");
    assert_eq!(
        end["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/Because"
    );
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let content = op["requestBody"]["content"].to_string();
            assert!(
                !content.contains(r#"{"type":"null"}"#),
                "{method} {path} declares a null body: {content}"
            );
        }
    }
}

async fn demo_refuses_a_database_it_did_not_seed_and_changes_nothing(db: Db) {
    let mut server = Server::start(db).await;
    let provider = server.org_with_key("acme-gpu", "provider").await;
    let mut inventory = crate::support::h100_inventory("h100-1", 2);
    inventory["labels"] = json!({ "rack": "r7" });
    let (status, node) = provider
        .put("/v1/orgs/acme-gpu/provider/nodes/h100-1", inventory)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node}");
    let audit_before = crate::support::audit_count(&server).await;

    let stderr = server
        .restart_refused(Options {
            demo: true,
            admin_key: Some(server.admin.clone()),
            ..Options::default()
        })
        .await;
    assert!(
        stderr.contains("--demo seeds an empty database") && stderr.contains("nothing was changed"),
        "{stderr}"
    );

    server
        .restart_with(Options {
            admin_key: Some(server.admin.clone()),
            ..Options::default()
        })
        .await;
    let (_, after) = server.admin().get("/v1/nodes/h100-1").await;
    assert_eq!(after["units"].as_array().unwrap().len(), 2, "{after}");
    assert_eq!(after["labels"], json!({ "rack": "r7" }));
    assert_eq!(crate::support::audit_count(&server).await, audit_before);
    let (_, orgs) = server.admin().get("/v1/orgs/tenant-a").await;
    assert_eq!(
        orgs["error"]["code"], "NOT_FOUND",
        "no demo org was added: {orgs}"
    );
}

async fn demo_seeds_four_h100_nodes_and_prints_working_keys(db: Db) {
    let mut server = Server::start_with(
        db,
        Options {
            demo: true,
            ..Options::default()
        },
    )
    .await;
    let provider_key = banner_value(&server.banner, "provider key:");
    let tenant_key = banner_value(&server.banner, "tenant key:");
    let provider = server.as_key(&provider_key);
    let (status, nodes) = provider.get("/v1/orgs/acme-gpu/provider/nodes").await;
    assert_eq!(status, StatusCode::OK, "{nodes}");
    let nodes = nodes["items"].as_array().unwrap();
    assert_eq!(nodes.len(), 4);
    for node in nodes {
        let units = node["units"].as_array().unwrap();
        assert_eq!(units.len(), 8);
        assert_eq!(
            units.iter().filter(|u| u["nvlinkDomain"] == "nvl0").count(),
            4
        );
        assert_eq!(units[0]["model"], "H100-SXM5-80GB");
    }
    assert_eq!(
        server.as_key(&tenant_key).get("/v1/nodes/h100-1").await.0,
        StatusCode::NOT_FOUND
    );
    assert!(server.banner.contains("curl"));

    server
        .restart_with(Options {
            demo: true,
            admin_key: Some(server.admin.clone()),
            ..Options::default()
        })
        .await;
    assert_eq!(
        banner_value(&server.banner, "provider key:"),
        provider_key,
        "a restart keeps the demo keys"
    );
    let (_, nodes) = server
        .as_key(&provider_key)
        .get("/v1/orgs/acme-gpu/provider/nodes")
        .await;
    assert_eq!(
        nodes["items"][0]["topologyGen"], 1,
        "re-seeding changes nothing"
    );
}

fn banner_value(banner: &str, label: &str) -> String {
    banner
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .unwrap_or_else(|| panic!("{label} not in banner:\n{banner}"))
        .trim()
        .to_string()
}

async fn status_names_the_database_the_replicas_seen_and_each_plugins_decisions(db: Db) {
    let (server, _pool, metrics) = loaded_platform(db).await;
    let (code, status) = server.admin().get("/v1/status").await;
    assert_eq!(code, StatusCode::OK, "{status}");
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    let database = match db {
        Db::Sqlite => "sqlite",
        Db::Postgres => "postgresql",
    };
    assert_eq!(status["database"], database);
    let me = status["replica"].as_str().unwrap().to_string();
    assert!(me.starts_with("rep_"), "{status}");
    let ids = |status: &serde_json::Value| -> Vec<String> {
        (status["replicas"].as_array().unwrap().iter())
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&status), vec![me.clone()], "{status}");
    assert_eq!(status["replicas"][0]["version"], env!("CARGO_PKG_VERSION"));
    // The placer's decisions, as the metrics count them, and no failure.
    let decided = (metrics.sum("orl_policy_decisions_total", &[("world", "placer")]))
        .expect("placer decisions counted");
    let plugins = status["plugins"].as_array().unwrap();
    let placer: Vec<_> = plugins.iter().filter(|p| p["world"] == "placer").collect();
    assert_eq!(placer.len(), 1, "{status}");
    assert!(
        placer[0]["pluginId"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(
        placer[0]["decisions"].as_f64().unwrap() >= decided,
        "{status} {metrics}"
    );
    assert_eq!(placer[0]["failures"], 0, "{status}");
    assert!(status["reconciler"]["lagSeconds"].is_number(), "{status}");

    // Operators only: a stranger is asked for a key, another org's admin finds nothing.
    let (code, _) = server.anonymous().get("/v1/status").await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    let other = server.org_with_key("other", "admin").await;
    let (code, body) = other.get("/v1/status").await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{body}");

    if db == Db::Postgres {
        // A second replica on the database: each lists both, and one that stops is gone.
        let mut replica = server.replica().await;
        let (_, seen) = server.admin().on(&replica).get("/v1/status").await;
        let theirs = seen["replica"].as_str().unwrap().to_string();
        assert_ne!(theirs, me);
        assert_eq!(ids(&seen), vec![me.clone(), theirs.clone()], "{seen}");
        assert!(replica.stop().await, "the replica stops cleanly");
        let (_, after) = server.admin().get("/v1/status").await;
        assert_eq!(ids(&after), vec![me], "{after}");
    }
}
