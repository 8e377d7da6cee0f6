//! Policies as WebAssembly: components built from source, uploaded over HTTP, assigned to
//! pools; hostile ones fail only their own decision.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{
    Api, Db, Server, assert_error, component, list_params, on_both_databases, pages,
    pools_for_tenant_a, register_node,
};

/// A provider with three 8-GPU nodes in two pools (`n1`, `n2` and `n3`), each offered to
/// `tenant-a` with a quota of 64 GPUs.
pub(crate) struct World {
    pub(crate) server: Server,
    pub(crate) tenant: Api,
    pub(crate) pool: String,
    pub(crate) other_pool: String,
}

pub(crate) async fn world(db: Db) -> World {
    world_on(Server::start(db).await).await
}

pub(crate) async fn world_on(server: Server) -> World {
    let provider = server.org_with_key("acme", "provider").await;
    for n in 1..=3 {
        register_node(&provider, "acme", &format!("n{n}"), 8).await;
    }
    let tenant = server.org_with_key("tenant-a", "member").await;
    let pools = pools_for_tenant_a(&server, &[&["n1", "n2"], &["n3"]]).await;
    World {
        server,
        tenant,
        pool: pools[0].clone(),
        other_pool: pools[1].clone(),
    }
}

impl World {
    /// Uploads the built component `file` under its stem as name, version `1.0.0`.
    pub(crate) async fn upload(&self, file: &str) -> Value {
        let bytes = std::fs::read(component(file)).unwrap();
        let (status, plugin) = self
            .server
            .admin()
            .raw(
                Method::POST,
                &format!(
                    "/v1/plugins?name={}&version=1.0.0",
                    file.trim_end_matches(".wasm").replace('_', "-")
                ),
                Some(bytes),
                Some("application/wasm"),
            )
            .await;
        assert!(
            status == StatusCode::CREATED || status == StatusCode::OK,
            "{status} {plugin}"
        );
        plugin
    }

