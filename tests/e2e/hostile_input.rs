//! Hostile input: documents nested past any sane depth, queries that fan out, NUL bytes in
//! ids, slow or trickling clients, and bodies of the wrong shape are refused quickly, in
//! the error envelope, and the server goes on serving.

use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::{Api, Db, Options, Server, assert_error, on_both_databases, register_node};

on_both_databases!(
    deeply_nested_iam_policies_are_invalid_input_and_the_server_survives,
    deeply_nested_graphql_and_json_documents_are_refused_and_the_server_survives,
    graphql_fragment_fan_out_and_alias_floods_are_refused_before_they_cost_cpu,
    a_nul_byte_in_any_path_id_is_invalid_input_naming_the_parameter,
    a_nul_byte_in_a_graphql_argument_is_invalid_input,
    a_nul_character_in_a_json_string_is_invalid_input_naming_the_field,
    slow_headers_trickled_bodies_and_idle_connections_are_cut_off_but_streams_live_on,
    the_connection_limit_queues_connections_past_it,
    a_json_array_is_refused_where_an_object_is_expected_and_nothing_is_written,
    mistyped_fields_are_named_in_details_and_worded_without_rust_types,
    the_bearer_scheme_is_case_insensitive,
    the_database_file_and_the_plugin_cache_are_private_to_the_owner,
);

/// Asserts the server still answers `/healthz` promptly.
async fn assert_healthy(server: &Server) {
    let started = Instant::now();
    let (status, body) = server.anonymous().get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "/healthz took {:?}",
        started.elapsed()
    );
}

