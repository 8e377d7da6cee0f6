//! Sweeps over every route of the API, taken from the router's own registrations
//! ([`orl::api::routes`]), not listed by hand: each one refuses a caller without a key, a key
//! of another org (a person's or an agent's) and a key of the owning org without the
//! permission, with 401 or 404, and writes nothing; each mutating route has its audit rule
//! ([`crate::call_log`]); each is in `/openapi.json`.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::call_log::{self, Call};
use crate::support::{Api, Db, Server, on_both_databases, register_node};

on_both_databases!(
    every_route_refuses_strangers_other_orgs_agents_and_keys_without_the_permission_and_writes_nothing,
    every_route_of_the_router_is_in_openapi_and_every_mutating_one_has_an_audit_rule,
);

/// What the sweep's callers try to reach: `acme`'s node, pool, key and node reservation,
/// and `tenant-a`'s compute reservation in that pool.
struct Victim {
    server: Server,
    pool: String,
    reservation: String,
    node_reservation: String,
    key_id: String,
    plugin: String,
}

async fn victim(db: Db) -> Victim {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    register_node(&provider, "acme", "n1", 8).await;
    let tenant = server.org_with_key("tenant-a", "member").await;
    let admin = server.admin();
    let (status, pool) = admin
        .post(
            "/v1/pools",
            json!({ "name": "p", "ownerOrgId": "acme", "nodeIds": ["n1"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    let (status, offer) = admin
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": 8 } }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
    let (status, reservation) = tenant
        .post(
            "/api/compute/reservations/create",
            json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 1 }],
                    "duration": "2h", "idempotencyKey": "k-1" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{reservation}");
    let (status, node_reservation) = admin
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": ["n1-gpu6", "n1-gpu7"], "allowedOrgIds": ["tenant-a"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{node_reservation}");
    let (status, key) = admin
        .post("/v1/orgs/acme/api-keys", json!({ "role": "viewer" }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{key}");
    let (_, plugins) = admin.get("/v1/plugins").await;
    Victim {
        pool,
        reservation: reservation["id"].as_str().unwrap().to_string(),
        node_reservation: node_reservation["id"].as_str().unwrap().to_string(),
        key_id: key["id"].as_str().unwrap().to_string(),
        plugin: plugins["items"][0]["id"]
            .as_str()
            .unwrap_or("plg_none")
            .to_string(),
        server,
    }
}

impl Victim {
    /// `template` with each parameter filled with the victim's object of that name.
    fn path(&self, template: &str) -> String {
        let id = if template.starts_with("/v1/plugins") {
            self.plugin.as_str()
        } else if template.contains("/confirmations/") {
            "cnf_01jc0000000000000000000000"
        } else {
            self.node_reservation.as_str()
        };
        let query = if template == "/v1/nodes/availability" {
            "?unitCount=1"
        } else {
            ""
        };
        let path = template
            .replace("{orgId}", "acme")
            .replace("{nodeId}", "n1")
            .replace("{poolId}", &self.pool)
            .replace("{keyId}", &self.key_id)
            .replace("{reservationId}", &self.reservation)
            .replace("{id}", id);
        format!("{path}{query}")
    }

    /// A body the route's owner could send (so a refusal is not a validation error).
    fn body(&self, method: &str, template: &str) -> Option<Value> {
        let rpc = |extra: Value| {
            let mut body = json!({ "tenantId": "tenant-a", "reservationId": self.reservation });
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            Some(body)
        };
        let ask = json!({ "tenantId": "tenant-a", "poolId": self.pool,
                          "devices": [{ "class": "gpu", "count": 1 }], "duration": "2h" });
        match (method, template) {
            ("GET" | "DELETE", _) => None,
            (_, "/v1/orgs") => Some(json!({ "id": "intruder", "name": "intruder" })),
            (_, "/v1/orgs/{orgId}/api-keys") => Some(json!({ "role": "admin" })),
            (_, "/v1/orgs/{orgId}/provider/nodes/{nodeId}") => {
                Some(crate::support::h100_inventory("n1", 4))
            }
            (_, "/v1/orgs/{orgId}/provider/nodes/{nodeId}/reclaim-spot") => {
                Some(json!({ "reason": "maintenance" }))
            }
            (_, "/v1/orgs/{orgId}/provider/payouts") => Some(json!({ "amountMinor": 1 })),
            (_, "/v1/orgs/{orgId}/iam/policy") => {
                Some(json!({ "policy": "forbid(principal, action, resource);" }))
            }
            (_, "/v1/nodes/{nodeId}/bindings/{reservationId}") => {
                Some(json!({ "status": "failed" }))
            }
            (_, "/v1/nodes/{nodeId}/reservations") => {
                Some(json!({ "unitIds": ["n1-gpu5"], "allowedOrgIds": ["rival"] }))
            }
            (_, "/v1/nodes/{nodeId}/reservations/{id}/release") => {
                Some(json!({ "unitIds": ["n1-gpu6"] }))
            }
            (_, "/v1/nodes/{nodeId}/reservations/{id}/reclaim") => {
                Some(json!({ "unitIds": ["n1-gpu6"], "reason": "maintenance" }))
            }
            (_, "/v1/pools") => {
                Some(json!({ "name": "q", "ownerOrgId": "acme", "nodeIds": ["n1"] }))
            }
            (_, "/v1/pools/{poolId}/nodes") => Some(json!({ "nodeIds": [] })),
            (_, "/v1/pools/{poolId}/offers") => {
                Some(json!({ "tenantId": "rival", "quota": { "gpu": 8 } }))
            }
            (_, "/v1/pools/{poolId}/policies") => Some(json!({ "placement": self.plugin })),
            (_, "/v1/clock") => Some(json!({ "nowMs": crate::support::T0 + crate::support::HOUR })),
            (_, "/api/compute/reservations/create") => {
                let mut body = ask;
                body["idempotencyKey"] = json!("intruder");
                Some(body)
            }
            (_, "/api/compute/reservations/availability") => {
                let mut body = ask;
                body["window"] =
                    json!({ "from": crate::support::T0, "to": crate::support::T0 + 86_400_000 });
                Some(body)
            }
            (_, "/api/compute/reservations/plan") => {
                let mut body = ask;
                body["idempotencyKey"] = json!("intruder");
                Some(body)
            }
            (_, "/api/compute/reservations/list") => Some(json!({ "tenantId": "tenant-a" })),
            (_, "/api/compute/reservations/extend") => {
                rpc(json!({ "by": 3600, "idempotencyKey": "intruder" }))
            }
            (_, template) if template.starts_with("/api/compute/reservations/") => rpc(json!({})),
            _ => Some(json!({})),
        }
    }

    /// The ids of the victim's objects, none of which a refused caller may be shown.
    fn secrets(&self) -> [&str; 5] {
        [
            &self.pool,
            &self.reservation,
            &self.node_reservation,
            &self.key_id,
            "n1-gpu",
        ]
    }
}

/// Everything the database holds, in a comparable form: row counts of every table and
/// the fields the API's mutations change.
async fn snapshot(server: &Server) -> Vec<String> {
    let mut db = server.database().await;
    let mut seen = Vec::new();
    for table in [
        "orgs",
        "api_keys",
        "nodes",
        "units",
        "audit_log",
        "events",
        "node_reservations",
        "node_reservation_units",
        "pools",
        "pool_nodes",
        "offers",
        "quota_usage",
        "compute_reservations",
        "bookings",
        "host_bookings",
        "iam_policies",
        "confirmations",
        "plugins",
        "pool_policies",
        "payouts",
        "reservation_bindings",
    ] {
        let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&mut db)
            .await
            .unwrap();
        seen.push(format!("{table}: {count}"));
    }
    for digest in [
        "SELECT id || ' ' || state || ' ' || CAST(end_ms AS TEXT) || ' ' || CAST(version AS TEXT) FROM compute_reservations",
        "SELECT id || ' ' || lifecycle || ' ' || COALESCE(CAST(ends_at AS TEXT), '-') FROM node_reservations",
        "SELECT reservation_id || ' ' || unit_id || ' ' || CAST(released AS TEXT) FROM node_reservation_units",
        "SELECT id || ' ' || COALESCE(CAST(revoked_at AS TEXT), '-') FROM api_keys",
        "SELECT id || ' ' || CAST(topology_gen AS TEXT) FROM nodes",
        "SELECT id || ' ' || COALESCE(CAST(archived_at AS TEXT), '-') || ' ' || policy FROM pools",
        "SELECT pool_id || ' ' || tenant_id || ' ' || quota FROM offers",
        "SELECT pool_id || ' ' || tenant_id || ' ' || resource || ' ' || CAST(used AS TEXT) FROM quota_usage",
        "SELECT org_id || ' ' || policy FROM iam_policies",
        "SELECT reservation_id || ' ' || unit_id || ' ' || CAST(end_ms AS TEXT) || ' ' || CAST(active AS TEXT) FROM bookings",
    ] {
        let mut rows: Vec<String> = sqlx::query_scalar(digest).fetch_all(&mut db).await.unwrap();
        rows.sort();
        seen.extend(rows);
    }
    seen
}

/// Calls `method path` as `api` and answers the status and body; the event stream, which
/// answers a stream, is read only up to its status.
async fn call(
    api: &Api,
    server: &Server,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    if path.starts_with("/v1/events/stream") {
        let mut request = reqwest::Client::new().get(format!("{}{path}", server.url));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        if status.is_success() {
            return (status, Value::Null);
        }
        return (status, response.json().await.unwrap_or(Value::Null));
    }
    api.call(method, path, body).await
}

async fn every_route_refuses_strangers_other_orgs_agents_and_keys_without_the_permission_and_writes_nothing(
    db: Db,
) {
    let v = victim(db).await;
    let server = &v.server;
    server.org_with_key("rival", "admin").await;
    let rival = server.key_in("rival", json!({ "role": "admin" })).await;
    let rival_agent = server
        .key_in("rival", json!({ "role": "admin", "agent": true }))
        .await;
    let acme_without = server
        .key_in("acme", json!({ "permissions": ["events.read"] }))
        .await;
    let tenant_without = server
        .key_in("tenant-a", json!({ "permissions": ["events.read"] }))
        .await;
    let before = snapshot(server).await;
    let routes = orl::api::routes(true);
    assert!(routes.len() >= 50, "{routes:?}");
    let mut refusals = 0;
    for (method, template) in &routes {
        let mut path = v.path(template);
        if method == "POST" && template == "/v1/plugins" {
            path.push_str("?name=intruder&version=1.0.0");
        }
        let body = v.body(method, template);
        let own_without = if template.starts_with("/api/") {
            &tenant_without
        } else {
            &acme_without
        };
        let (status, answer) = call(
            &server.anonymous(),
            server,
            None,
            method,
            &path,
            body.clone(),
        )
        .await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("UNAUTHENTICATED")),
            "{method} {path} without a key: {answer}"
        );
        for (who, key) in [
            ("another org's admin", &rival),
            ("another org's agent", &rival_agent),
            ("a key of the org without the permission", own_without),
        ] {
            let api = server.as_key(key);
            let (status, answer) = call(&api, server, Some(key), method, &path, body.clone()).await;
            let read = method == "GET"
                || matches!(
                    template.as_str(),
                    "/api/compute/reservations/availability" | "/api/compute/reservations/plan"
                );
            if status == StatusCode::NOT_FOUND {
                assert_eq!(
                    answer["error"]["code"], "NOT_FOUND",
                    "{method} {path} as {who}: {answer}"
                );
                refusals += 1;
            } else {
                // A list or search of the caller's own answers, showing nothing of the
                // victim's.
                assert!(
                    read && status == StatusCode::OK,
                    "{method} {path} as {who}: {status} {answer}"
                );
                // A key of the org reads what its org may list (its events, which
                // `events.read` grants, and its pools); only another org must see nothing.
                if key == own_without {
                    continue;
                }
                let shown = answer.to_string();
                for secret in v.secrets() {
                    assert!(
                        !shown.contains(secret),
                        "{method} {path} as {who} shows {secret}: {answer}"
                    );
                }
            }
        }
    }
    assert!(refusals >= 3 * 40, "{refusals} refusals");
    assert_eq!(snapshot(server).await, before, "a refused call wrote");
}

async fn every_route_of_the_router_is_in_openapi_and_every_mutating_one_has_an_audit_rule(db: Db) {
    let server = Server::start(db).await;
    let (status, doc) = server.anonymous().get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let routes = orl::api::routes(false);
    assert!(routes.len() >= 50, "{routes:?}");
    for (method, path) in &routes {
        assert!(
            doc["paths"][path][method.to_lowercase()].is_object(),
            "{method} {path} is routed but not in /openapi.json"
        );
        let mutating = method != "GET";
        let call = Call {
            method: Method::from_bytes(method.as_bytes()).unwrap(),
            path: path.clone(),
            query: String::new(),
            status: StatusCode::OK,
            request: json!({}),
            answer: json!({ "id": "x", "extended": true, "reservation": { "id": "x" } }),
        };
        let (template, _) = call_log::route_of(&call.method, path)
            .unwrap_or_else(|| panic!("{method} {path} matches no route"));
        assert_eq!(&template, path);
        if mutating {
            assert!(
                call_log::expected(&template, &call, |_| "x".to_string()).is_some(),
                "{method} {path} has no audit rule in tests/e2e/call_log.rs"
            );
        }
    }
    // And nothing documented is left unrouted: every operation is the API router's, but
    // the operational routes and GraphQL served beside it.
    let mut operational = Vec::new();
    let mut documented = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            match ["operations", "graphql"].contains(&operation["tags"][0].as_str().unwrap_or("")) {
                true => operational.push(format!("{} {path}", method.to_uppercase())),
                false => documented += 1,
            }
        }
    }
    assert_eq!(documented, routes.len(), "{doc}");
    operational.sort();
    assert_eq!(
        operational,
        [
            "GET /graphql",
            "GET /healthz",
            "GET /metrics",
            "GET /openapi.json",
            "POST /graphql",
            "POST /v1/clock",
        ],
        "the operational routes served beside the API"
    );
}
