//! `/openapi.json`: the document generated from the handlers' `#[utoipa::path]`
//! annotations, completed with what those cannot say on their own: the input constraints
//! the server enforces, the answers every operation can give (401 without a key, 400 for
//! input that does not decode, 413 for a body over the limit, 500), the routes outside
//! the REST router (`/healthz`, `/metrics`, `/graphql`, `/openapi.json`, `/v1/clock`),
//! and bodies that may be left out declared as their object, never as `null`.

use serde_json::{Map, Value, json};

use crate::inventory::{LABEL_KEY_PATTERN, LABEL_VALUE_PATTERN, MAX_LABELS, MAX_UNITS};

/// Org, node, unit and tenant ids, idempotency keys (`validation::ID`).
const ID: &str = r"^[A-Za-z0-9._:-]{1,128}$";
const POOL_ID: &str = r"^pool_[0-9a-hjkmnp-tv-z]{26,52}$";
const PROJECT_ID: &str = r"^prj_[0-9a-hjkmnp-tv-z]{26,52}$";
const RESERVATION_ID: &str = r"^rsv_[0-9a-hjkmnp-tv-z]{26,52}$";
const PROFILE_ID: &str = r"^[A-Za-z0-9._:/-]{1,128}$";
/// The largest instant (`start`, `until`, `window.*`) the API accepts, in epoch ms.
const MAX_INSTANT_MS: i64 = crate::booking::MAX_INSTANT_MS;

/// The document as served.
pub fn document(openapi: &utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(openapi).expect("the OpenAPI document serializes");
    for operation in operations(&mut doc) {
        optional_body_is_its_object(operation);
    }
    constrain_schemas(&mut doc);
    add_operational_routes(&mut doc);
    for operation in operations(&mut doc) {
        add_common_answers(operation);
    }
    doc
}

/// Every operation of every path.
fn operations(doc: &mut Value) -> impl Iterator<Item = &mut Value> {
    doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(|item| item.as_object_mut())
        .flat_map(|item| item.values_mut())
}

/// A body that may be left out (`Option<T>`) is declared not required and of `T`'s
/// schema, not as `T` or `null`: a body must be a JSON object, and `null` is refused.
fn optional_body_is_its_object(operation: &mut Value) {
    // `pointer_mut`, not indexing: indexing would add a `requestBody` to every operation.
    let bodies = operation
        .pointer_mut("/requestBody/content")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|content| content.values_mut());
    for media in bodies {
        let Some(alternatives) = media["schema"]["oneOf"].as_array() else {
            continue;
        };
        let not_null: Vec<&Value> = alternatives
            .iter()
            .filter(|s| s["type"] != "null")
            .collect();
        if let [schema] = not_null[..]
            && not_null.len() < alternatives.len()
        {
            media["schema"] = schema.clone();
        }
    }
}

fn error(description: &str) -> Value {
    json!({
        "description": description,
        "content": { "application/json": { "schema": { "$ref": "#/components/schemas/ErrorEnvelope" } } }
    })
}

/// The answers any operation can give besides its own: `401 UNAUTHENTICATED` when it takes
/// a key and none (or a revoked or unknown one) is sent; `400 INVALID_INPUT` when a path or
/// query parameter or the body does not decode; `413 PAYLOAD_TOO_LARGE` for a body over the
/// limit; `500 INTERNAL` always.
fn add_common_answers(operation: &mut Value) {
    let anonymous = operation["security"].as_array().is_some_and(|s| {
        s.is_empty() || s.iter().all(|r| r.as_object().is_some_and(Map::is_empty))
    });
    let has_input = operation["parameters"]
        .as_array()
        .is_some_and(|p| !p.is_empty());
    let has_body = operation.get("requestBody").is_some();
    let Some(responses) = operation["responses"].as_object_mut() else {
        return;
    };
    let mut add = |code: &str, description: &str| {
        responses.entry(code).or_insert_with(|| error(description));
    };
    if !anonymous {
        add(
            "401",
            "UNAUTHENTICATED: no API key, or one that is unknown or revoked",
        );
    }
    if has_input || has_body {
        add(
            "400",
            "INVALID_INPUT: a parameter or the body is malformed or breaks a constraint; `details.field` names it",
        );
    }
    if has_body {
        add("413", "PAYLOAD_TOO_LARGE: the body is over the limit");
    }
    add(
        "500",
        "INTERNAL: a server fault (logged; the message says nothing more)",
    );
}