/// Runs `call`, asserting it answers within `bound`.
async fn within<T>(bound: Duration, what: &str, call: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let out = tokio::time::timeout(bound * 5, call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {:?}", bound * 5));
    assert!(
        started.elapsed() < bound,
        "{what} took {:?}, more than {bound:?}",
        started.elapsed()
    );
    out
}

fn nested(open: &str, inner: &str, close: &str, depth: usize) -> String {
    format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
}

async fn deeply_nested_iam_policies_are_invalid_input_and_the_server_survives(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("tenant-a", "admin").await;
    let admin = server.admin();
    let path = "/v1/orgs/tenant-a/iam/policy";
    let when = |expr: String| format!("permit(principal, action, resource) when {{ {expr} }};");
    let mut ifs = "true".to_string();
    for _ in 0..150 {
        ifs = format!("if true then {ifs} else false");
    }
    let cases = [
        ("parentheses", when(nested("(", "true", ")", 150))),
        ("parentheses", when(nested("(", "true", ")", 20_000))),
        (
            "sets",
            when(format!("{} == []", nested("[", "1", "]", 150))),
        ),
        (
            "records",
            when(format!("{}.a == 1", nested("{a:", "1", "}", 150))),
        ),
        ("if-then-else", when(ifs)),
    ];
    for (what, policy) in cases {
        let (status, body) = within(
            Duration::from_secs(2),
            what,
            admin.put(path, json!({ "policy": policy })),
        )
        .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(
            body["error"]["details"]["field"], "policy",
            "{what}: {body}"
        );
        assert_healthy(&server).await;
    }
    // Brackets inside strings and comments are text, and ordinary nesting is fine.
    let fine = format!(
        "// (((((((((((((((((((((((((((((((((((((((\n{}",
        when(format!(
            "context.region == \"{}\" && {}",
            "(".repeat(200),
            nested("(", "context.gpuCount <= 4", ")", 8)
        ))
    );
    let (status, body) = admin.put(path, json!({ "policy": fine })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // A long flat chain of operators parses without exhausting the stack.
    let chain = when(vec!["context.gpuCount <= 4"; 8_000].join(" && "));
    let (status, body) = within(
        Duration::from_secs(5),
        "a long chain",
        admin.put(path, json!({ "policy": chain })),
    )
    .await;
    assert!(
        status.is_success() || status == StatusCode::BAD_REQUEST,
        "{status} {body}"
    );
    assert_healthy(&server).await;
}

async fn deeply_nested_graphql_and_json_documents_are_refused_and_the_server_survives(db: Db) {
    let server = Server::start(db).await;
    let viewer = server.org_with_key("tenant-a", "viewer").await;
    // Each under the size limit, so that it is the nesting that is refused.
    let deep_selection = nested("{a", "", "}", 10_000);
    let deep_list = format!("{{ node(id: {}) {{ id }} }}", nested("[", "1", "]", 10_000));
    let deep_object = format!(
        "{{ node(id: {}) {{ id }} }}",
        nested("{a:", "1", "}", 7_000)
    );
    for (what, query) in [
        ("selections", deep_selection),
        ("list values", deep_list),
        ("object values", deep_object),
    ] {
        let (status, body) = within(
            Duration::from_secs(2),
            what,
            viewer.post("/graphql", json!({ "query": query })),
        )
        .await;
        assert!(
            status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
            "{what}: {status}"
        );
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(message.contains("nested too deep"), "{what}: {body}");
        assert!(
            body.get("data").is_none_or(Value::is_null),
            "{what}: {body}"
        );
        assert_healthy(&server).await;
    }
    // Variables and REST bodies are JSON: nested past its limit, they are refused too.
    let deep_json = nested("[", "1", "]", 10_000);
    let body = format!(
        "{{\"query\": \"query($v: String) {{ viewer {{ orgId }} }}\", \"variables\": {{\"v\": {deep_json}}}}}"
    );
    let (status, _) = within(
        Duration::from_secs(2),
        "deep variables",
        viewer.raw(
            Method::POST,
            "/graphql",
            Some(body.into_bytes()),
            Some("application/json"),
        ),
    )
    .await;
    assert!(
        status.is_client_error() || status == StatusCode::OK,
        "{status}"
    );
    let body = format!("{{\"id\": \"x\", \"name\": {deep_json}}}");
    let (status, body) = within(
        Duration::from_secs(2),
        "deep JSON body",
        server.admin().raw(
            Method::POST,
            "/v1/orgs",
            Some(body.into_bytes()),
            Some("application/json"),
        ),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    // Durations are parsed without recursion, however long.
    let (status, body) = within(
        Duration::from_secs(2),
        "a long duration",
        viewer.post(
            "/api/compute/reservations/create",
            json!({ "tenantId": "tenant-a", "poolId": "p", "devices": [{ "class": "gpu", "count": 1 }],
                    "duration": "1h ".repeat(50_000), "idempotencyKey": "k" }),
        ),
    )
    .await;
    assert!(status.is_client_error(), "{status} {body}");
    assert_healthy(&server).await;
}

/// `depth` levels of fragments, each spreading the next `fan_out` times, every spread
/// inside an inline fragment.
fn fragment_bomb(depth: usize, fan_out: usize) -> String {
    let mut query = "{ ...F0 }".to_string();
    for level in 0..depth {
        let spreads: String = (0..fan_out)
            .map(|_| format!("... on Query {{ ...F{} }} ", level + 1))
            .collect();
        query.push_str(&format!(" fragment F{level} on Query {{ {spreads} }}"));
    }
    query.push_str(&format!(" fragment F{depth} on Query {{ __typename }}"));
    query
}

async fn graphql_fragment_fan_out_and_alias_floods_are_refused_before_they_cost_cpu(db: Db) {
    let server = Server::start(db).await;
    let viewer = server.org_with_key("tenant-a", "viewer").await;
    // Nested fragment spreads, each level spreading the next ten times.
    let mut bomb = "query { ...F0 }".to_string();
    for level in 0..8 {
        let spreads: String = (0..10).map(|_| format!("...F{} ", level + 1)).collect();
        bomb.push_str(&format!(" fragment F{level} on Query {{ {spreads} }}"));
    }
    bomb.push_str(" fragment F8 on Query { __typename }");
    assert!(bomb.len() < 2_000);
    let aliases: String = (0..8_000)
        .map(|i| format!("c{i}: catalog {{ orgId }} "))
        .collect();
    let introspection =
        "__schema { types { name fields { name args { name type { name ofType { name } } } } } }";
    let introspections: String = (0..32).map(|i| format!("i{i}: {introspection} ")).collect();
    let cases = [
        ("fragment fan-out", bomb),
        ("aliased introspection", format!("{{ {introspections} }}")),
        ("fragment fan-out under fields", fragment_bomb(6, 10)),
        ("alias flood", format!("{{ {aliases} }}")),
        (
            "alias flood under 32 KiB",
            format!(
                "{{ {} }}",
                (0..1_500)
                    .map(|i| format!("c{i}: catalog {{ orgId }} "))
                    .collect::<String>()
            ),
        ),
    ];
    for (what, query) in &cases {
        let (_, body) = within(
            Duration::from_secs(2),
            what,
            viewer.post("/graphql", json!({ "query": query })),
        )
        .await;
        let message = body["errors"][0]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("too complex") || message.contains("too large"),
            "{what}: {body}"
        );
        assert!(
            body.get("data").is_none_or(Value::is_null),
            "{what}: {body}"
        );
    }
    // Two at once do not stall the server.
    let (a, b, health) = tokio::join!(
        viewer.post("/graphql", json!({ "query": &cases[0].1 })),
        viewer.post("/graphql", json!({ "query": &cases[4].1 })),
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_healthy(&server).await;
        },
    );
    let _ = (a, b, health);
    // What a dashboard asks still runs: a handful of aliases, fragments, introspection.
    let ok = "query { a: catalog { orgId } b: catalog { orgId } ...V } fragment V on Query { viewer { orgId } }";
    let (status, body) = viewer.post("/graphql", json!({ "query": ok })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    assert_eq!(body["data"]["a"]["orgId"], "tenant-a");
    let introspection = "query { __schema { queryType { name } types { ...T } directives { name args { ...V } } } }
        fragment T on __Type { kind name description fields(includeDeprecated: true) { name args { ...V } type { ...R } isDeprecated }
            inputFields { ...V } interfaces { ...R } enumValues(includeDeprecated: true) { name } possibleTypes { ...R } }
        fragment V on __InputValue { name description type { ...R } defaultValue }
        fragment R on __Type { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } } } }";
    let (status, body) = viewer
        .post("/graphql", json!({ "query": introspection }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.get("errors").is_none(), "{body}");
    // A body past the limit is refused before it is parsed (and the connection closed).
    let huge = format!("{{ viewer {{ orgId }} }} # {}", "x".repeat(300 << 10));
    let answer = server
        .as_key(&server.key_in("tenant-a", json!({ "role": "viewer" })).await)
        .try_raw(
            Method::POST,
            "/graphql",
            Some(json!({ "query": huge }).to_string().into_bytes()),
            Some("application/json"),
        )
        .await;
    if let Some((status, _)) = answer {
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    }
    assert_healthy(&server).await;
}

