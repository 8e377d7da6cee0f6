//! The one pagination scheme on the lists of pools, offers, plugins, API keys and
//! confirmation requests: `limit` and the `cursor` of the previous answer in, `items` and a `cursor`
//! while more remain out.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Api, Db, Server, T0, assert_error, on_both_databases, pages, register_node};

on_both_databases!(
    pools_and_offers_page_by_id_and_an_exactly_full_last_page_has_no_cursor,
    api_keys_page_oldest_first,
    confirmation_requests_page_newest_first,
    a_bad_limit_or_cursor_is_refused_naming_the_field,
    an_orgs_node_reservations_page_over_graphql,
    pools_and_offers_page_over_graphql_as_over_rest,
    a_nodes_reservations_page_over_graphql_as_each_reader_sees_them,
    plugins_page_over_graphql_as_over_rest,
);

/// Every page of the GraphQL connection `field` of `query` (which takes `$first` and
/// `$after`, and selects `edges { cursor node { <id> } } pageInfo { hasNextPage
/// endCursor }`), as the `id` of each page's nodes. Each page but the last is full.
async fn graphql_pages(
    api: &Api,
    query: &str,
    path: &[&str],
    id: &str,
    first: usize,
) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut after = Value::Null;
    loop {
        let (status, body) = api
            .post(
                "/graphql",
                json!({ "query": query, "variables": { "first": first, "after": after } }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.get("errors").is_none(), "{body}");
        let mut connection = &body["data"];
        for step in path {
            connection = &connection[*step];
        }
        let edges = connection["edges"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"));
        let ids: Vec<String> = edges
            .iter()
            .map(|e| e["node"][id].as_str().unwrap().to_string())
            .collect();
        for edge in edges {
            assert_eq!(
                edge["cursor"], edge["node"][id],
                "the cursor is the id: {body}"
            );
        }
        assert!(ids.len() <= first, "{body}");
        let info = &connection["pageInfo"];
        pages.push(ids);
        if info["hasNextPage"] == false {
            break;
        }
        assert_eq!(
            pages.last().unwrap().len(),
            first,
            "a page with more is full"
        );
        assert_eq!(
            &info["endCursor"],
            edges.last().map(|e| &e["cursor"]).unwrap()
        );
        after = info["endCursor"].clone();
        assert!(pages.len() <= 20, "the cursor must end: {pages:?}");
    }
    pages
}

async fn pools_and_offers_page_over_graphql_as_over_rest(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("acme", "provider").await;
    let tenant = server.org_with_key("tenant-c", "member").await;
    for org in ["tenant-a", "tenant-b", "tenant-d"] {
        server.org_with_key(org, "member").await;
    }
    let mut pools = Vec::new();
    for name in ["p1", "p2", "p3", "p4", "p5"] {
        pools.push(create_pool(&server, name).await);
    }
    pools.sort();
    let admin = server.admin();
    let query = "query($first: Int, $after: String) { pools(first: $first, after: $after) { edges { cursor node { id } } pageInfo { hasNextPage endCursor } } }";
    for first in [2, 5] {
        assert_eq!(
            graphql_pages(&admin, query, &["pools"], "id", first).await,
            pages(&admin, "/v1/pools", first, "id").await,
            "first {first}: the pages REST answers"
        );
    }
    for pool in [&pools[4], &pools[1]] {
        offer(&server, pool, "tenant-c").await;
    }
    assert_eq!(
        graphql_pages(&tenant, query, &["pools"], "id", 1).await,
        [vec![pools[1].clone()], vec![pools[4].clone()]],
        "a tenant pages through the pools offered to it"
    );

    let pool = &pools[1];
    for org in ["tenant-d", "tenant-a", "tenant-b"] {
        offer(&server, pool, org).await;
    }
    let offers = format!(
        "query($first: Int, $after: String) {{ offers(poolId: \"{pool}\", first: $first, after: $after) {{ edges {{ cursor node {{ tenantId }} }} pageInfo {{ hasNextPage endCursor }} }} }}"
    );
    let by_tenant = [
        vec!["tenant-a".to_string(), "tenant-b".to_string()],
        vec!["tenant-c".to_string(), "tenant-d".to_string()],
    ];
    assert_eq!(
        graphql_pages(&admin, &offers, &["offers"], "tenantId", 2).await,
        by_tenant
    );
    let nested = format!(
        "query($first: Int, $after: String) {{ pool(id: \"{pool}\") {{ offers(first: $first, after: $after) {{ edges {{ cursor node {{ tenantId }} }} pageInfo {{ hasNextPage endCursor }} }} }} }}"
    );
    assert_eq!(
        graphql_pages(&admin, &nested, &["pool", "offers"], "tenantId", 2).await,
        by_tenant
    );
    assert_eq!(
        graphql_pages(&tenant, &offers, &["offers"], "tenantId", 2).await,
        [vec!["tenant-c".to_string()]],
        "a tenant sees its own offer"
    );

    for (first, after) in [
        (0, Value::Null),
        (501, Value::Null),
        (2, json!("has space")),
    ] {
        let (_, body) = admin
            .post(
                "/graphql",
                json!({ "query": query, "variables": { "first": first, "after": after } }),
            )
            .await;
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "INVALID_INPUT",
            "{body}"
        );
    }
}

