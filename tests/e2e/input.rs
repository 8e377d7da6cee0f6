//! Malformed input is answered with the error envelope, names the field, and writes nothing.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Db, Server, assert_error, audit_count, h100_inventory, on_both_databases};

on_both_databases!(
    malformed_bodies_are_invalid_input_and_write_nothing,
    oversized_bodies_are_refused_with_413,
    unknown_routes_and_methods_answer_in_the_envelope,
);

async fn malformed_bodies_are_invalid_input_and_write_nothing(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let before = audit_count(&server).await;
    let long_id = "n".repeat(129);
    let node_path = "/v1/orgs/acme/provider/nodes/n1";
    let mut wrong_type = h100_inventory("n1", 2);
    wrong_type["units"][0]["memoryGiB"] = json!("eighty");
    let mut unknown_field = h100_inventory("n1", 2);
    unknown_field["units"][1]["color"] = json!("green");
    let mut bad_unit_id = h100_inventory("n1", 2);
    bad_unit_id["units"][0]["id"] = json!(long_id);
    let mut bad_class = h100_inventory("n1", 2);
    bad_class["units"][0]["class"] = json!("fpga");
    let mut negative = h100_inventory("n1", 2);
    negative["host"]["vcpu"] = json!(-4);
    let mut mismatch = h100_inventory("n1", 2);
    mismatch["units"][0]["deviceClass"] = json!("gpu.mig");
    let cases = [
        (wrong_type, "units[0].memoryGiB"),
        (unknown_field, "color"),
        (bad_unit_id, "units[0].id"),
        (bad_class, "units[0].class"),
        (negative, "host.vcpu"),
        (mismatch, "units[0].deviceClass"),
        (json!({ "units": [] }), "host"),
    ];
    for (body, field) in cases {
        let message = provider
            .expect_error(
                Method::PUT,
                node_path,
                Some(body),
                StatusCode::BAD_REQUEST,
                "INVALID_INPUT",
            )
            .await;
        assert!(message.contains(field), "{message:?} should name {field}");
    }
    let message = provider
        .expect_error(
            Method::PUT,
            &format!("/v1/orgs/acme/provider/nodes/{long_id}"),
            Some(h100_inventory("x", 1)),
            StatusCode::BAD_REQUEST,
            "INVALID_INPUT",
        )
        .await;
    assert!(message.starts_with("nodeId:"), "{message}");
    let (status, body) = server
        .admin()
        .post("/v1/orgs", json!({ "id": long_id, "name": "x" }))
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(body["error"]["details"]["field"], "id");
    let (status, body) = provider
        .raw(
            Method::PUT,
            node_path,
            Some(b"{not json".to_vec()),
            Some("application/json"),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, body) = provider
        .raw(
            Method::PUT,
            node_path,
            Some(b"{}".to_vec()),
            Some("text/plain"),
        )
        .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, body) = server.admin().get("/v1/audit?limit=0").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    let (status, body) = server.admin().get("/v1/audit?limit=ten").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");

    assert_eq!(
        provider.get("/v1/nodes/n1").await.0,
        StatusCode::NOT_FOUND,
        "no node written"
    );
    assert_eq!(audit_count(&server).await, before, "no audit entry written");
}

async fn oversized_bodies_are_refused_with_413(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let mut huge = h100_inventory("n1", 1);
    huge["region"] = json!("r".repeat(2 << 20));
    let huge = huge.to_string().into_bytes();
    // The server answers as soon as the limit is crossed and closes the connection, which
    // can reset a client still sending: retry the transport, never the assertion.
    let mut answer = None;
    for _ in 0..10 {
        let fresh = server.as_key(&server.key_in("acme", json!({ "role": "provider" })).await);
        answer = fresh
            .try_raw(
                Method::PUT,
                "/v1/orgs/acme/provider/nodes/n1",
                Some(huge.clone()),
                Some("application/json"),
            )
            .await;
        if answer.is_some() {
            break;
        }
    }
    let (status, body) = answer.expect("one of ten attempts reads the answer");
    assert_error(
        status,
        &body,
        StatusCode::PAYLOAD_TOO_LARGE,
        "PAYLOAD_TOO_LARGE",
    );
    assert_eq!(provider.get("/v1/nodes/n1").await.0, StatusCode::NOT_FOUND);
}

async fn unknown_routes_and_methods_answer_in_the_envelope(db: Db) {
    let server = Server::start(db).await;
    let (status, body) = server.admin().get("/v1/nowhere").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "NOT_FOUND");
    let (status, body) = server.admin().delete("/v1/orgs").await;
    assert_error(
        status,
        &body,
        StatusCode::METHOD_NOT_ALLOWED,
        "METHOD_NOT_ALLOWED",
    );
}