/// Every route of the OpenAPI document with a path parameter, with `a%00b` for each.
async fn routes_with_parameters(server: &Server) -> Vec<(Method, String, Vec<String>)> {
    let (status, openapi) = server.anonymous().get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let mut routes = Vec::new();
    for (path, item) in openapi["paths"].as_object().unwrap() {
        if !path.contains('{') {
            continue;
        }
        let params: Vec<String> = path
            .split('{')
            .skip(1)
            .map(|p| p.split('}').next().unwrap().to_string())
            .collect();
        for method in ["get", "post", "put", "delete", "patch"] {
            if item.get(method).is_some() {
                let mut with_nul = path.clone();
                for p in &params {
                    with_nul = with_nul.replace(&format!("{{{p}}}"), "a%00b");
                }
                routes.push((
                    Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                    with_nul,
                    params.clone(),
                ));
            }
        }
    }
    routes
}

async fn a_nul_byte_in_any_path_id_is_invalid_input_naming_the_parameter(db: Db) {
    let server = Server::start(db).await;
    let admin = server.admin();
    let routes = routes_with_parameters(&server).await;
    assert!(routes.len() >= 20, "{routes:?}");
    for (method, path, params) in routes {
        let body = (method != Method::GET && method != Method::DELETE).then(|| json!({}));
        let (status, answer) = admin.call(method.clone(), &path, body).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        let field = answer["error"]["details"]["field"]
            .as_str()
            .unwrap_or_default();
        assert!(
            params.iter().any(|p| p == field),
            "{method} {path}: {answer} should name one of {params:?}"
        );
    }
    // Other control characters are refused the same way; ordinary unknown ids are 404.
    let (status, answer) = admin.get("/v1/pools/a%0Ab").await;
    assert_error(status, &answer, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(answer["error"]["details"]["field"], "poolId");
    let (status, answer) = admin.get("/v1/pools/nope").await;
    assert_error(status, &answer, StatusCode::NOT_FOUND, "NOT_FOUND");
    // Query parameters too.
    let (status, answer) = admin.get("/v1/audit?cursor=a%00b").await;
    assert_error(status, &answer, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(answer["error"]["details"]["field"], "cursor");
    assert!(
        !server.stderr().contains("request failed"),
        "{}",
        server.stderr()
    );
    assert_healthy(&server).await;
}

async fn a_nul_byte_in_a_graphql_argument_is_invalid_input(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 2).await;
    let admin = server.admin();
    for (query, variables) in [
        ("{ node(id: \"a\\u0000b\") { id } }", json!({})),
        ("{ pool(id: \"a\\u0000b\") { id } }", json!({})),
        ("{ catalog(orgId: \"a\\u0000b\") { orgId } }", json!({})),
        (
            "query($id: String!) { node(id: $id) { id } }",
            json!({ "id": "a\u{0}b" }),
        ),
        (
            "query($id: String!) { pool(id: $id) { id } }",
            json!({ "id": "a\u{0}b" }),
        ),
        (
            "query($o: String) { catalog(orgId: $o) { orgId } }",
            json!({ "o": "a\u{0}b" }),
        ),
    ] {
        let (status, body) = admin
            .post(
                "/graphql",
                json!({ "query": query, "variables": variables }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{query}: {body}");
        assert_eq!(
            body["errors"][0]["extensions"]["code"], "INVALID_INPUT",
            "{query}: {body}"
        );
    }
    assert!(
        !server.stderr().contains("GraphQL operation failed"),
        "{}",
        server.stderr()
    );
    assert_healthy(&server).await;
}

async fn a_nul_character_in_a_json_string_is_invalid_input_naming_the_field(db: Db) {
    let server = Server::start(db).await;
    let admin = server.admin();
    server.org_with_key("tenant-a", "viewer").await;
    let provider = server.org_with_key("acme", "provider").await;
    let mut labelled = crate::support::h100_inventory("n1", 1);
    labelled["labels"] = json!({ "ra\u{0}ck": "r1" });
    let cases: Vec<(&Api, Method, &str, Value, &str)> = vec![
        (
            &admin,
            Method::POST,
            "/v1/orgs",
            json!({ "id": "x", "name": "a\u{0}b" }),
            "name",
        ),
        (
            &admin,
            Method::PUT,
            "/v1/orgs/tenant-a/iam/policy",
            json!({ "policy": "// a\u{0}b\npermit(principal, action, resource);" }),
            "policy",
        ),
        (
            &admin,
            Method::POST,
            "/api/compute/reservations/create",
            json!({ "tenantId": "tenant-a", "poolId": "p", "devices": [{ "class": "gpu", "count": 1 }],
                    "duration": "1h", "idempotencyKey": "k\u{0}" }),
            "idempotencyKey",
        ),
        (
            &provider,
            Method::PUT,
            "/v1/orgs/acme/provider/nodes/n1",
            labelled,
            "labels.rack",
        ),
    ];
    for (api, method, path, body, field) in cases {
        let (status, answer) = api.call(method, path, Some(body.clone())).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(
            answer["error"]["details"]["field"], field,
            "{body}: {answer}"
        );
    }
    // An escaped backslash before `u0000` is text, not a NUL.
    let (status, body) = admin
        .put(
            "/v1/orgs/tenant-a/iam/policy",
            json!({ "policy": "// \\u0000\npermit(principal, action, resource);" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        !server.stderr().contains("request failed"),
        "{}",
        server.stderr()
    );
    assert_healthy(&server).await;
}

/// Reads from `stream` until the server closes it (or `wait` passes); returns what was
/// read and whether the server closed the connection.
async fn read_until_closed(stream: &mut TcpStream, wait: Duration) -> (String, bool) {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&seen).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&seen).into_owned(), true),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

fn host_port(server: &Server) -> String {
    server.url.trim_start_matches("http://").to_string()
}

async fn slow_headers_trickled_bodies_and_idle_connections_are_cut_off_but_streams_live_on(db: Db) {
    let options = Options {
        args: ["--header-timeout", "1s", "--body-timeout", "2s"]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    };
    let server = Server::start_with(db, options).await;
    let addr = host_port(&server);

    // Headers that never finish.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut slow, Duration::from_secs(10)).await;
    assert!(
        closed,
        "a connection that never finishes its headers is closed"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // A body trickled a byte at a time.
    let mut trickle = TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/orgs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        server.admin
    );
    trickle.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let answer = async {
        loop {
            if trickle.write_all(b" ").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if started.elapsed() > Duration::from_secs(10) {
                break;
            }
            let mut buf = [0u8; 4096];
            if let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_millis(1), trickle.read(&mut buf)).await
            {
                return String::from_utf8_lossy(&buf[..n]).into_owned();
            }
        }
        String::new()
    }
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "a trickled body is cut off: {:?}",
        started.elapsed()
    );
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );

    // A kept-alive connection that goes quiet is closed.
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (seen, closed) = read_until_closed(&mut idle, Duration::from_secs(10)).await;
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(closed, "an idle connection is closed");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    // An event stream outlives every one of those timeouts.
    let response = reqwest::Client::new()
        .get(format!("{}/v1/events/stream", server.url))
        .bearer_auth(&server.admin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut response = response;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "late", 1).await;
    let mut text = String::new();
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if text.contains("data:") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(got, Ok(true), "the stream still delivers after 4 s: {text}");
    assert_healthy(&server).await;
}