/// GraphQL `plugins` pages as `GET /v1/plugins` does: by id, the built-ins among the
/// uploaded plugins, the cursor an id; the same ids on the same pages at every size.
async fn plugins_page_over_graphql_as_over_rest(db: Db) {
    let w = crate::plugins::world(db).await;
    for file in ["orl_placer_spread.wasm", "trap.wasm", "preempt_oldest.wasm"] {
        w.upload(file).await;
    }
    let query = "query($first: Int, $after: String) { plugins(first: $first, after: $after) { edges { cursor node { id } } pageInfo { hasNextPage endCursor } } }";
    let admin = w.server.admin();
    let operator = w
        .server
        .as_key(&w.server.key_in("acme", json!({ "role": "operator" })).await);
    for api in [&admin, &operator] {
        for first in [1, 2, 4, 6, 500] {
            let rest = pages(api, "/v1/plugins", first.min(200), "id").await;
            assert_eq!(
                graphql_pages(api, query, &["plugins"], "id", first).await,
                rest,
                "first {first}: the pages REST answers"
            );
        }
    }
    let every = pages(&admin, "/v1/plugins", 200, "id").await.concat();
    assert_eq!(every.len(), 6, "three built-in, three uploaded: {every:?}");
    let (_, body) = w
        .tenant
        .post(
            "/graphql",
            json!({ "query": query, "variables": { "first": 2 } }),
        )
        .await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "NOT_FOUND",
        "{body}"
    );
    for (first, after) in [
        (0, Value::Null),
        (501, Value::Null),
        (2, json!("has space")),
    ] {
        let (_, body) = admin
            .post(
                "/graphql",
                json!({ "query": query, "variables": { "first": first, "after": after } }),
            )
            .await;
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "INVALID_INPUT",
            "{body}"
        );
    }
}

async fn a_nodes_reservations_page_over_graphql_as_each_reader_sees_them(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let manager = server.org_with_key("broker", "provider").await;
    let stranger = server.org_with_key("stranger", "provider").await;
    server.org_with_key("tenant-a", "member").await;
    let mut all = Vec::new();
    let mut managed = Vec::new();
    for gpu in 0..5 {
        let mut body =
            json!({ "unitIds": [format!("n1-gpu{gpu}")], "allowedOrgIds": ["tenant-a"] });
        if gpu % 2 == 0 {
            body["managingOrgIds"] = json!(["broker"]);
        }
        let (status, r) = server.admin().post("/v1/nodes/n1/reservations", body).await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        let id = r["id"].as_str().unwrap().to_string();
        if gpu % 2 == 0 {
            managed.push(id.clone());
        }
        all.push(id);
    }
    let (status, ended) = server
        .admin()
        .post(
            &format!("/v1/nodes/n1/reservations/{}/end", all[0]),
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    managed.retain(|id| *id != all[0]);
    all.sort();
    all.reverse();
    managed.sort();
    managed.reverse();
    let query = |status: &str| {
        format!(
            "query($first: Int, $after: String) {{ nodeReservations(nodeId: \"n1\"{status}, first: $first, after: $after) {{ edges {{ cursor node {{ id }} }} pageInfo {{ hasNextPage endCursor }} }} }}"
        )
    };
    let flat = |pages: Vec<Vec<String>>| pages.concat();
    let every = graphql_pages(&provider, &query(""), &["nodeReservations"], "id", 2).await;
    assert_eq!(every.len(), 3, "{every:?}");
    assert_eq!(
        flat(every),
        all,
        "the owner pages through every one, newest first"
    );
    let (_, rest) = provider.get("/v1/nodes/n1/reservations").await;
    let rest: Vec<&str> = rest
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(rest, all, "as REST lists them");
    let cancelled = graphql_pages(
        &server.admin(),
        &query(", status: \"cancelled\""),
        &["nodeReservations"],
        "id",
        2,
    )
    .await;
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0].len(), 1, "{cancelled:?}");

    assert_eq!(
        flat(graphql_pages(&manager, &query(""), &["nodeReservations"], "id", 1).await),
        managed,
        "a managing org pages through what it manages now"
    );
    assert_eq!(
        flat(
            graphql_pages(
                &manager,
                &query(", status: \"cancelled\""),
                &["nodeReservations"],
                "id",
                1
            )
            .await
        ),
        Vec::<String>::new(),
        "what it no longer manages it does not see"
    );
    let (_, body) = stranger
        .post(
            "/graphql",
            json!({ "query": query(""), "variables": { "first": 2 } }),
        )
        .await;
    assert_eq!(
        body["errors"][0]["extensions"]["code"], "NOT_FOUND",
        "{body}"
    );
}

