//! The dashboard's GraphQL fields over HTTP: `timeline` (a pool's units over a window,
//! with the bookings and node reservation terms each key may see), `capacity` (units by
//! pool, model and state, now, ahead and over the last day) and `Pool.deciders`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Api, Db, HOUR, Server, T0, on_both_databases, register_node};

const TIMELINE: &str = "query($pool: String!, $first: Int, $after: String, $node: String, $model: String, $from: Int, $to: Int) {
  timeline(poolId: $pool, first: $first, after: $after, node: $node, model: $model, from: $from, to: $to) {
    totalCount from to now pageInfo { hasNextPage endCursor }
    edges { cursor node { nodeId lost needsReview
      units { id model deviceClass nvlinkDomain }
      bookings { unitId reservationId tenantId state start end spot active gang }
      terms { id unitIds releasedUnitIds allowedOrgIds startsAt endsAt status } } } } }";

const CAPACITY: &str = "query($pool: String) { capacity(poolId: $pool) { poolId poolName models {
  model utilization
  now { at total booked released reserved free lost }
  ahead { at total booked released reserved free lost }
  hourly { at ratio } } } }";

/// Provider `acme` with nodes `n1` and `n2` of 8 H100s in pool `h100`, offered to
/// `tenant-a` and `tenant-b`; tenant-a books 4 GPUs and tenant-b 2, both for two hours from
/// now; `stranger` has no stake in any of it.
struct Fleet {
    server: Server,
    provider: Api,
    tenant_a: Api,
    tenant_b: Api,
    stranger: Api,
    pool: String,
    booked_a: String,
    booked_b: String,
}