async fn the_connection_limit_queues_connections_past_it(db: Db) {
    let options = Options {
        args: ["--max-connections", "4", "--header-timeout", "2s"]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    };
    let server = Server::start_with(db, options).await;
    let addr = host_port(&server);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The fifth waits until a slot frees (here: the silent ones time out), then is served.
    let started = Instant::now();
    let (status, _) = server.anonymous().get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        started.elapsed() > Duration::from_millis(1_000),
        "served past the limit after {:?}",
        started.elapsed()
    );
    drop(held);
    assert_healthy(&server).await;
}

async fn a_json_array_is_refused_where_an_object_is_expected_and_nothing_is_written(db: Db) {
    let server = Server::start(db).await;
    let admin = server.admin();
    let (status, body) = admin
        .post("/v1/orgs", json!(["arrayorg", "Array org"]))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, _) = admin.get("/v1/orgs/arrayorg").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");
    let provider = server.org_with_key("acme", "provider").await;
    let (status, body) = provider
        .put(
            "/v1/orgs/acme/provider/nodes/n1",
            json!(["eu-west-1", [224, 2048, 512], []]),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    // Nested objects given as arrays are refused too, naming where.
    let (status, body) = provider
        .put(
            "/v1/orgs/acme/provider/nodes/n1",
            json!({ "region": "eu-west-1", "host": [224, 2048, 512], "units": [] }),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(body["error"]["details"]["field"], "host", "{body}");
    let mut unit_as_array = crate::support::h100_inventory("n1", 1);
    unit_as_array["units"][0] = json!(["n1-gpu0", "vfio-group", "gpu", "H100", 80, "nvl0", true]);
    let (status, body) = provider
        .put("/v1/orgs/acme/provider/nodes/n1", unit_as_array)
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(body["error"]["details"]["field"], "units[0]", "{body}");
    let (status, _) = provider.get("/v1/nodes/n1").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");
    for path in [
        "/api/compute/reservations/create",
        "/api/compute/reservations/get",
        "/api/compute/reservations/list",
    ] {
        let (status, body) = admin.post(path, json!(["ops", "x"])).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        for word in ["sequence", "struct"] {
            assert!(
                !body["error"]["message"].as_str().unwrap().contains(word),
                "{path}: {body}"
            );
        }
    }
}

async fn mistyped_fields_are_named_in_details_and_worded_without_rust_types(db: Db) {
    let server = Server::start(db).await;
    let admin = server.admin();
    let provider = server.org_with_key("acme", "provider").await;
    let mut inventory = crate::support::h100_inventory("n1", 2);
    inventory["units"][1]["memoryGiB"] = json!("eighty");
    let mut negative = crate::support::h100_inventory("n1", 2);
    negative["host"]["vcpu"] = json!(-1);
    let cases: Vec<(&Api, &str, Value, &str)> = vec![
        (&admin, "/v1/orgs", json!({ "id": 7, "name": "x" }), "id"),
        (&admin, "/v1/orgs", json!({ "name": "x" }), "id"),
        (&admin, "/v1/orgs", json!("text"), ""),
        (
            &admin,
            "/api/compute/reservations/create",
            json!({ "tenantId": "ops", "poolId": "p",
            "devices": [{ "class": "gpu", "count": "two" }], "duration": "1h", "idempotencyKey": "k" }),
            "devices[0].count",
        ),
        (
            &admin,
            "/api/compute/reservations/create",
            json!({ "tenantId": "ops", "poolId": "p",
            "devices": [{ "class": "gpu", "count": 1.5 }], "duration": "1h", "idempotencyKey": "k" }),
            "devices[0].count",
        ),
        (
            &admin,
            "/api/compute/reservations/create",
            json!({ "tenantId": "ops", "poolId": "p",
            "devices": { "class": "gpu" }, "duration": "1h", "idempotencyKey": "k" }),
            "devices",
        ),
        (
            &admin,
            "/api/compute/reservations/list",
            json!({ "tenantId": "ops", "limit": "ten" }),
            "limit",
        ),
        (
            &admin,
            "/api/compute/reservations/create",
            json!({ "tenantId": "ops", "poolId": "p",
            "devices": [], "duration": "1h", "idempotencyKey": "k", "color": "red" }),
            "color",
        ),
        (
            &provider,
            "/v1/orgs/acme/provider/nodes/n1",
            inventory,
            "units[1].memoryGiB",
        ),
        (
            &provider,
            "/v1/orgs/acme/provider/nodes/n1",
            negative,
            "host.vcpu",
        ),
    ];
    for (api, path, body, field) in cases {
        let method = if path.contains("/provider/nodes/") {
            Method::PUT
        } else {
            Method::POST
        };
        let (status, answer) = api.call(method, path, Some(body.clone())).await;
        assert_error(status, &answer, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        let message = answer["error"]["message"].as_str().unwrap();
        if !field.is_empty() {
            assert_eq!(
                answer["error"]["details"]["field"], field,
                "{body}: {answer}"
            );
        }
        for rust in [
            "struct ", "u8", "u16", "u32", "u64", "i32", "i64", "usize", "f64", "Request",
            "Option<", "Vec<", "alloc::", "::",
        ] {
            assert!(
                !message.contains(rust),
                "{body}: {message:?} names {rust:?}"
            );
        }
    }
}

async fn the_bearer_scheme_is_case_insensitive(db: Db) {
    let server = Server::start(db).await;
    let http = reqwest::Client::new();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let response = http
            .get(format!("{}/v1/orgs/ops", server.url))
            .header("authorization", format!("{scheme} {}", server.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{scheme}");
    }
    let response = http
        .post(format!("{}/graphql", server.url))
        .header("authorization", format!("bearer {}", server.admin))
        .json(&json!({ "query": "{ viewer { orgId } }" }))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["data"]["viewer"]["orgId"], "ops", "{body}");
    for wrong in ["Basic abc", "Bearerxyz", "bearer"] {
        let response = http
            .get(format!("{}/v1/orgs/ops", server.url))
            .header("authorization", wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{wrong}");
    }
}

async fn the_database_file_and_the_plugin_cache_are_private_to_the_owner(db: Db) {
    use std::os::unix::fs::PermissionsExt as _;
    let server = Server::start(db).await;
    // Write something so the WAL exists.
    server.org_with_key("tenant-a", "viewer").await;
    let mode = |path: std::path::PathBuf| {
        std::fs::metadata(&path)
            .map(|m| m.permissions().mode() & 0o777)
            .ok()
    };
    let dir = server.data_dir.path();
    if db == Db::Sqlite {
        assert_eq!(mode(dir.join("orl.db")), Some(0o600), "orl.db");
        for file in ["orl.db-wal", "orl.db-shm"] {
            if let Some(m) = mode(dir.join(file)) {
                assert_eq!(m, 0o600, "{file}");
            }
        }
    }
    assert_eq!(mode(dir.join("plugins")), Some(0o700), "plugin cache");
    assert_eq!(
        mode(dir.join("plugin-config")),
        Some(0o700),
        "plugin config"
    );
}
