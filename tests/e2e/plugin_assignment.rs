//! A pool's plugin assignment: `PUT` replaces it, `PATCH` changes only what it names.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::plugins::world;
use crate::support::{Db, assert_error, on_both_databases};

on_both_databases!(a_patch_of_a_pools_policies_changes_only_the_fields_it_names);

async fn a_patch_of_a_pools_policies_changes_only_the_fields_it_names(db: Db) {
    let w = world(db).await;
    let spread = w.upload("orl_placer_spread.wasm").await;
    let admin = w.server.admin();
    let path = format!("/v1/pools/{}/policies", w.pool);
    w.assign(
        &w.pool,
        json!({ "placement": spread["id"], "config": { "a": 1 }, "deadlineMs": 300 }),
    )
    .await;
    let (status, patched) = admin
        .call(Method::PATCH, &path, Some(json!({ "deadlineMs": 900 })))
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["placement"], spread["id"], "{patched}");
    assert_eq!(patched["config"], json!({ "a": 1 }), "{patched}");
    assert_eq!(patched["deadlineMs"], 900, "{patched}");
    let (_, placed) = w.create(&w.pool, "after-patch", 1).await;
    assert_eq!(placed["placement"]["placedBy"], spread["id"], "{placed}");
    // `null` puts one field back to its default, and leaves the others.
    let (status, patched) = admin
        .call(
            Method::PATCH,
            &path,
            Some(json!({ "config": null, "onPolicyFailure": "fallback" })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert!(patched.get("config").is_none(), "{patched}");
    assert_eq!(patched["onPolicyFailure"], "fallback", "{patched}");
    assert_eq!(
        (&patched["placement"], &patched["deadlineMs"]),
        (&spread["id"], &json!(900))
    );
    // Invalid fields are named, and change nothing.
    for (body, field) in [
        (json!({ "deadlineMs": 0 }), "deadlineMs"),
        (json!({ "preemption": spread["id"] }), "preemption"),
        (json!({ "placement": "sha256:00" }), "placement"),
    ] {
        let (status, err) = admin.call(Method::PATCH, &path, Some(body)).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(field),
            "{err}"
        );
    }
    let (status, err) = admin
        .call(
            Method::PATCH,
            &path,
            Some(json!({ "placment": spread["id"] })),
        )
        .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(admin.get(&path).await.1["deadlineMs"], 900);
    // PUT keeps its meaning: what it leaves out goes back to its default.
    w.assign(&w.pool, json!({ "deadlineMs": 100 })).await;
    let (_, put) = admin.get(&path).await;
    assert!(put.get("placement").is_none(), "{put}");
    assert_eq!(put["onPolicyFailure"], "fail", "{put}");
    // Strangers see no pool.
    let (status, err) = w
        .tenant
        .call(Method::PATCH, &path, Some(json!({ "deadlineMs": 5 })))
        .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}
