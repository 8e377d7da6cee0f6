//! `/openapi.json` is a valid OpenAPI 3.1 document (checked by `openapi-spec-validator`)
//! that describes every route the server answers, every `/v1` path README.md names, the
//! answers each operation can give and the constraints the server enforces.

use std::collections::BTreeSet;
use std::path::PathBuf;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Db, Server, assert_error, on_both_databases};

on_both_databases!(
    the_openapi_document_is_valid_and_names_every_route_and_readme_path,
    the_declared_constraints_are_the_enforced_ones,
);

/// `openapi-spec-validator`: `$ORL_OPENAPI_SPEC_VALIDATOR`, else the virtualenv `.ci/run`
/// creates under `target/`.
fn validator() -> PathBuf {
    if let Some(path) = std::env::var_os("ORL_OPENAPI_SPEC_VALIDATOR") {
        return PathBuf::from(path);
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/openapi-venv/bin/openapi-spec-validator");
    assert!(
        path.exists(),
        "openapi-spec-validator is not installed: run .ci/run, or \
         `python3 -m venv target/openapi-venv && target/openapi-venv/bin/pip install \
         openapi-spec-validator==0.9.0`, or set ORL_OPENAPI_SPEC_VALIDATOR"
    );
    path
}

async fn document(server: &Server) -> Value {
    let (status, doc) = server.anonymous().get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    doc
}

/// Whether the document has an operation `method` on a path whose template matches
/// `path` segment by segment (a `{parameter}` of the template matches any segment).
fn has(doc: &Value, method: &str, path: &str) -> bool {
    let wanted: Vec<&str> = path.split('/').collect();
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .any(|(template, item)| {
            let segments: Vec<&str> = template.split('/').collect();
            segments.len() == wanted.len()
                && segments
                    .iter()
                    .zip(&wanted)
                    .all(|(t, w)| t == w || t.starts_with('{'))
                && (method == "*" || item.get(method).is_some())
        })
}

/// Every `/v1/…` path README.md names, with `[/{id}]` read both ways and queries dropped.
fn readme_paths() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let path = regex::Regex::new(r"/v1(?:/[A-Za-z0-9_.{}$:-]+|\[/\{[A-Za-z]+\}\])*").unwrap();
    let mut paths = BTreeSet::new();
    for found in path.find_iter(&readme) {
        let found = found.as_str().trim_end_matches('.');
        match found.split_once("[/") {
            Some((base, optional)) => {
                paths.insert(base.to_string());
                paths.insert(format!("{base}/{}", optional.trim_end_matches(']')));
            }
            None => {
                paths.insert(found.to_string());
            }
        }
    }
    paths
}

async fn the_openapi_document_is_valid_and_names_every_route_and_readme_path(db: Db) {
    let server = Server::start(db).await;
    let doc = document(&server).await;
    assert_eq!(doc["openapi"], "3.1.0");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let checked = std::process::Command::new(validator())
        .arg(&file)
        .output()
        .expect("openapi-spec-validator runs");
    assert!(
        checked.status.success(),
        "openapi-spec-validator refuses the document:\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    let mut routes = orl::api::routes(true);
    for (method, path) in [
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/graphql"),
        ("POST", "/graphql"),
    ] {
        routes.push((method.to_string(), path.to_string()));
    }
    for (method, path) in &routes {
        assert!(
            doc["paths"][path].get(method.to_lowercase()).is_some(),
            "{method} {path} is missing from /openapi.json"
        );
    }
    let readme = readme_paths();
    assert!(readme.len() > 30, "README paths found: {readme:?}");
    for path in &readme {
        assert!(
            has(&doc, "*", path),
            "README's {path} is missing from /openapi.json"
        );
    }

    let mut ids = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(ids.insert(id), "operationId {id} repeats ({method} {path})");
            let responses = op["responses"].as_object().unwrap();
            let anonymous = op["security"] == json!([]);
            assert_eq!(
                responses.contains_key("401"),
                !anonymous,
                "{method} {path}: 401 on every authenticated operation, only there"
            );
            assert!(responses.contains_key("500"), "{method} {path}");
            if op.get("requestBody").is_some() {
                for code in ["400", "413"] {
                    assert!(responses.contains_key(code), "{method} {path} lacks {code}");
                }
            }
            let content = op["requestBody"]["content"].to_string();
            assert!(
                !content.contains(r#"{"type":"null"}"#),
                "{method} {path} declares a null body: {content}"
            );
        }
    }
    for action in ["end", "reaffirm"] {
        let body = &doc["paths"][format!("/v1/nodes/{{nodeId}}/reservations/{{id}}/{action}")]["post"]
            ["requestBody"];
        assert!(body.get("required").is_none_or(|r| r == false), "{body}");
        assert_eq!(
            body["content"]["application/json"]["schema"],
            json!({ "$ref": "#/components/schemas/Because" }),
            "{action}"
        );
    }
    let anonymous: Vec<&str> = ["/healthz", "/metrics", "/openapi.json"].to_vec();
    for path in anonymous {
        assert_eq!(doc["paths"][path]["get"]["security"], json!([]), "{path}");
        let (status, _) = server.anonymous().get(path).await;
        assert_eq!(status, StatusCode::OK, "{path} answers without a key");
    }
    let (status, body) = server.anonymous().post("/v1/orgs", json!({})).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "UNAUTHENTICATED");
}

