//! IAM policies are checked, when they are set, against the Cedar schema of the request orl
//! sends to a decision.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Db, Server, on_both_databases};

on_both_databases!(a_policy_naming_what_orl_never_sends_is_refused_and_the_one_set_stays);

const PATH: &str = "/v1/orgs/tenant-a/iam/policy";

async fn a_policy_naming_what_orl_never_sends_is_refused_and_the_one_set_stays(db: Db) {
    let server = Server::start(db).await;
    server.org_with_key("tenant-a", "member").await;
    let admin = server.admin();
    let valid = include_str!("../../examples/policy.cedar");
    let (status, body) = admin.put(PATH, json!({ "policy": valid })).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    for (policy, named) in [
        (
            "permit(principal, action, resource)\nwhen { context.gpuModelx == \"H100-SXM5-80GB\" };",
            "gpuModelx",
        ),
        (
            "permit(principal, action, resource) when { principal.team == \"ml\" };",
            "team",
        ),
        (
            r#"permit(principal, action == Orl::Action::"compute:reservations:release", resource);"#,
            "compute:reservations:release",
        ),
        (
            r#"permit(principal == Orl::User::"alice", action, resource);"#,
            "Orl::User",
        ),
        (
            "permit(principal, action, resource) when { context.gpuCount <= \"4\" };",
            "Long",
        ),
    ] {
        let (status, body) = admin.put(PATH, json!({ "policy": policy })).await;
        crate::support::assert_error(status, &body, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(body["error"]["details"]["field"], "policy", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(named), "{named}: {message}");
    }
    let message = admin
        .expect_error(
            Method::PUT,
            PATH,
            Some(json!({ "policy": "permit(principal, action, resource)\nwhen { context.gpuModelx == \"x\" };" })),
            StatusCode::BAD_REQUEST,
            "INVALID_INPUT",
        )
        .await;
    assert!(
        message.contains("line 2") && message.contains("did you mean `gpuModel`?"),
        "where, and what was meant: {message}"
    );

    let (status, stored) = admin.get(PATH).await;
    assert_eq!(status, StatusCode::OK, "{stored}");
    assert_eq!(stored["policy"], valid, "a refused policy changes nothing");
}
