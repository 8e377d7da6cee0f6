//! GraphQL at `/graphql`: queries and mutations over HTTP, subscriptions over WebSocket,
//! the same keys, visibility and error codes as REST, and the limits on what one operation
//! may ask for.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Api, Db, HOUR, Server, Socket, T0, at, on_both_databases, register_node};

const MINUTE: i64 = 60_000;
/// Every field of the `earnings` query, named as REST names them.
const EARNINGS: &str = "query($org: String!) { earnings(orgId: $org) {
    orgId currency asOf grossMinor earnedMinor paidOutMinor availableMinor providerShareBps
    gpuSeconds activeRentals
    byNode { nodeId grossMinor earnedMinor gpuSeconds }
    byModel { model grossMinor earnedMinor gpuSeconds }
    byDay { day grossMinor earnedMinor gpuSeconds }
    recentPayouts { id amountMinor reference createdAt } } }";

/// Provider `acme` with nodes `n1` and `n2` of 8 H100s in a pool offered to `tenant-a`
/// with 16 GPUs of quota; `stranger` is an org with no stake in any of it.
struct World {
    server: Server,
    provider: Api,
    tenant: Api,
    stranger: Api,
    tenant_key: String,
    pool: String,
}

async fn world(db: Db) -> World {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    register_node(&provider, "acme", "n2", 8).await;
    server.org_with_key("tenant-a", "viewer").await;
    let tenant_key = server.key_in("tenant-a", json!({ "role": "member" })).await;
    let tenant = server.as_key(&tenant_key);
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
    let (status, offer) = server
        .admin()
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": 16 } }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
    World {
        server,
        provider,
        tenant,
        stranger,
        tenant_key,
        pool,
    }
}