async fn create_pool(server: &Server, name: &str) -> String {
    let (status, pool) = server
        .admin()
        .post("/v1/pools", json!({ "name": name, "ownerOrgId": "acme" }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    pool["id"].as_str().unwrap().to_string()
}

async fn offer(server: &Server, pool: &str, tenant: &str) {
    let (status, offer) = server
        .admin()
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": tenant, "quota": { "gpu": 8 } }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
}

async fn pools_and_offers_page_by_id_and_an_exactly_full_last_page_has_no_cursor(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("acme", "provider").await;
    let tenant = server.org_with_key("tenant-c", "member").await;
    for org in ["tenant-e", "tenant-a", "tenant-d", "tenant-b"] {
        server.org_with_key(org, "member").await;
    }
    let mut pools = Vec::new();
    for name in ["p1", "p2", "p3", "p4"] {
        pools.push(create_pool(&server, name).await);
    }
    pools.sort();

    let admin = server.admin();
    assert_eq!(
        pages(&admin, "/v1/pools", 2, "id").await,
        [pools[..2].to_vec(), pools[2..].to_vec()],
        "two full pages, the last without a cursor"
    );
    assert_eq!(
        pages(&admin, "/v1/pools", 3, "id").await,
        [pools[..3].to_vec(), pools[3..].to_vec()]
    );
    let (_, whole) = admin.get("/v1/pools").await;
    assert_eq!(whole["items"].as_array().unwrap().len(), 4, "50 by default");
    assert!(whole.get("cursor").is_none(), "{whole}");

    // A tenant pages through the pools offered to it only.
    for pool in [&pools[3], &pools[1], &pools[0]] {
        offer(&server, pool, "tenant-c").await;
    }
    assert_eq!(
        pages(&tenant, "/v1/pools", 2, "id").await,
        [
            vec![pools[0].clone(), pools[1].clone()],
            vec![pools[3].clone()]
        ]
    );

    let pool = &pools[0];
    for org in ["tenant-e", "tenant-a", "tenant-d", "tenant-b"] {
        offer(&server, pool, org).await;
    }
    let offers = format!("/v1/pools/{pool}/offers");
    let tenants = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        pages(&admin, &offers, 2, "tenantId").await,
        [
            tenants(&["tenant-a", "tenant-b"]),
            tenants(&["tenant-c", "tenant-d"]),
            tenants(&["tenant-e"]),
        ]
    );
    assert_eq!(
        pages(&admin, &offers, 5, "tenantId").await,
        [tenants(&[
            "tenant-a", "tenant-b", "tenant-c", "tenant-d", "tenant-e"
        ])],
        "one exactly full page and no cursor"
    );
    // A tenant's page holds its own offer only, whatever cursor it starts after.
    assert_eq!(
        pages(&tenant, &offers, 1, "tenantId").await,
        [tenants(&["tenant-c"])]
    );
    let (status, page) = tenant.get(&format!("{offers}?cursor=tenant-c")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page, json!({ "items": [] }));
}

async fn api_keys_page_oldest_first(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("acme", "admin").await;
    for _ in 0..4 {
        server.key_in("acme", json!({ "role": "viewer" })).await;
    }
    let admin = server.admin();
    let (_, all) = admin.get("/v1/orgs/acme/api-keys?limit=200").await;
    let ids: Vec<String> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 5, "{all}");
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted, "by id, which is creation order");
    assert_eq!(
        pages(&admin, "/v1/orgs/acme/api-keys", 2, "id").await,
        [ids[..2].to_vec(), ids[2..4].to_vec(), ids[4..].to_vec()]
    );
    assert_eq!(
        pages(&admin, "/v1/orgs/acme/api-keys", 5, "id").await,
        std::slice::from_ref(&ids)
    );
    assert!(!all.to_string().contains("\"key\""), "no secret: {all}");
}

