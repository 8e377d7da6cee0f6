//! Who sees what: a revoked key's streams end, a managing org reads only the node
//! reservations it manages, plugins name only the pools the caller sees, and the catalog
//! shows an org only the nodes of pools it may book into, with the units held now as booked.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::{
    Api, Db, HOUR, Server, Socket, T0, assert_error, at, component, on_both_databases,
    register_node,
};

/// How long a stream may go on after its key is revoked.
const REVOCATION_GRACE: Duration = Duration::from_secs(5);

on_both_databases!(
    a_revoked_key_ends_its_event_stream_and_receives_nothing_written_after,
    a_revoked_key_ends_its_graphql_subscription_and_receives_nothing_written_after,
    a_revoked_keys_open_socket_answers_no_more_queries,
    a_managing_org_sees_only_the_node_reservations_it_manages,
    plugins_name_only_the_pools_the_caller_sees,
    the_catalog_shows_only_nodes_of_pools_the_org_owns_or_is_offered,
    another_orgs_admin_finds_no_pool_policy_iam_policy_confirmation_or_clock,
    the_catalog_pages_by_node_and_its_cursor_walks_each_visible_node_once,
    a_unit_booked_now_shows_as_booked_in_the_catalog,
);

/// Creates a key in `org` as the ops admin; returns its secret and id.
async fn key_with_id(server: &Server, org: &str, body: Value) -> (String, String) {
    let (status, key) = server
        .admin()
        .post(&format!("/v1/orgs/{org}/api-keys"), body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{key}");
    (
        key["key"].as_str().unwrap().to_string(),
        key["id"].as_str().unwrap().to_string(),
    )
}

async fn revoke(server: &Server, org: &str, key_id: &str) {
    let (status, body) = server
        .admin()
        .delete(&format!("/v1/orgs/{org}/api-keys/{key_id}"))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
}

/// Creates a pool of `nodes` owned by `owner` and offers it to each of `tenants`.
async fn pool(server: &Server, owner: &str, nodes: &[&str], tenants: &[&str]) -> String {
    let (status, pool) = server
        .admin()
        .post(
            "/v1/pools",
            json!({ "name": "p", "ownerOrgId": owner, "nodeIds": nodes }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let id = pool["id"].as_str().unwrap().to_string();
    for tenant in tenants {
        let (status, offer) = server
            .admin()
            .post(
                &format!("/v1/pools/{id}/offers"),
                json!({ "tenantId": tenant, "quota": { "gpu": 64 } }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{offer}");
    }
    id
}

/// The data of a GraphQL query that must succeed.
async fn graphql(api: &Api, query: &str) -> Value {
    let (status, body) = api.post("/graphql", json!({ "query": query })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    body["data"].clone()
}

/// An open `GET /v1/events/stream`.
struct EventStream {
    response: reqwest::Response,
    buffer: String,
}

/// What a stream did next.
#[derive(Debug)]
enum Next {
    /// A message, with its JSON data.
    Message(Value),
    /// The server ended the stream.
    Ended,
    /// Nothing before the deadline.
    Quiet,
}

impl EventStream {
    /// Opens the stream as `key` after the event `after`.
    async fn open(server: &Server, key: &str, after: i64) -> EventStream {
        let response = reqwest::Client::new()
            .get(format!("{}/v1/events/stream?after={after}", server.url))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        EventStream {
            response,
            buffer: String::new(),
        }
    }

    /// The next message (keep-alive comments skipped) within `wait`.
    async fn next_within(&mut self, wait: Duration) -> Next {
        let deadline = Instant::now() + wait;
        loop {
            while let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                let data: String = frame
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if !data.is_empty() {
                    return Next::Message(serde_json::from_str(&data).unwrap());
                }
            }
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return Next::Quiet,
                Ok(Ok(Some(chunk))) => self.buffer.push_str(std::str::from_utf8(&chunk).unwrap()),
                Ok(_) => return Next::Ended,
            }
        }
    }

    async fn message(&mut self) -> Value {
        match self.next_within(Duration::from_secs(15)).await {
            Next::Message(data) => data,
            other => panic!("expected a message, got {other:?}"),
        }
    }
}

async fn a_revoked_key_ends_its_event_stream_and_receives_nothing_written_after(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let (secret, id) = key_with_id(&server, "acme", json!({ "role": "viewer" })).await;
    let mut stream = EventStream::open(&server, &secret, 0).await;
    register_node(&provider, "acme", "n1", 4).await;
    let first = stream.message().await;
    assert_eq!(first["objectId"], "n1");

    // Revoked while idle: the stream ends within seconds, with no event to deliver.
    revoke(&server, "acme", &id).await;
    assert!(
        matches!(stream.next_within(REVOCATION_GRACE).await, Next::Ended),
        "an idle stream ends once its key is revoked"
    );

    // Revoked just before an event is written: the event is never delivered.
    let (secret, id) = key_with_id(&server, "acme", json!({ "role": "viewer" })).await;
    let mut stream = EventStream::open(&server, &secret, first["id"].as_i64().unwrap()).await;
    register_node(&provider, "acme", "n2", 4).await;
    assert_eq!(stream.message().await["objectId"], "n2");
    revoke(&server, "acme", &id).await;
    register_node(&provider, "acme", "n3", 4).await;
    match stream.next_within(REVOCATION_GRACE).await {
        Next::Ended => {}
        Next::Message(data) => panic!("a revoked key received {data}"),
        Next::Quiet => panic!("the stream of a revoked key goes on"),
    }

    // The revoked key cannot open another.
    let response = reqwest::Client::new()
        .get(format!("{}/v1/events/stream", server.url))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

/// A socket initialised with `key`, after its `connection_ack`.
async fn socket_of(server: &Server, key: &str) -> Socket {
    let init = json!({ "Authorization": format!("Bearer {key}") });
    let (socket, ack) = Socket::open(server, init).await;
    assert_eq!(
        ack.as_ref().map(|m| &m["type"]),
        Some(&json!("connection_ack")),
        "{ack:?}"
    );
    socket
}

async fn a_revoked_key_ends_its_graphql_subscription_and_receives_nothing_written_after(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let subscription = "subscription { inventoryEvents { id type objectId } }";

    // Revoked while idle: the subscription completes within seconds.
    let (secret, id) = key_with_id(&server, "acme", json!({ "role": "viewer" })).await;
    let mut socket = socket_of(&server, &secret).await;
    socket.subscribe("s1", subscription).await;
    // A subscription starts after the newest event: wait until it is running.
    tokio::time::sleep(Duration::from_millis(500)).await;
    register_node(&provider, "acme", "n1", 4).await;
    let first = socket.next_within(Duration::from_secs(15)).await.unwrap();
    assert_eq!(first["type"], "next", "{first}");
    assert_eq!(
        first["payload"]["data"]["inventoryEvents"]["objectId"],
        "n1"
    );
    revoke(&server, "acme", &id).await;
    let ended = socket.next_within(REVOCATION_GRACE).await;
    assert!(
        ended.is_none() || ended.as_ref().unwrap()["type"] == "complete",
        "an idle subscription ends once its key is revoked: {ended:?}"
    );

    // Revoked just before an event is written: the event is never delivered.
    let (secret, id) = key_with_id(&server, "acme", json!({ "role": "viewer" })).await;
    let mut socket = socket_of(&server, &secret).await;
    socket.subscribe("s2", subscription).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    register_node(&provider, "acme", "n2", 4).await;
    let second = socket.next_within(Duration::from_secs(15)).await.unwrap();
    assert_eq!(
        second["payload"]["data"]["inventoryEvents"]["objectId"],
        "n2"
    );
    revoke(&server, "acme", &id).await;
    register_node(&provider, "acme", "n3", 4).await;
    let after = socket.next_within(REVOCATION_GRACE).await;
    match &after {
        None => {}
        Some(message) if message["type"] == "complete" => {}
        Some(Value::Null) => panic!("the subscription of a revoked key goes on"),
        Some(message) => panic!("a revoked key received {message}"),
    }
    if after.is_some() {
        // The socket stays open, but a new subscription on it is refused.
        socket.subscribe("s3", subscription).await;
        let refused = socket.next_within(REVOCATION_GRACE).await;
        if let Some(message) = refused {
            assert_eq!(message["id"], "s3", "{message}");
            let errors = match message["type"].as_str() {
                Some("error") => &message["payload"],
                Some("next") => {
                    assert_eq!(message["payload"]["data"], Value::Null, "{message}");
                    &message["payload"]["errors"]
                }
                _ => panic!("a revoked key subscribed: {message}"),
            };
            assert_eq!(
                errors[0]["extensions"]["code"], "UNAUTHENTICATED",
                "{message}"
            );
        }
    }
}

async fn a_revoked_keys_open_socket_answers_no_more_queries(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("acme", "provider").await;
    let (secret, id) = key_with_id(&server, "acme", json!({ "role": "viewer" })).await;
    let mut socket = socket_of(&server, &secret).await;
    let query = "{ viewer { orgId } }";
    // The answer to operation `id` on the socket (its `next` or `error` message).
    async fn answer(socket: &mut Socket, id: &str) -> Value {
        loop {
            let message = socket
                .next_within(Duration::from_secs(10))
                .await
                .expect("the socket answers");
            if message["id"] == id && message["type"] != "complete" {
                return message;
            }
        }
    }
    socket.subscribe("q1", query).await;
    let before = answer(&mut socket, "q1").await;
    assert_eq!(
        before["payload"]["data"]["viewer"]["orgId"], "acme",
        "{before}"
    );
    revoke(&server, "acme", &id).await;
    socket.subscribe("q2", query).await;
    let after = answer(&mut socket, "q2").await;
    assert_eq!(after["type"], "next", "{after}");
    assert_eq!(after["payload"]["data"], Value::Null, "{after}");
    assert_eq!(
        after["payload"]["errors"][0]["extensions"]["code"], "UNAUTHENTICATED",
        "{after}"
    );
}

async fn a_managing_org_sees_only_the_node_reservations_it_manages(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let broker = server.org_with_key("broker", "provider").await;
    for org in ["tenant-a", "tenant-b", "other-broker"] {
        server.org_with_key(org, "member").await;
    }
    let reserve = |body: Value| {
        let admin = server.admin();
        async move {
            let (status, r) = admin.post("/v1/nodes/n1/reservations", body).await;
            assert_eq!(status, StatusCode::CREATED, "{r}");
            r["id"].as_str().unwrap().to_string()
        }
    };
    let managed = reserve(json!({ "unitIds": ["n1-gpu0"], "allowedOrgIds": ["tenant-a"], "managingOrgIds": ["broker"], "contractRef": "broker-a-1", "reason": "broker resells" })).await;
    let unmanaged = reserve(json!({ "unitIds": ["n1-gpu1"], "allowedOrgIds": ["tenant-b"], "contractRef": "acme-b-7", "reason": "tenant-b pilot" })).await;
    let managed_by_another = reserve(json!({ "unitIds": ["n1-gpu2"], "allowedOrgIds": ["tenant-b"], "managingOrgIds": ["other-broker"], "contractRef": "other-9" })).await;
    let not_yet_managed = reserve(json!({ "unitIds": ["n1-gpu3"], "allowedOrgIds": ["tenant-a"], "managingOrgIds": ["broker"], "startsAt": at(5) })).await;
    let everything = {
        let mut all = vec![
            not_yet_managed.clone(),
            managed_by_another.clone(),
            unmanaged.clone(),
            managed.clone(),
        ];
        all.sort();
        all
    };
    let listed = |api: Api| async move {
        let (status, list) = api.get("/v1/nodes/n1/reservations").await;
        assert_eq!(status, StatusCode::OK, "{list}");
        let mut ids: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };

    // The managing org reads the node, but sees only the reservation it manages now.
    assert_eq!(listed(broker.clone()).await, vec![managed.clone()]);
    let (status, one) = broker
        .get(&format!("/v1/nodes/n1/reservations/{managed}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["contractRef"], "broker-a-1");
    for hidden in [&unmanaged, &managed_by_another, &not_yet_managed] {
        let (status, err) = broker
            .get(&format!("/v1/nodes/n1/reservations/{hidden}"))
            .await;
        assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
    }
    let query = r#"{ nodeReservations(nodeId: "n1") { edges { node { id contractRef reason allowedOrgIds } } } }"#;
    let seen = graphql(&broker, query).await;
    let edges = seen["nodeReservations"]["edges"].as_array().unwrap();
    assert_eq!(edges.len(), 1, "{seen}");
    assert_eq!(edges[0]["node"]["id"], managed.as_str());

    // The node's owner and platform operators still see every one.
    assert_eq!(listed(provider.clone()).await, everything);
    let ops_viewer = server.as_key(&server.key_in("ops", json!({ "role": "viewer" })).await);
    assert_eq!(listed(ops_viewer).await, everything);
    let owner_view = graphql(&provider, query).await;
    assert_eq!(
        owner_view["nodeReservations"]["edges"]
            .as_array()
            .unwrap()
            .len(),
        4,
        "{owner_view}"
    );
    let (status, _) = provider
        .get(&format!("/v1/nodes/n1/reservations/{unmanaged}"))
        .await;
    assert_eq!(status, StatusCode::OK);

    // Once the second managed reservation starts, the managing org sees both of its own.
    server.set_clock(T0 + 6 * HOUR).await;
    let mut mine = vec![managed.clone(), not_yet_managed.clone()];
    mine.sort();
    assert_eq!(listed(broker.clone()).await, mine);
}

async fn plugins_name_only_the_pools_the_caller_sees(db: Db) {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    let bcme = server.org_with_key("bcme", "provider").await;
    register_node(&acme, "acme", "a1", 4).await;
    register_node(&bcme, "bcme", "b1", 4).await;
    server.org_with_key("tenant-a", "member").await;
    server.org_with_key("stranger", "member").await;
    let acme_pool = pool(&server, "acme", &["a1"], &[]).await;
    let bcme_pool = pool(&server, "bcme", &["b1"], &["tenant-a"]).await;
    let bytes = std::fs::read(component("orl_placer_spread.wasm")).unwrap();
    let (status, plugin) = server
        .admin()
        .raw(
            Method::POST,
            "/v1/plugins?name=spread&version=1.0.0",
            Some(bytes),
            Some("application/wasm"),
        )
        .await;
    assert!(status.is_success(), "{status} {plugin}");
    let id = plugin["id"].as_str().unwrap().to_string();
    for pool in [&acme_pool, &bcme_pool] {
        let (status, body) = server
            .admin()
            .put(
                &format!("/v1/pools/{pool}/policies"),
                json!({ "placement": id }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    // Pool managers of each org (operators hold pools.manage and plugins.manage).
    let operator = |org: &'static str| {
        let server = &server;
        async move { server.as_key(&server.key_in(org, json!({ "role": "operator" })).await) }
    };
    let one = format!("/v1/plugins/{}", id.replace(':', "%3A"));
    let assigned = |api: Api| {
        let one = one.clone();
        async move {
            let (status, list) = api.get("/v1/plugins").await;
            assert_eq!(status, StatusCode::OK, "{list}");
            let uploaded = |items: &Value| {
                let items = items.as_array().unwrap();
                let found: Vec<&Value> = items.iter().filter(|p| p["builtIn"] == false).collect();
                assert_eq!(found.len(), 1, "{items:?}");
                found[0].clone()
            };
            let listed = uploaded(&list["items"]);
            let (status, single) = api.get(&one).await;
            assert_eq!(status, StatusCode::OK, "{single}");
            assert_eq!(single["assignedTo"], listed["assignedTo"]);
            let graphql = graphql(
                &api,
                "{ plugins { edges { node { builtIn assignedTo } } } }",
            )
            .await;
            let nodes: Vec<Value> = graphql["plugins"]["edges"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["node"].clone())
                .collect();
            assert_eq!(uploaded(&json!(nodes))["assignedTo"], listed["assignedTo"]);
            listed["assignedTo"].clone()
        }
    };
    let mut both = vec![acme_pool.clone(), bcme_pool.clone()];
    both.sort();
    assert_eq!(assigned(server.admin()).await, json!(both));
    assert_eq!(assigned(operator("acme").await).await, json!([acme_pool]));
    assert_eq!(
        assigned(operator("tenant-a").await).await,
        json!([bcme_pool]),
        "a tenant sees the pool offered to it"
    );
    assert_eq!(assigned(operator("stranger").await).await, json!([]));
}

/// An admin of an unrelated org is told that another org's pool, its offers and policies,
/// the tenant's IAM policy and confirmations, and the test clock do not exist (404, never
/// 403), and changes nothing by asking.
async fn another_orgs_admin_finds_no_pool_policy_iam_policy_confirmation_or_clock(db: Db) {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    register_node(&acme, "acme", "n1", 2).await;
    server.org_with_key("tenant-a", "member").await;
    let pool = pool(&server, "acme", &["n1"], &["tenant-a"]).await;
    let stranger = server.org_with_key("stranger", "admin").await;
    let audit_before = crate::support::audit_count(&server).await;
    let calls = [
        (Method::GET, format!("/v1/pools/{pool}"), None),
        (
            Method::PUT,
            format!("/v1/pools/{pool}/nodes"),
            Some(json!({ "nodeIds": [] })),
        ),
        (
            Method::POST,
            format!("/v1/pools/{pool}/archive"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/v1/pools/{pool}/offers"),
            Some(json!({ "tenantId": "stranger", "quota": { "gpu": 1 } })),
        ),
        (Method::GET, format!("/v1/pools/{pool}/offers"), None),
        (Method::GET, format!("/v1/pools/{pool}/policies"), None),
        (
            Method::PUT,
            format!("/v1/pools/{pool}/policies"),
            Some(json!({})),
        ),
        (
            Method::GET,
            "/v1/orgs/tenant-a/iam/policy".to_string(),
            None,
        ),
        (
            Method::PUT,
            "/v1/orgs/tenant-a/iam/policy".to_string(),
            Some(json!({ "policy": "" })),
        ),
        (
            Method::GET,
            "/v1/orgs/tenant-a/confirmations".to_string(),
            None,
        ),
        (
            Method::POST,
            "/v1/orgs/tenant-a/confirmations/cnf_01m8t41rr3q54vjfdmqr9td73n/approve".to_string(),
            Some(json!({})),
        ),
        (
            Method::POST,
            "/v1/clock".to_string(),
            Some(json!({ "nowMs": T0 + 1 })),
        ),
    ];
    for (method, path, body) in calls {
        let (status, answer) = stranger.call(method.clone(), &path, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
        assert_eq!(
            answer["error"]["code"], "NOT_FOUND",
            "{method} {path}: {answer}"
        );
    }
    assert_eq!(crate::support::audit_count(&server).await, audit_before);
    let (_, seen) = server.admin().get(&format!("/v1/pools/{pool}")).await;
    assert_eq!(seen["nodeIds"], json!(["n1"]), "{seen}");
    assert!(seen.get("archivedAt").is_none_or(Value::is_null), "{seen}");
}

/// The ids of the nodes in `org`'s catalog as `api`, and its units by id.
async fn catalog(api: &Api, org: &str) -> (Vec<String>, serde_json::Map<String, Value>) {
    let (status, catalog) = api.get(&format!("/v1/orgs/{org}/catalog")).await;
    assert_eq!(status, StatusCode::OK, "{catalog}");
    let nodes = catalog["nodes"].as_array().unwrap();
    let mut ids: Vec<String> = nodes
        .iter()
        .map(|n| n["nodeId"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    let units = nodes
        .iter()
        .flat_map(|n| n["units"].as_array().unwrap().clone())
        .map(|u| (u["id"].as_str().unwrap().to_string(), u))
        .collect();
    (ids, units)
}

async fn the_catalog_shows_only_nodes_of_pools_the_org_owns_or_is_offered(db: Db) {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    for node in ["n1", "n2", "n3"] {
        register_node(&acme, "acme", node, 2).await;
    }
    let tenant_a = server.org_with_key("tenant-a", "member").await;
    let tenant_b = server.org_with_key("tenant-b", "member").await;
    let stranger = server.org_with_key("stranger", "member").await;
    let owner = server.org_with_key("pool-owner", "member").await;
    pool(&server, "pool-owner", &["n1"], &["tenant-a"]).await;
    let b_pool = pool(&server, "pool-owner", &["n2"], &["tenant-b"]).await;

    let names = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(catalog(&tenant_a, "tenant-a").await.0, names(&["n1"]));
    assert_eq!(catalog(&tenant_b, "tenant-b").await.0, names(&["n2"]));
    assert_eq!(
        catalog(&owner, "pool-owner").await.0,
        names(&["n1", "n2"]),
        "a pool's owner books into it"
    );
    assert_eq!(
        catalog(&stranger, "stranger").await.0,
        names(&[]),
        "no pool is offered to it"
    );
    assert_eq!(
        catalog(&server.admin(), "tenant-a").await.0,
        names(&["n1"]),
        "ops reading a tenant's catalog sees the tenant's"
    );
    assert_eq!(
        catalog(&server.admin(), "ops").await.0,
        names(&["n1", "n2", "n3"])
    );
    let seen = graphql(&tenant_a, "{ catalog { nodes { nodeId } } }").await;
    assert_eq!(seen["catalog"]["nodes"], json!([{ "nodeId": "n1" }]));

    // An archived pool is booked into no more.
    let (status, body) = server
        .admin()
        .post(&format!("/v1/pools/{b_pool}/archive"), json!({}))
        .await;
    assert!(status.is_success(), "{status} {body}");
    assert_eq!(catalog(&tenant_b, "tenant-b").await.0, names(&[]));
}

async fn the_catalog_pages_by_node_and_its_cursor_walks_each_visible_node_once(db: Db) {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    for node in ["n1", "n2", "n3", "n4", "n5"] {
        register_node(&acme, "acme", node, 2).await;
    }
    let tenant = server.org_with_key("tenant-a", "member").await;
    pool(&server, "acme", &["n1", "n2", "n4", "n5"], &["tenant-a"]).await;

    let mut pages = Vec::new();
    let mut path = "/v1/orgs/tenant-a/catalog?limit=2".to_string();
    loop {
        let (status, page) = tenant.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let ids: Vec<String> = page["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["nodeId"].as_str().unwrap().to_string())
            .collect();
        pages.push(ids);
        match page["cursor"].as_str() {
            Some(cursor) => path = format!("/v1/orgs/tenant-a/catalog?limit=2&cursor={cursor}"),
            None => break,
        }
        assert!(pages.len() < 5, "the cursor must end: {pages:?}");
    }
    assert_eq!(
        pages,
        vec![vec!["n1", "n2"], vec!["n4", "n5"]],
        "n3 is in no pool offered to the tenant"
    );

    let seen = graphql(
        &tenant,
        "{ catalog(first: 1, after: \"n2\") { nodes { nodeId } cursor } }",
    )
    .await;
    assert_eq!(
        seen["catalog"],
        json!({ "nodes": [{ "nodeId": "n4" }], "cursor": "n4" })
    );

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("cursor=n%201", "cursor"),
        ("after=n1", "after"),
    ] {
        let (status, err) = tenant
            .get(&format!("/v1/orgs/tenant-a/catalog?{query}"))
            .await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(err["error"]["details"]["field"], field, "{err}");
    }
}

async fn a_unit_booked_now_shows_as_booked_in_the_catalog(db: Db) {
    let server = Server::start(db).await;
    let acme = server.org_with_key("acme", "provider").await;
    register_node(&acme, "acme", "n1", 4).await;
    let tenant = server.org_with_key("tenant-a", "member").await;
    let other = server.org_with_key("tenant-b", "member").await;
    let pool = pool(&server, "acme", &["n1"], &["tenant-a", "tenant-b"]).await;
    let book = |key: &'static str, start: i64| {
        let tenant = tenant.clone();
        let pool = pool.clone();
        async move {
            let body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 1 }], "duration": "2h", "start": start, "idempotencyKey": key });
            let (status, r) = tenant.post("/api/compute/reservations/create", body).await;
            assert_eq!(status, StatusCode::OK, "{r}");
            assert_eq!(r["state"], "placed", "{r}");
            r
        }
    };
    let now = book("k-now", T0).await;
    // Overlapping the first one's window, so it holds another unit.
    let later = book("k-later", T0 + HOUR).await;
    let held = now["placement"]["unitIds"][0].as_str().unwrap().to_string();
    let held_later = later["placement"]["unitIds"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(held, held_later, "{now} {later}");

    for (api, org) in [(&tenant, "tenant-a"), (&other, "tenant-b")] {
        let (_, units) = catalog(api, org).await;
        assert_eq!(units.len(), 4, "{units:?}");
        assert_eq!(units[&held]["tier"], "booked", "{org}: held now");
        assert_eq!(
            units[&held_later]["tier"], "open",
            "{org}: booked only from later"
        );
        let open = units.values().filter(|u| u["tier"] == "open").count();
        assert_eq!(open, 3, "{org}: {units:?}");
    }
    let seen = graphql(&other, "{ catalog { nodes { units { id tier } } } }").await;
    let tiers: Vec<&Value> = seen["catalog"]["nodes"][0]["units"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["id"] == held.as_str())
        .map(|u| &u["tier"])
        .collect();
    assert_eq!(tiers, vec![&json!("booked")]);

    // Released, the unit is open again.
    let (status, released) = tenant
        .post(
            "/api/compute/reservations/release",
            json!({ "tenantId": "tenant-a", "reservationId": now["id"] }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{released}");
    let (_, units) = catalog(&other, "tenant-b").await;
    assert_eq!(units[&held]["tier"], "open", "{units:?}");

    // Inside the later booking's window, its unit is booked.
    server.set_clock(T0 + HOUR).await;
    let (_, units) = catalog(&other, "tenant-b").await;
    assert_eq!(units[&held_later]["tier"], "booked", "{units:?}");
}