/// The routes the server answers outside the REST router.
fn add_operational_routes(doc: &mut Value) {
    let anyone: Value = json!([]);
    let routes = json!({
        "/healthz": { "get": {
            "tags": ["operations"], "operationId": "healthz", "security": anyone,
            "summary": "Whether the server can reach its database.",
            "responses": {
                "200": { "description": "Serving", "content": { "application/json": { "schema": health("ok") } } },
                "503": { "description": "The database is unreachable", "content": { "application/json": { "schema": health("database unreachable") } } }
            }
        }},
        "/metrics": { "get": {
            "tags": ["operations"], "operationId": "metrics", "security": anyone,
            "summary": "Prometheus metrics (OpenMetrics text).",
            "responses": { "200": { "description": "The exposition", "content": {
                "application/openmetrics-text": { "schema": { "type": "string" } }
            } } }
        }},
        "/openapi.json": { "get": {
            "tags": ["operations"], "operationId": "openapi", "security": anyone,
            "summary": "This document.",
            "responses": { "200": { "description": "The OpenAPI document", "content": {
                "application/json": { "schema": { "type": "object" } }
            } } }
        }},
        "/graphql": {
            "get": {
                "tags": ["graphql"], "operationId": "graphiql", "security": anyone,
                "summary": "GraphiQL for a browser, or the subscription WebSocket on an upgrade (`graphql-transport-ws`; the key goes in `connection_init`).",
                "responses": {
                    "200": { "description": "The GraphiQL page", "content": { "text/html": { "schema": { "type": "string" } } } },
                    "101": { "description": "Switched to the subscription WebSocket" }
                }
            },
            "post": {
                "tags": ["graphql"], "operationId": "graphql",
                "summary": "A GraphQL query or mutation, scoped to the caller's org by the same rules as REST.",
                "requestBody": { "required": true, "content": { "application/json": { "schema": {
                    "type": "object", "required": ["query"],
                    "properties": {
                        "query": { "type": "string" },
                        "operationName": { "type": ["string", "null"] },
                        "variables": { "type": ["object", "null"] }
                    }
                } } } },
                "responses": { "200": {
                    "description": "`data` and, for each field that failed, an entry of `errors` with `extensions.code`",
                    "content": { "application/json": { "schema": { "type": "object" } } }
                } }
            }
        },
        "/v1/clock": { "post": {
            "tags": ["operations"], "operationId": "setClock",
            "summary": "Move the manual clock (platform admins). Served only when the server runs on a manual clock (tests); otherwise 404.",
            "requestBody": { "required": true, "content": { "application/json": { "schema": {
                "type": "object", "required": ["nowMs"], "additionalProperties": false,
                "properties": { "nowMs": { "type": "integer", "format": "int64" } }
            } } } },
            "responses": {
                "200": { "description": "The clock's new instant", "content": { "application/json": { "schema": {
                    "type": "object", "required": ["nowMs"],
                    "properties": { "nowMs": { "type": "integer", "format": "int64" } }
                } } } },
                "404": error("NOT_FOUND: not a platform admin, or the server's clock is not manual")
            }
        }}
    });
    let paths = doc["paths"]
        .as_object_mut()
        .expect("the document has paths");
    for (path, item) in routes.as_object().expect("routes are an object") {
        paths.insert(path.clone(), item.clone());
    }
}

fn health(status: &str) -> Value {
    json!({ "type": "object", "required": ["status"], "properties": { "status": { "type": "string", "examples": [status] } } })
}