async fn confirmation_requests_page_newest_first(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let person = server.org_with_key("tenant-a", "member").await;
    let pool = create_pool(&server, "h100").await;
    let (status, _) = server
        .admin()
        .put(
            &format!("/v1/pools/{pool}/nodes"),
            json!({ "nodeIds": ["n1"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    offer(&server, &pool, "tenant-a").await;
    let (status, body) = server
        .admin()
        .put(
            "/v1/orgs/tenant-a/iam/policy",
            json!({ "policy": r#"
                permit(principal, action, resource) when { !principal.agent };
                permit(principal, action == Orl::Action::"compute:reservations:create", resource) when { context.confirmed };
            "# }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let agent = server.as_key(
        &server
            .key_in("tenant-a", json!({ "role": "member", "agent": true }))
            .await,
    );
    let mut opened = Vec::new();
    for n in 0..4 {
        // Ids order by the clock's millisecond: each request opens at its own instant.
        server.set_clock(T0 + n * 1_000).await;
        let ask = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 1 }],
                          "duration": "1h", "idempotencyKey": format!("agent-{n}") });
        let (status, err) = agent.post("/api/compute/reservations/create", ask).await;
        assert_error(status, &err, StatusCode::FORBIDDEN, "CONFIRMATION_REQUIRED");
        opened.push(
            err["error"]["details"]["confirmationId"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    opened.reverse();
    let path = "/v1/orgs/tenant-a/confirmations";
    assert_eq!(
        pages(&person, path, 3, "id").await,
        [opened[..3].to_vec(), opened[3..].to_vec()],
        "newest first"
    );
    assert_eq!(
        pages(&person, path, 2, "id").await,
        [opened[..2].to_vec(), opened[2..].to_vec()]
    );
}

async fn a_bad_limit_or_cursor_is_refused_naming_the_field(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("acme", "provider").await;
    let pool = create_pool(&server, "p1").await;
    let admin = server.admin();
    for list in [
        "/v1/pools".to_string(),
        format!("/v1/pools/{pool}/offers"),
        "/v1/orgs/acme/api-keys".to_string(),
        "/v1/orgs/acme/confirmations".to_string(),
        "/v1/plugins".to_string(),
    ] {
        for (query, field) in [
            ("limit=0", "limit"),
            ("limit=201", "limit"),
            ("limit=-1", "limit"),
            ("limit=ten", "limit"),
            ("cursor=has%20space", "cursor"),
            ("cursor=", "cursor"),
            (&*format!("cursor={}", "a".repeat(129)), "cursor"),
        ] {
            let (status, err) = admin.get(&format!("{list}?{query}")).await;
            assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
            assert_eq!(
                err["error"]["details"]["field"], field,
                "{list}?{query}: {err}"
            );
        }
        let (status, page) = admin.get(&format!("{list}?limit=200&cursor=zzz")).await;
        assert_eq!(status, StatusCode::OK, "{list}: {page}");
        assert!(page["items"].is_array(), "{page}");
        let (status, _) = admin.get(&format!("{list}?limit=1")).await;
        assert_eq!(status, StatusCode::OK, "{list}");
    }
    let (status, err) = admin.get("/v1/pools?page=2").await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(err["error"]["details"]["field"], Value::from("page"));
}

async fn an_orgs_node_reservations_page_over_graphql(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let tenant = server.org_with_key("tenant-a", "member").await;
    server.org_with_key("tenant-b", "member").await;
    let mut created = Vec::new();
    for (unit, audience) in [
        ("n1-gpu0", "tenant-a"),
        ("n1-gpu1", "tenant-b"),
        ("n1-gpu2", "tenant-a"),
        ("n1-gpu3", "tenant-a"),
    ] {
        let (status, r) = server
            .admin()
            .post(
                "/v1/nodes/n1/reservations",
                json!({ "unitIds": [unit], "allowedOrgIds": [audience] }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        if audience == "tenant-a" {
            created.push(r["id"].as_str().unwrap().to_string());
        }
    }
    created.sort();
    created.reverse();
    let page = |after: Option<&str>| {
        let after = after.map_or(String::new(), |a| format!(", after: \"{a}\""));
        json!({ "query": format!(
            "{{ nodeReservations(orgId: \"tenant-a\", first: 2{after}) {{ edges {{ node {{ id }} cursor }} pageInfo {{ hasNextPage endCursor }} }} }}"
        ) })
    };
    let ids = |body: &Value| -> Vec<String> {
        body["data"]["nodeReservations"]["edges"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"))
            .iter()
            .map(|e| e["node"]["id"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, first) = tenant.post("/graphql", page(None)).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(ids(&first), created[..2], "{first}");
    let info = &first["data"]["nodeReservations"]["pageInfo"];
    assert_eq!(info["hasNextPage"], true, "{first}");
    let (_, rest) = tenant
        .post("/graphql", page(info["endCursor"].as_str()))
        .await;
    assert_eq!(ids(&rest), created[2..], "{rest}");
    assert_eq!(
        rest["data"]["nodeReservations"]["pageInfo"]["hasNextPage"], false,
        "{rest}"
    );
    let (_, bad) = tenant.post("/graphql", page(Some("has space"))).await;
    assert!(bad["errors"][0]["message"].as_str().is_some(), "{bad}");
}