/// The document's constraints for a property, through `T or null`.
fn property<'a>(doc: &'a Value, schema: &str, name: &str) -> &'a Value {
    let property = &doc["components"]["schemas"][schema]["properties"][name];
    match property["oneOf"].as_array() {
        Some(alternatives) => alternatives.iter().find(|s| s["type"] != "null").unwrap(),
        None => property,
    }
}

async fn the_declared_constraints_are_the_enforced_ones(db: Db) {
    let server = Server::start(db).await;
    let doc = document(&server).await;
    let id = r"^[A-Za-z0-9._:-]{1,128}$";
    let create = |name| property(&doc, "CreateRequest", name).clone();
    assert_eq!(create("tenantId")["pattern"], id);
    assert_eq!(create("tenantId")["maxLength"], 128);
    assert_eq!(
        create("poolId")["pattern"],
        r"^pool_[0-9a-hjkmnp-tv-z]{26,52}$"
    );
    assert_eq!(create("poolId")["maxLength"], 57);
    assert_eq!(create("projectId")["maxLength"], 56);
    assert_eq!(create("devices")["minItems"], 1);
    assert_eq!(create("devices")["maxItems"], 8);
    assert_eq!(create("leaseSeconds")["minimum"], 30);
    assert_eq!(create("leaseSeconds")["maximum"], 86_400);
    assert_eq!(create("start")["maximum"], 140_737_488_355_328_i64);
    assert_eq!(property(&doc, "DeviceRequest", "count")["maximum"], 64);
    assert_eq!(property(&doc, "Gang", "size")["minimum"], 2);
    assert_eq!(property(&doc, "Wait", "timeoutMs")["maximum"], 30_000);
    assert_eq!(
        property(&doc, "ListInput", "cursor")["pattern"],
        r"^rsv_[0-9a-hjkmnp-tv-z]{26,52}$"
    );
    let unit_ids = property(&doc, "NewNodeReservation", "unitIds");
    assert_eq!(unit_ids["minItems"], 1, "{unit_ids}");
    assert_eq!(unit_ids["items"]["pattern"], id);
    assert_eq!(property(&doc, "NewOrg", "id")["pattern"], id);
    assert_eq!(
        property(&doc, "NodeInventory", "labels")["maxProperties"],
        64
    );
    let limit = doc["paths"]["/v1/pools"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(limit["schema"]["minimum"], 1, "{limit}");
    assert_eq!(limit["schema"]["maximum"], 200, "{limit}");

    // What the document declares is what the server refuses, naming the field.
    let admin = server.admin();
    server.org_with_key("tenant-a", "member").await;
    let ask = |field: &str, value: Value| {
        let mut body = json!({ "tenantId": "tenant-a", "poolId": format!("pool_{}", "0".repeat(26)),
                               "devices": [{ "class": "gpu", "count": 1 }], "duration": "1h", "idempotencyKey": "k" });
        body[field] = value;
        body
    };
    for (field, value) in [
        ("tenantId", json!("a".repeat(129))),
        ("poolId", json!("pool_1")),
        ("devices", json!([])),
        ("leaseSeconds", json!(29)),
        ("start", json!(140_737_488_355_329_i64)),
        ("idempotencyKey", json!("has space")),
    ] {
        let (status, err) = admin
            .post("/api/compute/reservations/create", ask(field, value))
            .await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(err["error"]["details"]["field"], field, "{err}");
    }
    let (status, err) = admin
        .post("/v1/orgs", json!({ "id": "has space", "name": "x" }))
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(err["error"]["details"]["field"], "id", "{err}");
}