/// What [`crate::validation`] and the request types check, by schema and property: the
/// server refuses anything else with `400 INVALID_INPUT` naming the field.
fn constraints() -> Vec<(&'static str, &'static str, Value)> {
    let id = json!({ "pattern": ID, "maxLength": 128 });
    let ids = |max: usize| json!({ "maxItems": max, "items": { "pattern": ID, "maxLength": 128 } });
    let unit_ids = json!({ "minItems": 1, "maxItems": MAX_UNITS, "uniqueItems": true, "items": { "pattern": ID, "maxLength": 128 } });
    let text = |max: usize| json!({ "maxLength": max });
    let range = |min: i64, max: i64| json!({ "minimum": min, "maximum": max });
    let labels = json!({
        "maxProperties": MAX_LABELS,
        "propertyNames": { "pattern": LABEL_KEY_PATTERN, "maxLength": 253 },
        "additionalProperties": { "type": "string", "pattern": LABEL_VALUE_PATTERN, "maxLength": 63 }
    });
    let tenant = json!({ "pattern": ID, "maxLength": 128 });
    let pool = json!({ "pattern": POOL_ID, "maxLength": 57 });
    let reservation = json!({ "pattern": RESERVATION_ID, "maxLength": 56 });
    vec![
        ("NewOrg", "id", id.clone()),
        ("NewOrg", "name", text(200)),
        ("NewKey", "name", text(200)),
        ("NewKey", "legacyKey", text(200)),
        ("NodeInventory", "region", id.clone()),
        ("NodeInventory", "labels", labels.clone()),
        ("NodeInventory", "units", json!({ "maxItems": MAX_UNITS })),
        ("HostResources", "vcpu", range(0, 1 << 20)),
        ("HostResources", "memoryGiB", range(0, 1 << 24)),
        ("HostResources", "hugepages1Gi", range(0, 1 << 24)),
        ("Unit", "id", id.clone()),
        ("Unit", "model", text(128)),
        ("Unit", "memoryGiB", range(0, 1 << 20)),
        ("Unit", "nvlinkDomain", id.clone()),
        ("Unit", "labels", labels.clone()),
        ("NewNodeReservation", "unitIds", unit_ids.clone()),
        ("NewNodeReservation", "allowedOrgIds", ids(256)),
        ("NewNodeReservation", "managingOrgIds", ids(256)),
        ("NewNodeReservation", "contractRef", text(256)),
        ("NewNodeReservation", "reason", text(1024)),
        ("ReleaseUnits", "unitIds", unit_ids.clone()),
        ("ReleaseUnits", "reason", text(1024)),
        ("ReclaimUnits", "unitIds", unit_ids.clone()),
        ("ReclaimUnits", "reason", text(1024)),
        ("Because", "reason", text(1024)),
        ("ReclaimSpot", "unitIds", unit_ids),
        ("ReclaimSpot", "reason", text(1024)),
        ("NewPayout", "amountMinor", json!({ "minimum": 1 })),
        (
            "NewPayout",
            "reference",
            text(crate::earnings::MAX_REFERENCE),
        ),
        ("NewPool", "name", text(200)),
        ("NewPool", "ownerOrgId", id.clone()),
        (
            "NewPool",
            "nodeIds",
            json!({ "items": { "pattern": ID, "maxLength": 128 } }),
        ),
        (
            "PoolNodes",
            "nodeIds",
            json!({ "items": { "pattern": ID, "maxLength": 128 } }),
        ),
        ("PerGpu", "vcpu", range(0, 4096)),
        ("PerGpu", "memoryGiB", range(0, 65536)),
        ("NewOffer", "tenantId", id.clone()),
        (
            "NewOffer",
            "quota",
            json!({ "additionalProperties": range(0, 1 << 40) }),
        ),
        ("NewOffer", "pricePerGpuHour", range(0, 1 << 40)),
        ("NewOffer", "budget", range(0, 1 << 50)),
        ("OrgPolicy", "policy", text(256 * 1024)),
        ("PoolPolicies", "deadlineMs", range(1, 10_000)),
        ("Report", "message", text(1000)),
        // The compute reservation RPC, exactly as its reference tables give them.
        ("CreateRequest", "tenantId", tenant.clone()),
        ("CreateRequest", "poolId", pool.clone()),
        (
            "CreateRequest",
            "projectId",
            json!({ "pattern": PROJECT_ID, "maxLength": 56 }),
        ),
        (
            "CreateRequest",
            "devices",
            json!({ "minItems": 1, "maxItems": 8 }),
        ),
        ("CreateRequest", "start", range(0, MAX_INSTANT_MS)),
        ("CreateRequest", "leaseSeconds", range(30, 86_400)),
        ("CreateRequest", "idempotencyKey", id.clone()),
        ("DeviceRequest", "count", range(1, 64)),
        ("Selector", "model", text(128)),
        ("Selector", "labels", labels),
        ("Resources", "vcpu", range(0, 4096)),
        ("Resources", "memoryGiB", range(0, 65536)),
        ("Resources", "hugepages1Gi", range(0, 4096)),
        (
            "NodeProfile",
            "profileId",
            json!({ "pattern": PROFILE_ID, "maxLength": 128 }),
        ),
        ("NodeProfile", "profileVersion", json!({ "minimum": 1 })),
        ("Wait", "timeoutMs", range(0, crate::booking::MAX_WAIT_MS)),
        ("Gang", "size", range(2, 64)),
        ("Gang", "topologyKey", text(128)),
        ("ReservationRef", "tenantId", tenant.clone()),
        ("ReservationRef", "reservationId", reservation.clone()),
        ("ListInput", "tenantId", tenant.clone()),
        ("ListInput", "poolId", pool.clone()),
        ("ListInput", "limit", range(1, 200)),
        ("ListInput", "cursor", reservation.clone()),
        ("ExtendInput", "tenantId", tenant.clone()),
        ("ExtendInput", "reservationId", reservation),
        ("ExtendInput", "until", range(0, MAX_INSTANT_MS)),
        ("ExtendInput", "idempotencyKey", id),
        ("AvailabilityRequest", "tenantId", tenant),
        ("AvailabilityRequest", "poolId", pool),
        (
            "AvailabilityRequest",
            "devices",
            json!({ "minItems": 1, "maxItems": 8 }),
        ),
        ("AvailabilityRequest", "limit", range(1, 50)),
        ("Window", "from", range(0, MAX_INSTANT_MS)),
        ("Window", "to", range(0, MAX_INSTANT_MS)),
    ]
}