async fn fleet(db: Db) -> Fleet {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    register_node(&provider, "acme", "n2", 8).await;
    let tenant_a = server.org_with_key("tenant-a", "member").await;
    let tenant_b = server.org_with_key("tenant-b", "member").await;
    let stranger = server.org_with_key("stranger", "admin").await;
    let (status, pool) = server
        .admin()
        .post(
            "/v1/pools",
            json!({ "name": "h100", "ownerOrgId": "acme", "nodeIds": ["n1", "n2"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    for tenant in ["tenant-a", "tenant-b"] {
        let (status, offer) = server
            .admin()
            .post(
                &format!("/v1/pools/{pool}/offers"),
                json!({ "tenantId": tenant, "quota": { "gpu": 16 } }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{offer}");
    }
    let booked_a = book(&tenant_a, "tenant-a", &pool, 4).await;
    let booked_b = book(&tenant_b, "tenant-b", &pool, 2).await;
    Fleet {
        server,
        provider,
        tenant_a,
        tenant_b,
        stranger,
        pool,
        booked_a,
        booked_b,
    }
}

/// Books `gpus` GPUs for two hours as `tenant`; returns the reservation's id.
async fn book(api: &Api, tenant: &str, pool: &str, gpus: i64) -> String {
    let body = json!({ "tenantId": tenant, "poolId": pool,
        "devices": [{ "class": "gpu", "count": gpus }], "duration": "2h",
        "idempotencyKey": format!("{tenant}-{gpus}") });
    let (status, r) = api.post("/api/compute/reservations/create", body).await;
    assert_eq!(status, StatusCode::OK, "{r}");
    assert_eq!(r["state"], "placed", "{r}");
    r["id"].as_str().unwrap().to_string()
}

/// The `data` of a query that must succeed.
async fn data(api: &Api, query: &str, variables: Value) -> Value {
    let (status, body) = api
        .post(
            "/graphql",
            json!({ "query": query, "variables": variables }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    body["data"].clone()
}

/// The `extensions.code` of the first error of a query that must fail.
async fn error_code(api: &Api, query: &str, variables: Value) -> String {
    let (_, body) = api
        .post(
            "/graphql",
            json!({ "query": query, "variables": variables }),
        )
        .await;
    body["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("an error code in {body}"))
        .to_string()
}

fn rows(timeline: &Value) -> Vec<Value> {
    timeline["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["node"].clone())
        .collect()
}

fn bookings(timeline: &Value) -> Vec<Value> {
    rows(timeline)
        .iter()
        .flat_map(|r| r["bookings"].as_array().unwrap().clone())
        .collect()
}

on_both_databases!(
    the_timeline_shows_each_key_only_the_bookings_it_may_see,
    the_timeline_pages_and_filters_nodes_and_checks_its_window,
    node_reservation_terms_show_to_their_audience_and_the_nodes_owner,
    capacity_counts_units_by_state_now_ahead_and_over_the_last_day,
    each_pools_deciders_are_named_with_their_decision_counts,
);

async fn the_timeline_shows_each_key_only_the_bookings_it_may_see(db: Db) {
    let f = fleet(db).await;
    let vars = json!({ "pool": f.pool });

    let all = data(&f.server.admin(), TIMELINE, vars.clone()).await["timeline"].clone();
    assert_eq!(all["totalCount"], 2);
    assert_eq!(all["now"], T0);
    assert_eq!(all["from"], T0 - 24 * HOUR);
    assert_eq!(all["to"], T0 + 7 * 24 * HOUR);
    let seen = bookings(&all);
    assert_eq!(seen.len(), 6, "{all}");
    let of = |tenant: &str| seen.iter().filter(|b| b["tenantId"] == tenant).count();
    assert_eq!((of("tenant-a"), of("tenant-b")), (4, 2), "{all}");
    for b in &seen {
        assert_eq!(b["start"], T0);
        assert_eq!(b["end"], T0 + 2 * HOUR);
        assert_eq!(b["spot"], false);
        assert_eq!(b["active"], true);
        assert_eq!(b["state"], "placed");
    }
    let first = &rows(&all)[0];
    assert_eq!(first["units"].as_array().unwrap().len(), 8);
    assert_eq!(first["units"][0]["nvlinkDomain"], "nvl0");
    assert_eq!(first["units"][0]["deviceClass"], "gpu");

    // A tenant sees its own bookings and none of another tenant's.
    for (api, mine, theirs) in [
        (&f.tenant_a, &f.booked_a, &f.booked_b),
        (&f.tenant_b, &f.booked_b, &f.booked_a),
    ] {
        let page = data(api, TIMELINE, vars.clone()).await["timeline"].clone();
        assert_eq!(page["totalCount"], 2);
        let seen = bookings(&page);
        assert!(!seen.is_empty());
        assert!(seen.iter().all(|b| b["reservationId"] == **mine), "{page}");
        assert!(!page.to_string().contains(theirs.as_str()), "{page}");
    }
    assert_eq!(
        bookings(&data(&f.tenant_a, TIMELINE, vars.clone()).await["timeline"]).len(),
        4
    );

    // The nodes' owner sees that units are taken, not by whom.
    let owned = data(&f.provider, TIMELINE, vars.clone()).await["timeline"].clone();
    let seen = bookings(&owned);
    assert_eq!(seen.len(), 6);
    assert!(
        seen.iter().all(|b| b["reservationId"].is_null()
            && b["tenantId"].is_null()
            && b["state"].is_null())
    );

    // An org that is neither offered the pool nor owns it is told it does not exist.
    assert_eq!(error_code(&f.stranger, TIMELINE, vars).await, "NOT_FOUND");
}

async fn the_timeline_pages_and_filters_nodes_and_checks_its_window(db: Db) {
    let f = fleet(db).await;
    let admin = f.server.admin();
    let first =
        data(&admin, TIMELINE, json!({ "pool": f.pool, "first": 1 })).await["timeline"].clone();
    assert_eq!(first["totalCount"], 2);
    assert_eq!(first["pageInfo"]["hasNextPage"], true);
    assert_eq!(first["pageInfo"]["endCursor"], "n1");
    assert_eq!(rows(&first)[0]["nodeId"], "n1");
    let next = data(
        &admin,
        TIMELINE,
        json!({ "pool": f.pool, "first": 1, "after": "n1" }),
    )
    .await["timeline"]
        .clone();
    assert_eq!(rows(&next)[0]["nodeId"], "n2");
    assert_eq!(next["pageInfo"]["hasNextPage"], false);

    let n2 =
        data(&admin, TIMELINE, json!({ "pool": f.pool, "node": "2" })).await["timeline"].clone();
    assert_eq!(n2["totalCount"], 1);
    assert_eq!(rows(&n2)[0]["nodeId"], "n2");
    let none = data(&admin, TIMELINE, json!({ "pool": f.pool, "model": "B200" })).await["timeline"]
        .clone();
    assert_eq!(none["totalCount"], 0);
    assert!(rows(&none).is_empty());
    let h100 = data(
        &admin,
        TIMELINE,
        json!({ "pool": f.pool, "model": "H100-SXM5-80GB" }),
    )
    .await["timeline"]
        .clone();
    assert_eq!(h100["totalCount"], 2);

    // A window that ends before the bookings start shows none of them.
    let before = data(
        &admin,
        TIMELINE,
        json!({ "pool": f.pool, "from": T0 - 2 * HOUR, "to": T0 }),
    )
    .await["timeline"]
        .clone();
    assert!(bookings(&before).is_empty(), "{before}");

    for vars in [
        json!({ "pool": f.pool, "from": T0, "to": T0 }),
        json!({ "pool": f.pool, "from": T0, "to": T0 + 40 * 24 * HOUR }),
        json!({ "pool": f.pool, "after": "no-such-node" }),
        json!({ "pool": f.pool, "first": 501 }),
    ] {
        assert_eq!(error_code(&admin, TIMELINE, vars).await, "INVALID_INPUT");
    }
}

async fn node_reservation_terms_show_to_their_audience_and_the_nodes_owner(db: Db) {
    let f = fleet(db).await;
    let vars = json!({ "pool": f.pool, "node": "n2" });
    // Two units of n2 no booking holds, reserved to tenant-a.
    let page = data(&f.server.admin(), TIMELINE, vars.clone()).await["timeline"].clone();
    let row = &rows(&page)[0];
    let taken: Vec<&Value> = row["bookings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| &b["unitId"])
        .collect();
    let free: Vec<Value> = row["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["id"].clone())
        .filter(|id| !taken.contains(&id))
        .take(2)
        .collect();
    assert_eq!(free.len(), 2);
    let (status, nr) = f
        .server
        .admin()
        .post(
            "/v1/nodes/n2/reservations",
            json!({ "unitIds": free, "allowedOrgIds": ["tenant-a"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");

    for api in [&f.server.admin(), &f.provider, &f.tenant_a] {
        let page = data(api, TIMELINE, vars.clone()).await["timeline"].clone();
        let terms = rows(&page)[0]["terms"].clone();
        assert_eq!(terms.as_array().unwrap().len(), 1, "{page}");
        assert_eq!(terms[0]["id"], nr["id"]);
        assert_eq!(terms[0]["unitIds"], json!(free));
        assert_eq!(terms[0]["allowedOrgIds"], nr["allowedOrgIds"]);
        assert_eq!(terms[0]["status"], "active");
        assert_eq!(terms[0]["startsAt"], T0);
    }
    let page = data(&f.tenant_b, TIMELINE, vars).await["timeline"].clone();
    assert_eq!(rows(&page)[0]["terms"], json!([]), "{page}");

    let counts = data(&f.server.admin(), CAPACITY, json!({ "pool": f.pool })).await;
    let now = &counts["capacity"][0]["models"][0]["now"];
    assert_eq!(now["reserved"], 2, "{counts}");
    assert_eq!(now["free"], 8, "{counts}");
}

async fn capacity_counts_units_by_state_now_ahead_and_over_the_last_day(db: Db) {
    let f = fleet(db).await;
    let all = data(&f.server.admin(), CAPACITY, json!({})).await["capacity"].clone();
    assert_eq!(all.as_array().unwrap().len(), 1);
    let pool = &all[0];
    assert_eq!(pool["poolId"], f.pool.as_str());
    assert_eq!(pool["poolName"], "h100");
    let model = &pool["models"][0];
    assert_eq!(model["model"], "H100-SXM5-80GB");
    assert_eq!(
        model["now"],
        json!({ "at": T0, "total": 16, "booked": 6, "released": 0, "reserved": 0, "free": 10, "lost": 0 })
    );
    let ahead = model["ahead"].as_array().unwrap();
    assert_eq!(ahead.len(), 29, "now and every 6 hours for 7 days");
    assert_eq!(ahead[0], model["now"]);
    assert_eq!(ahead[1]["at"], T0 + 6 * HOUR);
    assert_eq!(
        ahead[1]["booked"], 0,
        "the two-hour bookings have ended by then"
    );
    assert_eq!(ahead[28]["at"], T0 + 7 * 24 * HOUR);
    let hourly = model["hourly"].as_array().unwrap();
    assert_eq!(hourly.len(), 24);
    assert!(
        hourly.iter().all(|h| h["ratio"] == 0.0),
        "nothing booked before now"
    );

    // An hour on, the last hour was 6 of 16 units booked; the day 6 unit-hours of 384.
    f.server.set_clock(T0 + HOUR).await;
    let model =
        data(&f.tenant_a, CAPACITY, json!({ "pool": f.pool })).await["capacity"][0]["models"][0]
            .clone();
    let hourly = model["hourly"].as_array().unwrap();
    assert_eq!(hourly[23]["at"], T0);
    assert_eq!(hourly[23]["ratio"], 6.0 / 16.0);
    assert_eq!(model["utilization"], 6.0 / 384.0);
    assert_eq!(model["now"]["booked"], 6);

    // A tenant sees the pools it is offered; a stranger none, and no pool by id.
    assert_eq!(
        data(&f.tenant_b, CAPACITY, json!({})).await["capacity"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        data(&f.stranger, CAPACITY, json!({})).await["capacity"],
        json!([])
    );
    assert_eq!(
        error_code(&f.stranger, CAPACITY, json!({ "pool": f.pool })).await,
        "NOT_FOUND"
    );
}

async fn each_pools_deciders_are_named_with_their_decision_counts(db: Db) {
    let f = fleet(db).await;
    let query = "{ pools { edges { node { id deciders { kind world pluginId builtIn decisionCount failureCount } } } } }";
    let pools = data(&f.server.admin(), query, json!({})).await["pools"]["edges"].clone();
    let deciders = pools[0]["node"]["deciders"].as_array().unwrap().clone();
    let kinds: Vec<&str> = deciders
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["placement", "preemption", "spend-limit"]);
    let worlds: Vec<&str> = deciders
        .iter()
        .map(|d| d["world"].as_str().unwrap())
        .collect();
    assert_eq!(worlds, ["placer", "preemptor", "spend-guard"]);
    for d in &deciders {
        assert_eq!(d["builtIn"], true);
        assert!(
            d["pluginId"].as_str().unwrap().starts_with("sha256:"),
            "{d}"
        );
        assert_eq!(d["failureCount"], 0);
    }
    assert!(
        deciders[0]["decisionCount"].as_i64().unwrap() >= 2,
        "{pools}"
    );
    // A tenant offered the pool sees who decides in it.
    let seen = data(&f.tenant_a, query, json!({})).await["pools"]["edges"].clone();
    assert_eq!(
        seen[0]["node"]["deciders"][0]["pluginId"],
        deciders[0]["pluginId"]
    );
}