    pub(crate) async fn assign(&self, pool: &str, body: Value) {
        let (status, answer) = self
            .server
            .admin()
            .put(&format!("/v1/pools/{pool}/policies"), body)
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    pub(crate) async fn create(&self, pool: &str, key: &str, gpus: i64) -> (StatusCode, Value) {
        let body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": gpus }], "duration": "2h", "idempotencyKey": key });
        self.tenant
            .post("/api/compute/reservations/create", body)
            .await
    }

    async fn node_of(&self, pool: &str, key: &str) -> String {
        let (status, r) = self.create(pool, key, 1).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r["placement"]["nodeId"]
            .as_str()
            .unwrap_or_else(|| panic!("not placed: {r}"))
            .to_string()
    }
}

on_both_databases!(
    an_uploaded_placer_changes_where_reservations_go,
    uploads_that_are_not_plugins_are_refused_and_plugins_in_use_stay,
    hostile_plugins_fail_only_their_own_decision,
    plugins_cannot_reach_files_environment_or_network_but_read_their_config,
    a_pool_may_fall_back_to_the_default_when_its_plugin_fails,
    swapping_a_pools_placer_under_load_never_fails_or_double_books,
    built_in_plugins_are_listed_and_read_but_never_deleted_or_uploaded,
    plugins_page_by_id_with_the_built_ins_among_them,
    a_pools_policies_show_the_plugin_that_decides_each_policy,
    per_plugin_figures_carry_name_and_version_in_metrics_and_graphql,
);

/// The built-in policies, by name.
const BUILT_IN_NAMES: [&str; 3] = ["placer-default", "preemptor-default", "spend-guard-default"];

/// The names of the built-ins in a page of `GET /v1/plugins`, sorted; every other item must
/// be an uploaded plugin.
fn built_in_names(page: &Value) -> Vec<String> {
    let mut names: Vec<String> = page["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a page: {page}"))
        .iter()
        .filter(|p| p["builtIn"] == true)
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

async fn an_uploaded_placer_changes_where_reservations_go(db: Db) {
    let w = world(db).await;
    // The default packs single GPUs onto the node already in use.
    let first = w.node_of(&w.pool, "d-1").await;
    assert_eq!(w.node_of(&w.pool, "d-2").await, first);
    let spread = w.upload("orl_placer_spread.wasm").await;
    assert_eq!(spread["world"], "placer");
    assert!(spread["id"].as_str().unwrap().starts_with("sha256:"));
    w.assign(&w.pool, json!({ "placement": spread["id"] }))
        .await;
    // Spread takes the emptier node.
    let (_, placed) = w.create(&w.pool, "s-1", 1).await;
    assert_ne!(placed["placement"]["nodeId"], json!(first), "{placed}");
    assert_eq!(
        placed["placement"]["placedBy"], spread["id"],
        "the decision records the plugin that made it"
    );
    let (_, listed) = w.server.admin().get("/v1/plugins").await;
    let listed = listed["items"].as_array().unwrap();
    let stored = listed.iter().find(|p| p["id"] == spread["id"]).unwrap();
    assert_eq!(stored["assignedTo"], json!([w.pool]));
    assert_eq!(stored["builtIn"], false);
    let again = w.upload("orl_placer_spread.wasm").await;
    assert_eq!(
        again["id"], spread["id"],
        "the same bytes under the same name are the same plugin"
    );
    let (status, err) = w
        .server
        .admin()
        .raw(
            Method::POST,
            "/v1/plugins?name=spread&version=1.0.0",
            Some(std::fs::read(component("orl_placer_spread.wasm")).unwrap()),
            None,
        )
        .await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(
        err["error"]["details"]["pluginId"], spread["id"],
        "the same bytes under another name name the stored plugin"
    );
}

async fn uploads_that_are_not_plugins_are_refused_and_plugins_in_use_stay(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    for body in [
        b"definitely not wasm".to_vec(),
        b"\0asm\x01\0\0\0".to_vec(),
        Vec::new(),
    ] {
        let (status, err) = admin
            .raw(
                Method::POST,
                "/v1/plugins?name=x&version=1",
                Some(body),
                None,
            )
            .await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    }
    let (status, err) = admin
        .raw(
            Method::POST,
            "/v1/plugins?name=bad%20name&version=1",
            Some(b"x".to_vec()),
            None,
        )
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, err) = w
        .tenant
        .raw(
            Method::POST,
            "/v1/plugins?name=x&version=1",
            Some(b"x".to_vec()),
            None,
        )
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (_, listed) = admin.get("/v1/plugins").await;
    assert_eq!(
        built_in_names(&listed),
        BUILT_IN_NAMES,
        "nothing stored: the built-ins alone"
    );

    let trap = w.upload("trap.wasm").await;
    let (status, err) = admin
        .put(
            &format!("/v1/pools/{}/policies", w.pool),
            json!({ "preemption": trap["id"] }),
        )
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    w.assign(&w.pool, json!({ "placement": trap["id"] })).await;
    let path = format!("/v1/plugins/{}", trap["id"].as_str().unwrap());
    let (status, err) = admin.delete(&path).await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    w.assign(&w.pool, json!({})).await;
    assert_eq!(admin.delete(&path).await.0, StatusCode::NO_CONTENT);
    assert_eq!(admin.get(&path).await.0, StatusCode::NOT_FOUND);
}