/// Declares [`constraints`] on the component schemas. A constraint whose schema or
/// property the document lacks is a mistake in this table: it is skipped here, so the
/// server still serves, and the unit test below names it.
fn constrain_schemas(doc: &mut Value) {
    for (schema, property, constraint) in constraints() {
        let pointer = format!("/components/schemas/{schema}/properties/{property}");
        if let Some(target) = doc.pointer_mut(&pointer) {
            merge(target, constraint);
        }
    }
}

/// Merges `extra` into `target`. Where `target` is `T or null` (`oneOf`), the constraint
/// goes on `T`.
fn merge(target: &mut Value, extra: Value) {
    if let Some(alternatives) = target.get_mut("oneOf").and_then(Value::as_array_mut)
        && let Some(schema) = alternatives.iter_mut().find(|s| s["type"] != "null")
    {
        return merge(schema, extra);
    }
    let (Some(target), Value::Object(extra)) = (target.as_object_mut(), extra) else {
        return;
    };
    for (key, value) in extra {
        match target.get_mut(&key) {
            Some(existing) if existing.is_object() && value.is_object() => merge(existing, value),
            _ => {
                target.insert(key, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use utoipa::OpenApi as _;
    use utoipa_axum::router::OpenApiRouter;

    use super::*;
    use crate::App;

    fn served() -> Value {
        let (_, openapi) = OpenApiRouter::<Arc<App>>::with_openapi(super::super::ApiDoc::openapi())
            .merge(crate::api::rest::router())
            .split_for_parts();
        document(&openapi)
    }

    #[test]
    fn every_declared_constraint_lands_on_a_property() {
        let doc = served();
        for (schema, property, constraint) in constraints() {
            let declared = &doc["components"]["schemas"][schema]["properties"][property];
            assert!(declared.is_object(), "no property {schema}.{property}");
            let declared = declared.to_string();
            for key in constraint.as_object().unwrap().keys() {
                assert!(
                    declared.contains(&format!("\"{key}\"")),
                    "{schema}.{property}: {declared}"
                );
            }
        }
    }

    #[test]
    fn operation_ids_are_unique_and_authenticated_operations_answer_401() {
        let mut doc = served();
        let mut ids = std::collections::BTreeSet::new();
        for operation in operations(&mut doc) {
            let id = operation["operationId"].as_str().unwrap().to_string();
            assert!(ids.insert(id.clone()), "{id} repeats");
            let anonymous = operation["security"] == json!([]);
            assert_eq!(
                operation["responses"].get("401").is_some(),
                !anonymous,
                "{id}"
            );
        }
        assert!(ids.contains("compute_reservations_create") && ids.contains("healthz"));
    }
}