impl World {
    /// Books `gpus` GPUs for two hours as tenant-a over the RPC.
    async fn book(&self, key: &str, gpus: i64) -> Value {
        let body = json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": [{ "class": "gpu", "count": gpus }], "duration": "2h", "idempotencyKey": key });
        let (status, r) = self
            .tenant
            .post("/api/compute/reservations/create", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    /// Prices tenant-a's offer at `price` minor units per GPU-hour.
    async fn price(&self, price: i64) {
        let (status, offer) = self
            .server
            .admin()
            .post(
                &format!("/v1/pools/{}/offers", self.pool),
                json!({ "tenantId": "tenant-a", "quota": { "gpu": 16 }, "pricePerGpuHour": price }),
            )
            .await;
        assert!(status.is_success(), "{offer}");
    }
}

/// The whole GraphQL response to `query` as `api`.
async fn graphql(api: &Api, query: &str, variables: Value) -> (StatusCode, Value) {
    api.post(
        "/graphql",
        json!({ "query": query, "variables": variables }),
    )
    .await
}

/// The `data` of a query that must succeed.
async fn data(api: &Api, query: &str, variables: Value) -> Value {
    let (status, body) = graphql(api, query, variables).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    body["data"].clone()
}

/// The `extensions.code` of the first error of a query that must fail.
async fn error_code(api: &Api, query: &str, variables: Value) -> String {
    let (_, body) = graphql(api, query, variables).await;
    let code = &body["errors"][0]["extensions"]["code"];
    assert!(code.is_string(), "{body}");
    code.as_str().unwrap().to_string()
}

fn ids(connection: &Value) -> Vec<String> {
    connection["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            e["node"]["id"]
                .as_str()
                .map_or_else(|| e["node"]["id"].to_string(), str::to_string)
        })
        .collect()
}

on_both_databases!(
    every_query_shows_what_rest_shows_to_the_same_key,
    another_org_sees_nothing_of_what_it_may_not_read,
    mutations_follow_rest_semantics_and_carry_rest_error_codes,
    depth_complexity_and_page_size_are_capped,
    a_thousand_nodes_with_units_and_bookings_cost_one_batched_query_per_page,
    subscriptions_receive_rest_changes_filtered_by_visibility,
    the_dashboard_example_runs_and_the_cli_prints_the_schema,
    earnings_show_what_rest_shows_to_the_same_key_as_the_clock_moves,
    another_org_asking_for_earnings_is_told_the_org_does_not_exist,
    a_gang_placement_lists_one_member_per_node_as_rest_does,
    a_managing_org_pages_a_nodes_reservations_it_manages_now_whatever_it_manages_later,
);

async fn every_query_shows_what_rest_shows_to_the_same_key(db: Db) {
    let w = world(db).await;
    let (status, held) = w
        .server
        .admin()
        .post(
            "/v1/nodes/n2/reservations",
            json!({ "unitIds": ["n2-gpu6", "n2-gpu7"], "allowedOrgIds": ["tenant-a"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    let r = w.book("k-1", 4).await;
    assert_eq!(r["state"], "placed", "{r}");
    let placed_on = r["placement"]["nodeId"].as_str().unwrap().to_string();

    let viewer = data(
        &w.tenant,
        "{ viewer { orgId keyId permissions agent ops } }",
        json!({}),
    )
    .await;
    assert_eq!(viewer["viewer"]["orgId"], "tenant-a");
    assert_eq!(viewer["viewer"]["ops"], false);
    assert!(
        viewer["viewer"]["permissions"]
            .as_array()
            .unwrap()
            .contains(&json!("compute:reservations:create"))
    );

    let nodes = data(
        &w.provider,
        "query($from: Int!, $to: Int!) { nodes { pageInfo { hasNextPage }
           edges { cursor node { id orgId labels conditions units { id nvlinkDomain memoryGiB labels } nvlinkDomains { id unitIds }
             bookings { reservationId unitId start end active }
             utilization(from: $from, to: $to) { gpuUnits bookedUnitMs ratio } } } } }",
        json!({ "from": T0, "to": T0 + 4 * HOUR }),
    )
    .await;
    let (_, rest_nodes) = w.provider.get("/v1/orgs/acme/provider/nodes").await;
    let rest_ids: Vec<String> = rest_nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids(&nodes["nodes"]), rest_ids);
    for (edge, rest) in nodes["nodes"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .zip(rest_nodes["items"].as_array().unwrap())
    {
        assert_eq!(
            edge["node"]["labels"], rest["labels"],
            "labels as REST shows them"
        );
        assert_eq!(
            edge["node"]["conditions"], rest["conditions"],
            "conditions as REST shows them"
        );
    }
    assert_eq!(nodes["nodes"]["pageInfo"]["hasNextPage"], false);
    for edge in nodes["nodes"]["edges"].as_array().unwrap() {
        let node = &edge["node"];
        assert_eq!(node["units"].as_array().unwrap().len(), 8);
        assert_eq!(node["nvlinkDomains"].as_array().unwrap().len(), 2);
        assert_eq!(
            node["nvlinkDomains"][0]["unitIds"]
                .as_array()
                .unwrap()
                .len(),
            4
        );
        let bookings = node["bookings"].as_array().unwrap();
        if node["id"] == placed_on.as_str() {
            assert_eq!(bookings.len(), 4, "{node}");
            assert!(bookings.iter().all(|b| b["reservationId"] == r["id"]
                && b["start"] == T0
                && b["end"] == T0 + 2 * HOUR));
            assert_eq!(node["utilization"]["gpuUnits"], 8);
            assert_eq!(node["utilization"]["bookedUnitMs"], 4 * 2 * HOUR);
            assert_eq!(node["utilization"]["ratio"], 0.25);
        } else {
            assert!(bookings.is_empty());
            assert_eq!(node["utilization"]["ratio"], 0.0);
        }
    }
    let one = data(
        &w.provider,
        "{ node(id: \"n1\") { id region vcpu memoryGiB } }",
        json!({}),
    )
    .await;
    assert_eq!(one["node"]["id"], "n1");
    assert_eq!(one["node"]["memoryGiB"], 2048);

    let on_node = data(
        &w.provider,
        "{ nodeReservations(nodeId: \"n2\") { edges { node { id status reservedUnitIds } } } }",
        json!({}),
    )
    .await;
    assert_eq!(
        ids(&on_node["nodeReservations"]),
        vec![held["id"].as_str().unwrap().to_string()]
    );
    assert_eq!(
        on_node["nodeReservations"]["edges"][0]["node"]["status"],
        "active"
    );
    let for_org = data(
        &w.tenant,
        "{ nodeReservations(orgId: \"tenant-a\", status: \"active\") { edges { node { id } } } }",
        json!({}),
    )
    .await;
    assert_eq!(
        ids(&for_org["nodeReservations"]),
        ids(&on_node["nodeReservations"])
    );

    let compute = data(&w.tenant, "{ computeReservations { pageInfo { hasNextPage } edges { node { id state tenantId placement { nodeId unitIds } request } } } }", json!({})).await;
    assert_eq!(
        ids(&compute["computeReservations"]),
        vec![r["id"].as_str().unwrap().to_string()]
    );
    let got = &compute["computeReservations"]["edges"][0]["node"];
    assert_eq!(got["state"], "placed");
    assert_eq!(got["placement"]["unitIds"], r["placement"]["unitIds"]);
    assert_eq!(got["request"], r["request"]);
    let single = data(
        &w.tenant,
        "query($id: String!) { computeReservation(id: $id) { id end } }",
        json!({ "id": r["id"] }),
    )
    .await;
    assert_eq!(single["computeReservation"]["end"], r["end"]);

    let pools = data(&w.tenant, "{ pools { edges { node { id ownerOrgId nodeIds offers { edges { node { tenantId quota { resource limit used remaining } } } } policies { onPolicyFailure } } } } }", json!({})).await;
    let pool = &pools["pools"]["edges"][0]["node"];
    assert_eq!(pool["id"], w.pool.as_str());
    assert_eq!(
        pool["offers"]["edges"][0]["node"]["quota"],
        json!([{ "resource": "gpu", "limit": 16, "used": 4, "remaining": 12 }])
    );
    assert_eq!(pool["policies"]["onPolicyFailure"], "fail");
    let offers = data(
        &w.tenant,
        "query($pool: String!) { offers(poolId: $pool) { edges { node { tenantId quota { resource used } } } } }",
        json!({ "pool": w.pool }),
    )
    .await;
    assert_eq!(offers["offers"]["edges"][0]["node"]["quota"][0]["used"], 4);

    let catalog = data(
        &w.tenant,
        "{ catalog { orgId nodes { nodeId units { id tier reservationId } } } }",
        json!({}),
    )
    .await;
    let (_, rest_catalog) = w.tenant.get("/v1/orgs/tenant-a/catalog").await;
    assert_eq!(
        catalog["catalog"]["nodes"].as_array().unwrap().len(),
        rest_catalog["nodes"].as_array().unwrap().len()
    );
    let reserved: Vec<&Value> = catalog["catalog"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|n| n["units"].as_array().unwrap())
        .filter(|u| u["tier"] == "reserved")
        .collect();
    assert_eq!(reserved.len(), 2);

    let plugins = data(&w.server.admin(), "{ plugins { pageInfo { hasNextPage } edges { node { id name builtIn createdAt assignedTo decisionCount failureCount decisions { world outcome count } } } } }", json!({})).await;
    let (_, rest_plugins) = w.server.admin().get("/v1/plugins").await;
    assert_eq!(plugins["plugins"]["pageInfo"]["hasNextPage"], false);
    let plugins: Vec<&Value> = plugins["plugins"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["node"])
        .collect();
    assert_eq!(plugins.len(), 3, "the built-ins: {plugins:?}");
    for (plugin, listed) in plugins
        .iter()
        .zip(rest_plugins["items"].as_array().unwrap())
    {
        assert_eq!(plugin["id"], listed["id"], "by id, as REST lists them");
        assert_eq!(
            (
                &plugin["builtIn"],
                &plugin["createdAt"],
                &plugin["assignedTo"]
            ),
            (&json!(true), &Value::Null, &json!([])),
            "{plugin}"
        );
    }
    assert_eq!(
        error_code(
            &w.tenant,
            "{ plugins { edges { node { id } } } }",
            json!({})
        )
        .await,
        "NOT_FOUND"
    );

    let events = data(
        &w.tenant,
        "{ events(first: 100) { edges { cursor node { id type objectId payload } } } }",
        json!({}),
    )
    .await;
    let (_, rest_events) = w.tenant.get("/v1/events").await;
    let rest_event_ids: Vec<String> = rest_events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].to_string())
        .collect();
    assert_eq!(ids(&events["events"]), rest_event_ids);
    assert!(
        events["events"]["edges"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["node"]["type"] == "reservation.placed")
    );

    let audit = data(&w.server.admin(), "{ audit(first: 3) { pageInfo { hasNextPage } edges { cursor node { id action objectType } } } }", json!({})).await;
    assert_eq!(audit["audit"]["edges"].as_array().unwrap().len(), 3);
    assert_eq!(audit["audit"]["pageInfo"]["hasNextPage"], true);
    let cursor = audit["audit"]["edges"][2]["cursor"].clone();
    let next = data(
        &w.server.admin(),
        "query($after: String) { audit(first: 3, after: $after) { edges { node { id } } } }",
        json!({ "after": cursor }),
    )
    .await;
    let (_, rest_audit) = w.server.admin().get("/v1/audit?limit=6").await;
    let rest_audit_ids: Vec<String> = rest_audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        [ids(&audit["audit"]), ids(&next["audit"])].concat(),
        rest_audit_ids
    );
    assert_eq!(
        error_code(&w.tenant, "{ audit { edges { node { id } } } }", json!({})).await,
        "NOT_FOUND"
    );
}