async fn hostile_plugins_fail_only_their_own_decision(db: Db) {
    let w = world(db).await;
    // Only the endless loop meets its deadline: the others get time enough to fail their
    // own way however busy the machine is.
    for (file, kind, deadline_ms) in [
        ("loop_forever.wasm", "deadline", 200),
        ("memory_bomb.wasm", "memory", 5_000),
        ("trap.wasm", "trap", 5_000),
        ("invalid_answer.wasm", "invalid-answer", 5_000),
    ] {
        let plugin = w.upload(file).await;
        w.assign(
            &w.pool,
            json!({ "placement": plugin["id"], "deadlineMs": deadline_ms }),
        )
        .await;
        let (status, err) = w.create(&w.pool, &format!("k-{kind}"), 1).await;
        assert_error(status, &err, StatusCode::BAD_GATEWAY, "POLICY_FAILED");
        assert_eq!(err["error"]["details"]["kind"], kind, "{file}: {err}");
        assert_eq!(err["error"]["details"]["pluginId"], plugin["id"]);
        // The server keeps serving, and another pool keeps placing.
        let (status, ok) = w.create(&w.other_pool, &format!("other-{kind}"), 1).await;
        assert_eq!(
            (status, ok["state"].as_str()),
            (StatusCode::OK, Some("placed")),
            "{ok}"
        );
    }
    let (_, offers) = w
        .server
        .admin()
        .get(&format!("/v1/pools/{}/offers", w.pool))
        .await;
    assert_eq!(
        offers["items"][0]["used"],
        json!({}),
        "a failed decision charges nothing"
    );
    let (_, list) = w
        .tenant
        .post(
            "/api/compute/reservations/list",
            json!({ "tenantId": "tenant-a", "poolId": w.pool }),
        )
        .await;
    assert_eq!(list["items"], json!([]), "and writes nothing");
    let metrics = w.server.metrics().await;
    for outcome in ["deadline", "memory", "trap", "invalid-answer"] {
        assert!(
            (metrics.sum("orl_policy_decisions_total", &[("outcome", outcome)]))
                .is_some_and(|n| n >= 1.0),
            "{outcome} not counted: {metrics}"
        );
    }
}

async fn plugins_cannot_reach_files_environment_or_network_but_read_their_config(db: Db) {
    let w = world(db).await;
    for file in ["escape_fs.wasm", "read_env.wasm", "open_socket.wasm"] {
        let plugin = w.upload(file).await;
        w.assign(
            &w.pool,
            json!({ "placement": plugin["id"], "deadlineMs": 2000 }),
        )
        .await;
        let (status, r) = w.create(&w.pool, &format!("k-{file}"), 1).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        assert_eq!(r["state"], "placed", "{file} escaped its sandbox: {r}");
    }
    let plugin = w.upload("read_config.wasm").await;
    w.assign(
        &w.pool,
        json!({ "placement": plugin["id"], "config": { "spread": "wide" } }),
    )
    .await;
    let (_, r) = w.create(&w.pool, "k-config", 1).await;
    let message = r["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        message.starts_with("CONFIG:") && message.contains("wide"),
        "{r}"
    );
    assert!(
        !message.contains("WRITABLE"),
        "the config directory is read-only: {message}"
    );
    // Another pool running the same plugin with its own config sees only its own.
    w.assign(
        &w.other_pool,
        json!({ "placement": plugin["id"], "config": { "spread": "narrow" } }),
    )
    .await;
    let (_, other) = w.create(&w.other_pool, "k-config-2", 1).await;
    let other = other["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        other.contains("narrow") && !other.contains("wide"),
        "{other}"
    );
    let (_, again) = w.create(&w.pool, "k-config-3", 1).await;
    assert!(
        again["conditions"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("wide"),
        "{again}"
    );
}

async fn a_pool_may_fall_back_to_the_default_when_its_plugin_fails(db: Db) {
    let w = world(db).await;
    let trap = w.upload("trap.wasm").await;
    w.assign(
        &w.pool,
        json!({ "placement": trap["id"], "onPolicyFailure": "fallback" }),
    )
    .await;
    let (status, r) = w.create(&w.pool, "k-1", 2).await;
    assert_eq!(
        (status, r["state"].as_str()),
        (StatusCode::OK, Some("placed")),
        "{r}"
    );
    // The built-in WebAssembly placer decided, and the placement names it by id.
    let (_, plugins) = w.server.admin().get("/v1/plugins").await;
    let built_in = plugins["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["builtIn"] == true && p["world"] == "placer")
        .unwrap_or_else(|| panic!("no built-in placer listed: {plugins}"));
    assert_eq!(r["placement"]["placedBy"], built_in["id"], "{r}");
    let (status, listed) = w
        .server
        .admin()
        .get(&format!(
            "/v1/plugins/{}",
            r["placement"]["placedBy"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    // The plugin's failure is still counted against it.
    let metrics = w.server.metrics().await;
    let trapped = [("plugin", trap["id"].as_str().unwrap()), ("kind", "trap")];
    assert!(
        (metrics.sum("orl_policy_failures_total", &trapped)).is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
}

async fn swapping_a_pools_placer_under_load_never_fails_or_double_books(db: Db) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let w = world(db).await;
    let spread = w.upload("orl_placer_spread.wasm").await;
    let default_placed = w.create(&w.pool, "warm-up", 1).await.1["placement"]["placedBy"].clone();
    // Four clients create and release one GPU after another until every swap is done. After
    // each swap five more are answered: one client then answered two, the second begun
    // after the swap, so every assignment decides at least one create, while others are in
    // flight.
    let done = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (tenant, pool) = (w.tenant.clone(), w.pool.clone());
            let (done, answered) = (done.clone(), answered.clone());
            tokio::spawn(async move {
                let mut placed_by = Vec::new();
                let mut i = 0;
                while !done.load(Ordering::SeqCst) {
                    let body = json!({ "tenantId": "tenant-a", "poolId": pool,
                                       "devices": [{ "class": "gpu", "count": 1 }],
                                       "duration": "2h", "idempotencyKey": format!("load-{c}-{i}") });
                    let (status, r) = tenant.post("/api/compute/reservations/create", body).await;
                    assert_eq!(status, StatusCode::OK, "{r}");
                    assert_eq!(r["state"], "placed", "{r}");
                    placed_by.push(r["placement"]["placedBy"].clone());
                    let release = json!({ "tenantId": "tenant-a", "reservationId": r["id"] });
                    let (status, r) = tenant.post("/api/compute/reservations/release", release).await;
                    assert_eq!(status, StatusCode::OK, "{r}");
                    answered.fetch_add(1, Ordering::SeqCst);
                    i += 1;
                }
                placed_by
            })
        })
        .collect();
    for swap in 0..6 {
        let placement = if swap % 2 == 0 {
            json!({ "placement": spread["id"] })
        } else {
            json!({})
        };
        w.assign(&w.pool, placement).await;
        let target = answered.load(Ordering::SeqCst) + 5;
        while answered.load(Ordering::SeqCst) < target {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
    done.store(true, Ordering::SeqCst);
    let mut placed_by = Vec::new();
    for client in clients {
        placed_by.extend(client.await.unwrap());
    }
    assert!(
        placed_by
            .iter()
            .all(|by| *by == spread["id"] || *by == default_placed),
        "each decision is made by one of the two placers: {placed_by:?}"
    );
    for placer in [&spread["id"], &default_placed] {
        assert!(
            placed_by.contains(placer),
            "{placer} decided during the load: {placed_by:?}"
        );
    }
    // No unit booked twice: the invariants checked when the server stops.
}

async fn built_in_plugins_are_listed_and_read_but_never_deleted_or_uploaded(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    let (status, listed) = admin.get("/v1/plugins").await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 3, "{listed}");
    assert!(listed.get("cursor").is_none(), "{listed}");
    assert_eq!(built_in_names(&listed), BUILT_IN_NAMES);
    for (name, world) in BUILT_IN_NAMES
        .iter()
        .zip(["placer", "preemptor", "spend-guard"])
    {
        let plugin = items.iter().find(|p| p["name"] == *name).unwrap();
        assert_eq!(plugin["world"], world, "{plugin}");
        assert!(
            plugin["id"].as_str().unwrap().starts_with("sha256:"),
            "{plugin}"
        );
        assert!(plugin["size"].as_i64().unwrap() > 0, "{plugin}");
        assert!(
            plugin.get("createdAt").is_none(),
            "never uploaded: {plugin}"
        );
        assert_eq!(plugin["assignedTo"], json!([]), "{plugin}");
    }

    // The id a placement records when the built-in decided answers that plugin.
    let (status, placed) = w.create(&w.pool, "built-in-1", 1).await;
    assert_eq!(status, StatusCode::OK, "{placed}");
    let placed_by = placed["placement"]["placedBy"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/plugins/{}", placed_by.replace(':', "%3A"));
    let (status, plugin) = admin.get(&path).await;
    assert_eq!(status, StatusCode::OK, "{plugin}");
    assert_eq!(
        (&plugin["name"], &plugin["builtIn"], &plugin["world"]),
        (&json!("placer-default"), &json!(true), &json!("placer")),
        "{plugin}"
    );
    // A key that may not read plugins is told none exists, built-in or not.
    let (status, err) = w.tenant.get(&path).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, err) = w.tenant.get("/v1/plugins").await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");

    // A built-in cannot be deleted, and stays.
    let (status, err) = admin.delete(&path).await;
    assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
    assert_eq!(
        err["error"]["details"]["pluginId"],
        json!(placed_by),
        "{err}"
    );
    assert_eq!(err["error"]["details"]["builtIn"], true, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("built-in"),
        "{err}"
    );
    assert_eq!(admin.get(&path).await.0, StatusCode::OK);

    // Its bytes uploaded are the same conflict as any bytes already there, under any name.
    let bytes = std::fs::read(env!("ORL_PLACER_DEFAULT_WASM")).unwrap();
    for query in [
        "name=mine&version=1.0.0",
        "name=placer-default&version=1.0.0",
    ] {
        let (status, err) = admin
            .raw(
                Method::POST,
                &format!("/v1/plugins?{query}"),
                Some(bytes.clone()),
                Some("application/wasm"),
            )
            .await;
        assert_error(status, &err, StatusCode::CONFLICT, "CONFLICT");
        assert_eq!(
            err["error"]["details"]["pluginId"],
            json!(placed_by),
            "{err}"
        );
        assert_eq!(err["error"]["details"]["name"], "placer-default", "{err}");
    }
    let (_, listed) = admin.get("/v1/plugins").await;
    assert_eq!(
        listed["items"].as_array().unwrap().len(),
        3,
        "nothing stored: {listed}"
    );

    // A built-in is run by assigning nothing; naming it is refused, saying so.
    let (status, err) = admin
        .put(
            &format!("/v1/pools/{}/policies", w.pool),
            json!({ "placement": placed_by }),
        )
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("placer-default"),
        "{err}"
    );
}

async fn plugins_page_by_id_with_the_built_ins_among_them(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    let mut uploaded = Vec::new();
    for file in ["orl_placer_spread.wasm", "trap.wasm", "preempt_oldest.wasm"] {
        uploaded.push(w.upload(file).await["id"].as_str().unwrap().to_string());
    }
    let (_, whole) = admin.get("/v1/plugins?limit=200").await;
    let all: Vec<String> = whole["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(all.len(), 6, "three built-in, three uploaded: {whole}");
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(all, sorted, "by id");
    for id in &uploaded {
        let plugin = whole["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == json!(id))
            .unwrap();
        assert_eq!(plugin["builtIn"], false, "{plugin}");
        assert!(plugin["createdAt"].is_string(), "{plugin}");
    }

    let paged = pages(&admin, "/v1/plugins", 4, "id").await;
    assert_eq!(paged.len(), 2, "a full page and the rest: {paged:?}");
    let paged: Vec<String> = paged.concat();
    assert_eq!(paged, all, "the pages hold every plugin once, in order");
    let (_, exact) = admin.get("/v1/plugins?limit=6").await;
    assert!(
        exact.get("cursor").is_none(),
        "an exactly full last page has no cursor: {exact}"
    );
    for bad in [
        "/v1/plugins?limit=0",
        "/v1/plugins?limit=201",
        "/v1/plugins?cursor=a%20b",
    ] {
        let (status, err) = admin.get(bad).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    }
    assert_eq!(
        list_params(&w.server, "/v1/plugins").await,
        ["limit", "cursor"]
    );
    let (_, doc) = w.server.anonymous().get("/openapi.json").await;
    let plugin = &doc["components"]["schemas"]["Plugin"];
    assert!(plugin["properties"].get("builtIn").is_some(), "{plugin}");
}

async fn a_pools_policies_show_the_plugin_that_decides_each_policy(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    let path = format!("/v1/pools/{}/policies", w.pool);
    let (_, listed) = admin.get("/v1/plugins").await;
    let id_of = |name: &str| {
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["id"]
            .clone()
    };
    let (status, policies) = w.tenant.get(&path).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a tenant offered the pool sees it: {policies}"
    );
    for (field, name, world) in [
        ("placement", "placer-default", "placer"),
        ("preemption", "preemptor-default", "preemptor"),
        ("spendLimit", "spend-guard-default", "spend-guard"),
    ] {
        assert_eq!(
            policies["effective"][field],
            json!({ "pluginId": id_of(name), "name": name, "world": world, "builtIn": true }),
            "{policies}"
        );
    }

    let spread = w.upload("orl_placer_spread.wasm").await;
    let (status, answer) = admin.put(&path, json!({ "placement": spread["id"] })).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["effective"]["placement"]["pluginId"], spread["id"]);
    let (_, policies) = admin.get(&path).await;
    assert_eq!(
        policies["effective"]["placement"],
        json!({ "pluginId": spread["id"], "name": "orl-placer-spread", "world": "placer", "builtIn": false }),
        "{policies}"
    );
    assert_eq!(
        policies["effective"]["preemption"]["builtIn"], true,
        "{policies}"
    );
    // An answer sent back as it is changes nothing: `effective` is only read.
    let (status, again) = admin.put(&path, policies.clone()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["placement"], spread["id"]);
    assert_eq!(again["effective"], policies["effective"]);
    // The placement records the plugin `effective` named.
    let (_, placed) = w.create(&w.pool, "effective-1", 1).await;
    assert_eq!(placed["placement"]["placedBy"], spread["id"], "{placed}");
    let (status, back) = admin.put(&path, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{back}");
    assert_eq!(
        back["effective"]["placement"]["pluginId"],
        id_of("placer-default")
    );
}

/// Each plugin's figures are labelled in `/metrics` with its id, name and version (a
/// built-in: its built-in name and the server's version), one series per plugin and world,
/// and GraphQL's `Plugin` shows the same counts; a failing plugin is counted under its kind.
async fn per_plugin_figures_carry_name_and_version_in_metrics_and_graphql(db: Db) {
    let w = world(db).await;
    let (status, placed) = w.create(&w.other_pool, "built-in-1", 1).await;
    assert_eq!(status, StatusCode::OK, "{placed}");
    let spread = w.upload("orl_placer_spread.wasm").await;
    w.assign(&w.pool, json!({ "placement": spread["id"] }))
        .await;
    for key in ["spread-1", "spread-2", "spread-3"] {
        let (status, r) = w.create(&w.pool, key, 1).await;
        assert_eq!(
            (status, r["state"].as_str()),
            (StatusCode::OK, Some("placed")),
            "{r}"
        );
    }
    let trap = w.upload("trap.wasm").await;
    w.assign(&w.other_pool, json!({ "placement": trap["id"] }))
        .await;
    for key in ["trap-1", "trap-2"] {
        let (status, err) = w.create(&w.other_pool, key, 1).await;
        assert_error(status, &err, StatusCode::BAD_GATEWAY, "POLICY_FAILED");
    }

    let metrics = w.server.metrics().await;
    let labels = |id: &Value, name: &str, version: &str| {
        format!(
            r#"plugin="{}",name="{name}",version="{version}",world="placer""#,
            id.as_str().unwrap()
        )
    };
    let of_spread = labels(&spread["id"], "orl-placer-spread", "1.0.0");
    let of_trap = labels(&trap["id"], "trap", "1.0.0");
    for (series, count) in [
        (
            format!(r#"orl_policy_decisions_total{{{of_spread},outcome="placed"}}"#),
            3.0,
        ),
        (
            format!("orl_policy_decision_duration_seconds_count{{{of_spread}}}"),
            3.0,
        ),
        (
            format!(r#"orl_policy_decision_duration_seconds_bucket{{le="+Inf",{of_spread}}}"#),
            3.0,
        ),
        (
            format!(r#"orl_policy_decisions_total{{{of_trap},outcome="trap"}}"#),
            2.0,
        ),
        (
            format!(r#"orl_policy_failures_total{{{of_trap},kind="trap"}}"#),
            2.0,
        ),
        (
            format!("orl_policy_decision_duration_seconds_count{{{of_trap}}}"),
            2.0,
        ),
    ] {
        assert_eq!(metrics.get(&series), Some(count), "{series}");
    }
    let (_, listed) = w.server.admin().get("/v1/plugins").await;
    let built_in = (listed["items"].as_array().unwrap().iter())
        .find(|p| p["name"] == "placer-default")
        .unwrap();
    let of_built_in = labels(&built_in["id"], "placer-default", env!("CARGO_PKG_VERSION"));
    let placed = format!(r#"orl_policy_decisions_total{{{of_built_in},outcome="placed"}}"#);
    assert!(metrics.get(&placed).is_some_and(|n| n >= 1.0), "{metrics}");
    for plugin in [&spread, &trap, built_in] {
        let id = plugin["id"].as_str().unwrap();
        let timed = (metrics.samples())
            .filter(|(series, _)| series.starts_with("orl_policy_decision_duration_seconds_count{"))
            .filter(|(series, _)| series.contains(&format!(r#"plugin="{id}""#)))
            .count();
        assert_eq!(timed, 1, "one series per plugin and world: {metrics}");
    }

    let query = "{ plugins(first: 500) { edges { node { id name version decisionCount failureCount decisions { world outcome count } failures { world kind count } latency { world count sumSeconds p50Seconds p99Seconds buckets { le count } } } } } }";
    let (status, body) = w
        .server
        .admin()
        .post("/graphql", json!({ "query": query }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    let node = |plugin: &Value| -> Value {
        (body["data"]["plugins"]["edges"].as_array().unwrap().iter())
            .map(|e| e["node"].clone())
            .find(|n| n["id"] == plugin["id"])
            .unwrap_or_else(|| panic!("{} not listed: {body}", plugin["id"]))
    };
    let shown = node(&spread);
    assert_eq!(
        (&shown["name"], &shown["version"]),
        (&json!("orl-placer-spread"), &json!("1.0.0"))
    );
    assert_eq!(
        shown["decisions"],
        json!([{ "world": "placer", "outcome": "placed", "count": 3 }])
    );
    assert_eq!(shown["failures"], json!([]));
    assert_eq!(
        (&shown["decisionCount"], &shown["failureCount"]),
        (&json!(3), &json!(0))
    );
    let latency = &shown["latency"][0];
    assert_eq!(
        (&latency["world"], &latency["count"]),
        (&json!("placer"), &json!(3))
    );
    let sum = (metrics.get(&format!(
        "orl_policy_decision_duration_seconds_sum{{{of_spread}}}"
    )))
    .expect("the spread placer's decisions are timed");
    assert!(
        (latency["sumSeconds"].as_f64().unwrap() - sum).abs() < 1e-9,
        "{latency} {sum}"
    );
    let (p50, p99) = (
        latency["p50Seconds"].as_f64().unwrap(),
        latency["p99Seconds"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p99, "{latency}");
    let buckets = latency["buckets"].as_array().unwrap();
    assert_eq!(
        buckets.last().unwrap(),
        &json!({ "le": null, "count": 3 }),
        "{latency}"
    );
    let le = buckets.iter().find(|b| b["count"] == 3).unwrap()["le"].as_f64();
    assert!(le.is_none_or(|le| p99 <= le), "{latency}");

    let shown = node(&trap);
    assert_eq!(
        shown["failures"],
        json!([{ "world": "placer", "kind": "trap", "count": 2 }])
    );
    assert_eq!(
        shown["decisions"],
        json!([{ "world": "placer", "outcome": "trap", "count": 2 }])
    );
    assert_eq!(
        (&shown["decisionCount"], &shown["failureCount"]),
        (&json!(2), &json!(2))
    );
    assert_eq!(shown["latency"][0]["count"], 2);
    let shown = node(built_in);
    assert_eq!(shown["version"], env!("CARGO_PKG_VERSION"));
    assert!(shown["decisionCount"].as_i64().unwrap() >= 1, "{shown}");
}