async fn another_org_sees_nothing_of_what_it_may_not_read(db: Db) {
    let w = world(db).await;
    let r = w.book("k-1", 2).await;
    let (status, held) = w
        .server
        .admin()
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": ["n1-gpu7"], "allowedOrgIds": ["tenant-a"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    let s = &w.stranger;
    for query in [
        "{ nodes(orgId: \"acme\") { edges { node { id } } } }",
        "{ node(id: \"n1\") { id } }",
        "{ nodeReservations(nodeId: \"n1\") { edges { node { id } } } }",
        "{ nodeReservations(orgId: \"tenant-a\") { edges { node { id } } } }",
        "{ computeReservations(tenantId: \"tenant-a\", scope: \"all\") { edges { node { id } } } }",
        "{ catalog(orgId: \"tenant-a\") { orgId } }",
        "{ audit(orgId: \"acme\") { edges { node { id } } } }",
        "{ earnings(orgId: \"acme\") { orgId } }",
    ] {
        assert_eq!(
            error_code(s, query, json!({})).await,
            "NOT_FOUND",
            "{query}"
        );
    }
    let code = error_code(
        s,
        "query($id: String!) { computeReservation(tenantId: \"tenant-a\", id: $id) { id } }",
        json!({ "id": r["id"] }),
    )
    .await;
    assert_eq!(code, "NOT_FOUND");
    let code = error_code(
        s,
        "query($pool: String!) { offers(poolId: $pool) { edges { node { tenantId } } } }",
        json!({ "pool": w.pool }),
    )
    .await;
    assert_eq!(code, "NOT_FOUND");
    let seen = data(s, "{ pools { edges { node { id } } } nodes { edges { node { id } } } events { edges { node { id objectId } } } audit { edges { node { orgId } } } }", json!({})).await;
    assert_eq!(seen["pools"]["edges"], json!([]));
    assert_eq!(seen["nodes"]["edges"], json!([]));
    assert_eq!(
        seen["events"]["edges"],
        json!([]),
        "no event of another org"
    );
    assert!(
        seen["audit"]["edges"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["node"]["orgId"] == "stranger")
    );

    let (status, body) = graphql(&w.server.anonymous(), "{ viewer { orgId } }", json!({})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["errors"][0]["extensions"]["code"], "UNAUTHENTICATED");
    let (status, _) = graphql(
        &w.server.as_key("or_notakeyatallreally"),
        "{ viewer { orgId } }",
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

async fn mutations_follow_rest_semantics_and_carry_rest_error_codes(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    let create = "mutation($units: [String!]!) { createNodeReservation(nodeId: \"n1\", input: { unitIds: $units, allowedOrgIds: [\"tenant-a\"], reason: \"deal\" }) { id status reservedUnitIds allowedOrgIds } }";
    let created = data(&admin, create, json!({ "units": ["n1-gpu0", "n1-gpu1"] })).await;
    let nr = created["createNodeReservation"].clone();
    assert_eq!(nr["status"], "active");
    assert_eq!(nr["allowedOrgIds"], json!(["tenant-a", "ops"]));
    let (_, rest) = w
        .provider
        .get(&format!(
            "/v1/nodes/n1/reservations/{}",
            nr["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(rest["reservedUnitIds"], nr["reservedUnitIds"]);
    assert_eq!(
        error_code(&admin, create, json!({ "units": ["n1-gpu1"] })).await,
        "CONFLICT"
    );
    assert_eq!(
        error_code(&w.tenant, create, json!({ "units": ["n1-gpu5"] })).await,
        "NOT_FOUND"
    );
    assert_eq!(
        error_code(&admin, create, json!({ "units": [] })).await,
        "INVALID_INPUT"
    );
    let (_, body) = graphql(&admin, create, json!({ "units": [] })).await;
    assert_eq!(
        body["errors"][0]["extensions"]["details"]["field"],
        "unitIds"
    );

    let release = "mutation($id: String!) { releaseNodeReservationUnits(nodeId: \"n1\", id: $id, unitIds: [\"n1-gpu1\"]) { releasedUnitIds } }";
    let released = data(&w.provider, release, json!({ "id": nr["id"] })).await;
    assert_eq!(
        released["releaseNodeReservationUnits"]["releasedUnitIds"],
        json!(["n1-gpu1"])
    );
    let end = "mutation($id: String!) { endNodeReservation(nodeId: \"n1\", id: $id, reason: \"done\") { status } }";
    assert_eq!(
        error_code(&w.provider, end, json!({ "id": nr["id"] })).await,
        "NOT_FOUND"
    );
    let ended = data(&admin, end, json!({ "id": nr["id"] })).await;
    assert_eq!(ended["endNodeReservation"]["status"], "cancelled");

    let book = "mutation($input: JSON!) { createComputeReservation(input: $input) { id state end placement { nodeId } } }";
    let ask = |key: &str, gpus: i64, start: i64| json!({ "tenantId": "tenant-a", "poolId": w.pool, "devices": [{ "class": "gpu", "count": gpus }], "duration": "2h", "start": start, "idempotencyKey": key });
    let r = data(&w.tenant, book, json!({ "input": ask("g-1", 4, T0) })).await["createComputeReservation"].clone();
    assert_eq!(r["state"], "placed");
    let replay = data(&w.tenant, book, json!({ "input": ask("g-1", 4, T0) })).await;
    assert_eq!(
        replay["createComputeReservation"]["id"], r["id"],
        "idempotent as over REST"
    );
    let (_, rest) = w
        .tenant
        .post(
            "/api/compute/reservations/get",
            json!({ "tenantId": "tenant-a", "reservationId": r["id"] }),
        )
        .await;
    assert_eq!(rest["state"], "placed");
    assert_eq!(
        error_code(&w.tenant, book, json!({ "input": ask("g-2", 13, T0) })).await,
        "QUOTA_EXCEEDED"
    );
    let mut unknown = ask("g-3", 1, T0);
    unknown["colour"] = json!("blue");
    assert_eq!(
        error_code(&w.tenant, book, json!({ "input": unknown })).await,
        "INVALID_INPUT"
    );

    let extend = "mutation($input: JSON!) { extendComputeReservation(input: $input) { extended availableUntil reservation { end } } }";
    let by = json!({ "tenantId": "tenant-a", "reservationId": r["id"], "by": "1h", "idempotencyKey": "e-1" });
    let extended = data(&w.tenant, extend, json!({ "input": by })).await;
    assert_eq!(extended["extendComputeReservation"]["extended"], true);
    assert_eq!(
        extended["extendComputeReservation"]["reservation"]["end"],
        T0 + 3 * HOUR
    );

    let later = data(
        &w.tenant,
        book,
        json!({ "input": ask("g-4", 2, T0 + 10 * HOUR) }),
    )
    .await["createComputeReservation"]
        .clone();
    let cancel = "mutation($id: String!) { cancelComputeReservation(input: { reservationId: $id }) { state } }";
    assert_eq!(
        data(&w.tenant, cancel, json!({ "id": later["id"] })).await["cancelComputeReservation"]["state"],
        "cancelled"
    );
    let release = "mutation($id: String!) { releaseComputeReservation(input: { tenantId: \"tenant-a\", reservationId: $id }) { state reason } }";
    let released = data(&w.tenant, release, json!({ "id": r["id"] })).await;
    assert_eq!(released["releaseComputeReservation"]["state"], "released");
    assert_eq!(
        error_code(&w.tenant, cancel, json!({ "id": r["id"] })).await,
        "INVALID_STATE"
    );
    assert_eq!(
        error_code(&w.stranger, release, json!({ "id": r["id"] })).await,
        "NOT_FOUND"
    );
    let (_, offers) = admin.get(&format!("/v1/pools/{}/offers", w.pool)).await;
    assert_eq!(
        offers["items"][0]["used"]["gpu"].as_i64().unwrap_or(0),
        0,
        "quota refunded as over REST"
    );
}

async fn depth_complexity_and_page_size_are_capped(db: Db) {
    let w = world(db).await;
    let admin = w.server.admin();
    // `__schema types fields type`, `ofTypes` ofType fields, then `name`: 16 fields deep
    // (the limit) with 11, one too deep with 12.
    let deep = |of_types: usize| {
        let mut deep = "name".to_string();
        for _ in 0..of_types {
            deep = format!("ofType {{ {deep} }}");
        }
        format!("{{ __schema {{ types {{ fields {{ type {{ {deep} }} }} }} }} }}")
    };
    data(&admin, &deep(11), json!({})).await;
    let (_, body) = graphql(&admin, &deep(12), json!({})).await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nested too deep"),
        "{body}"
    );
    let graphiql_depth = "{ __schema { types { fields { args { type { ofType { ofType { ofType { ofType { ofType { ofType { ofType { name } } } } } } } } } } } } }";
    data(&admin, graphiql_depth, json!({})).await;

    let page = "nodes(orgId: \"acme\", first: 500) { edges { node { id units { id model } bookings { unitId } } } }";
    let aliases: String = (0..20).map(|i| format!("a{i}: {page} ")).collect();
    let (_, body) = graphql(&admin, &format!("{{ {aliases} }}"), json!({})).await;
    assert!(
        body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("too complex"),
        "{body}"
    );
    data(&admin, &format!("{{ {page} }}"), json!({})).await;

    assert_eq!(
        error_code(
            &admin,
            "{ nodes(orgId: \"acme\", first: 501) { edges { cursor } } }",
            json!({})
        )
        .await,
        "INVALID_INPUT"
    );
    assert_eq!(
        error_code(
            &admin,
            "{ events(first: 0) { edges { cursor } } }",
            json!({})
        )
        .await,
        "INVALID_INPUT"
    );
    assert_eq!(
        error_code(
            &admin,
            "{ nodes(orgId: \"acme\", after: \"no such node\") { edges { cursor } } }",
            json!({})
        )
        .await,
        "INVALID_INPUT"
    );
    // Compute reservations page as the RPC's `list` does: at most 200.
    data(
        &w.tenant,
        "{ computeReservations(first: 200) { edges { cursor } } }",
        json!({}),
    )
    .await;
    assert_eq!(
        error_code(
            &w.tenant,
            "{ computeReservations(first: 201) { edges { cursor } } }",
            json!({})
        )
        .await,
        "INVALID_INPUT"
    );
    let first = data(&admin, "{ nodes(orgId: \"acme\", first: 1) { pageInfo { hasNextPage endCursor } edges { cursor } } }", json!({})).await;
    assert_eq!(first["nodes"]["pageInfo"]["hasNextPage"], true);
    let after = first["nodes"]["pageInfo"]["endCursor"].clone();
    let second = data(&admin, "query($after: String) { nodes(orgId: \"acme\", first: 1, after: $after) { pageInfo { hasNextPage } edges { cursor } } }", json!({ "after": after })).await;
    assert_eq!(second["nodes"]["edges"][0]["cursor"], "n2");
    assert_eq!(second["nodes"]["pageInfo"]["hasNextPage"], false);
}

/// Batched loading: however many nodes a page holds, their bookings (current, upcoming
/// and over the utilization window) are read in one query, so 1,000 nodes in two pages of
/// 500 cost exactly 2 loader queries.
async fn a_thousand_nodes_with_units_and_bookings_cost_one_batched_query_per_page(db: Db) {
    let w = world(db).await;
    let provider = w.provider.clone();
    let names: Vec<String> = (3..=1000).map(|n| format!("m{n:04}")).collect();
    for chunk in names.chunks(25) {
        futures::future::join_all(chunk.iter().map(|node| {
            let api = provider.clone();
            async move { register_node(&api, "acme", node, 2).await }
        }))
        .await;
    }
    let r = w.book("k-1", 8).await;
    let query = "query($after: String) { nodes(first: 500, after: $after) { pageInfo { hasNextPage endCursor }
        edges { node { id units { id nvlinkDomain } nvlinkDomains { id } bookings { reservationId unitId }
          utilization { gpuUnits bookedUnitMs } } } } }";
    let mut after = Value::Null;
    let mut seen = 0;
    let mut booked = 0;
    for page in 0..2 {
        let (status, body) = graphql(&w.provider, query, json!({ "after": after })).await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.get("errors").is_none(), "{body}");
        assert_eq!(
            body["extensions"]["loaderQueries"], 1,
            "page {page}: one query for 500 nodes' bookings"
        );
        let nodes = &body["data"]["nodes"];
        let edges = nodes["edges"].as_array().unwrap();
        seen += edges.len();
        booked += edges
            .iter()
            .flat_map(|e| e["node"]["bookings"].as_array().unwrap())
            .filter(|b| b["reservationId"] == r["id"])
            .count();
        assert!(
            edges
                .iter()
                .all(|e| !e["node"]["units"].as_array().unwrap().is_empty())
        );
        after = nodes["pageInfo"]["endCursor"].clone();
        assert_eq!(nodes["pageInfo"]["hasNextPage"], page == 0);
    }
    assert_eq!(seen, 1000);
    assert_eq!(booked, 8);
}

async fn subscriptions_receive_rest_changes_filtered_by_visibility(db: Db) {
    let w = world(db).await;
    let (mut anonymous, refused) = Socket::open(&w.server, json!({})).await;
    assert_ne!(
        refused.as_ref().map(|m| m["type"].clone()),
        Some(json!("connection_ack")),
        "{refused:?}"
    );
    assert!(
        anonymous.next().await.is_none(),
        "an unauthenticated socket is closed"
    );

    let bearer = |key: &str| json!({ "Authorization": format!("Bearer {key}") });
    let (mut tenant, ack) = Socket::open(&w.server, bearer(&w.tenant_key)).await;
    assert_eq!(ack.unwrap()["type"], "connection_ack");
    let stranger_key = w
        .server
        .key_in("stranger", json!({ "role": "member" }))
        .await;
    let (mut stranger, ack) = Socket::open(&w.server, bearer(&stranger_key)).await;
    assert_eq!(ack.unwrap()["type"], "connection_ack");
    let (mut provider, ack) = Socket::open(
        &w.server,
        bearer(&w.server.key_in("acme", json!({ "role": "provider" })).await),
    )
    .await;
    assert_eq!(ack.unwrap()["type"], "connection_ack");

    let head = data(
        &w.server.admin(),
        "{ events(first: 500) { edges { node { id } } } }",
        json!({}),
    )
    .await;
    let head = head["events"]["edges"]
        .as_array()
        .unwrap()
        .last()
        .map_or(0, |e| e["node"]["id"].as_i64().unwrap());
    let query =
        format!("subscription {{ reservationEvents(after: {head}) {{ id type objectId }} }}");
    tenant.subscribe("r", &query).await;
    stranger.subscribe("r", &query).await;
    provider
        .subscribe(
            "i",
            &format!("subscription {{ inventoryEvents(after: {head}) {{ id type objectId }} }}"),
        )
        .await;

    let r = w.book("k-1", 2).await;
    let got = tenant.event().await;
    assert_eq!(got["reservationEvents"]["type"], "reservation.placed");
    assert_eq!(got["reservationEvents"]["objectId"], r["id"]);

    let (status, held) = w
        .server
        .admin()
        .post(
            "/v1/nodes/n2/reservations",
            json!({ "unitIds": ["n2-gpu7"], "allowedOrgIds": ["stranger"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{held}");
    let got = stranger.event().await;
    assert_eq!(
        got["reservationEvents"]["type"], "node-reservation.created",
        "the tenant's reservation was never shown"
    );
    assert_eq!(got["reservationEvents"]["objectId"], held["id"]);

    register_node(&w.provider, "acme", "n3", 4).await;
    let got = provider.event().await;
    assert_eq!(got["inventoryEvents"]["type"], "inventory.node-registered");
    assert_eq!(got["inventoryEvents"]["objectId"], "n3");
}

async fn the_dashboard_example_runs_and_the_cli_prints_the_schema(db: Db) {
    let w = world(db).await;
    w.book("k-1", 2).await;
    let document = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dashboard.graphql"),
    )
    .unwrap();
    let queries = [
        "Viewer",
        "Fleet",
        "Reservations",
        "Pools",
        "Catalog",
        "Plugins",
        "Activity",
        "Earnings",
    ];
    for operation in queries {
        let body = json!({
            "query": document, "operationName": operation,
            "variables": { "orgId": "acme", "first": 10, "from": T0 - HOUR, "to": T0 + HOUR },
        });
        let (status, answer) = w.server.admin().post("/graphql", body).await;
        assert_eq!(status, StatusCode::OK, "{operation}: {answer}");
        assert!(answer.get("errors").is_none(), "{operation}: {answer}");
    }

    let (status, page) = w.server.anonymous().get("/graphql").await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.as_str().unwrap().to_lowercase().contains("graphiql"));

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_orl"))
        .args(["graphql", "schema"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let sdl = String::from_utf8(output.stdout).unwrap();
    for needle in [
        "type Query",
        "type Mutation",
        "type Subscription",
        "reservationEvents(",
        "createComputeReservation(",
        "earnings(orgId: String!): Earnings!",
        "members: [PlacementMember!]!",
    ] {
        assert!(sdl.contains(needle), "{needle} in {sdl}");
    }
}

async fn earnings_show_what_rest_shows_to_the_same_key_as_the_clock_moves(db: Db) {
    let w = world(db).await;
    let (_, rest) = w.provider.get("/v1/orgs/acme/provider/earnings").await;
    let empty = data(&w.provider, EARNINGS, json!({ "org": "acme" })).await;
    assert_eq!(empty["earnings"], rest, "nothing booked yet");

    w.price(250).await;
    let r = w.book("k-1", 3).await;
    assert_eq!(r["state"], "placed", "{r}");
    w.server.set_clock(T0 + 7 * MINUTE).await;
    let (status, payout) = w
        .server
        .admin()
        .post(
            "/v1/orgs/acme/provider/payouts",
            json!({ "amountMinor": 50, "reference": "wire-1" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{payout}");

    for (at, active) in [(T0 + 7 * MINUTE, 1), (T0 + 3 * HOUR, 0)] {
        w.server.set_clock(at).await;
        let (status, rest) = w.provider.get("/v1/orgs/acme/provider/earnings").await;
        assert_eq!(status, StatusCode::OK, "{rest}");
        let got = data(&w.provider, EARNINGS, json!({ "org": "acme" })).await;
        assert_eq!(got["earnings"], rest, "at {at}");
        assert_eq!(got["earnings"]["activeRentals"], active, "{got}");
        assert_eq!(got["earnings"]["paidOutMinor"], 50);
        assert_eq!(got["earnings"]["recentPayouts"][0]["id"], payout["id"]);
        assert_eq!(
            got["earnings"]["byNode"][0]["nodeId"],
            r["placement"]["nodeId"]
        );
    }
    // The booking ended after 2 hours: 3 GPUs × 2 h × 250.
    let (_, ended) = w.provider.get("/v1/orgs/acme/provider/earnings").await;
    assert_eq!(ended["grossMinor"], 3 * 500);
    let admin = data(&w.server.admin(), EARNINGS, json!({ "org": "acme" })).await;
    assert_eq!(
        admin["earnings"]["earnedMinor"], ended["earnedMinor"],
        "platform operators see the same figures"
    );
}

async fn another_org_asking_for_earnings_is_told_the_org_does_not_exist(db: Db) {
    let w = world(db).await;
    w.price(250).await;
    w.book("k-1", 2).await;
    w.server.set_clock(T0 + HOUR).await;
    let own = data(&w.provider, EARNINGS, json!({ "org": "acme" })).await;
    assert_eq!(own["earnings"]["grossMinor"], 2 * 250);
    // The stranger, and the tenant renting the GPUs, are told what REST tells them.
    for caller in [&w.stranger, &w.tenant] {
        let (status, rest) = caller.get("/v1/orgs/acme/provider/earnings").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{rest}");
        let (status, body) = graphql(caller, EARNINGS, json!({ "org": "acme" })).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "NOT_FOUND",
            "{body}"
        );
        assert_eq!(body["data"], Value::Null, "{body}");
    }
    assert_eq!(
        error_code(&w.server.admin(), EARNINGS, json!({ "org": "nobody" })).await,
        "NOT_FOUND"
    );
}

async fn a_gang_placement_lists_one_member_per_node_as_rest_does(db: Db) {
    let w = world(db).await;
    let single = w.book("k-single", 2).await;
    let body = json!({ "tenantId": "tenant-a", "poolId": w.pool,
        "devices": [{ "class": "gpu", "count": 4 }], "gang": { "size": 2 },
        "duration": "2h", "idempotencyKey": "k-gang" });
    let (status, gang) = w
        .tenant
        .post("/api/compute/reservations/create", body)
        .await;
    assert_eq!(status, StatusCode::OK, "{gang}");
    assert_eq!(gang["state"], "placed", "{gang}");

    let query = "query($id: String!) { computeReservation(id: $id) {
        placement { nodeId unitIds members { nodeId unitIds } } } }";
    let got = data(&w.tenant, query, json!({ "id": gang["id"] })).await;
    let placement = &got["computeReservation"]["placement"];
    assert_eq!(placement["members"], gang["placement"]["members"]);
    let mut nodes: Vec<&str> = placement["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["nodeId"].as_str().unwrap())
        .collect();
    assert_eq!(placement["members"][0]["nodeId"], placement["nodeId"]);
    assert_eq!(placement["members"][0]["unitIds"], placement["unitIds"]);
    nodes.sort_unstable();
    assert_eq!(nodes, ["n1", "n2"], "one member per node: {got}");
    for member in placement["members"].as_array().unwrap() {
        assert_eq!(member["unitIds"].as_array().unwrap().len(), 4, "{got}");
    }

    let listed = data(
        &w.tenant,
        "{ computeReservations { edges { node { id placement { nodeId unitIds members { nodeId unitIds } } } } } }",
        json!({}),
    )
    .await;
    for edge in listed["computeReservations"]["edges"].as_array().unwrap() {
        let node = &edge["node"];
        let rest = if node["id"] == gang["id"] {
            &gang
        } else {
            &single
        };
        assert_eq!(
            node["placement"]["members"], rest["placement"]["members"],
            "{node}"
        );
    }
    assert_eq!(
        single["placement"]["members"],
        json!([{ "nodeId": single["placement"]["nodeId"], "unitIds": single["placement"]["unitIds"] }]),
        "a reservation on one node has one member"
    );
}

/// Whether a managing org may page a node's reservations turns on an active one naming it,
/// not on the newest one naming it nor on the page asked for: a status or a cursor past
/// what it manages now answers an empty page, not `NOT_FOUND`.
async fn a_managing_org_pages_a_nodes_reservations_it_manages_now_whatever_it_manages_later(
    db: Db,
) {
    let w = world(db).await;
    let broker = w.server.org_with_key("broker", "provider").await;
    let admin = w.server.admin();
    let reserve = |unit: &'static str, from: i64, to: i64| {
        let admin = admin.clone();
        async move {
            let body = json!({ "unitIds": [unit], "allowedOrgIds": ["tenant-a"], "managingOrgIds": ["broker"],
                "startsAt": at(from), "endsAt": at(to) });
            let (status, r) = admin.post("/v1/nodes/n1/reservations", body).await;
            assert_eq!(status, StatusCode::CREATED, "{r}");
            r["id"].as_str().unwrap().to_string()
        }
    };
    let now = reserve("n1-gpu0", 1, 10).await;
    w.server.set_clock(T0 + 2 * HOUR).await;
    // Made later, so paged first: the broker manages it only from its term on.
    let later = reserve("n1-gpu1", 20, 30).await;
    let page = "query($status: String, $after: String) {
        nodeReservations(nodeId: \"n1\", status: $status, after: $after) { edges { node { id } } } }";
    let all = data(&w.provider, page, json!({})).await;
    assert_eq!(
        ids(&all["nodeReservations"]),
        [later.as_str(), now.as_str()]
    );
    let managed = data(&broker, page, json!({})).await;
    assert_eq!(
        ids(&managed["nodeReservations"]),
        [now.as_str()],
        "{managed}"
    );
    for variables in [
        json!({ "status": "pending" }),
        json!({ "status": "expired" }),
        json!({ "status": "active", "after": now }),
    ] {
        let none = data(&broker, page, variables.clone()).await;
        assert!(
            ids(&none["nodeReservations"]).is_empty(),
            "{variables}: {none}"
        );
    }
}
