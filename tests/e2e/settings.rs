//! What a create reads besides capacity (the pool, the tenant's offer, its IAM policy) is
//! held per replica; a change made through any replica holds on every replica at once.

use reqwest::StatusCode;
use serde_json::json;

use crate::races::{fleet, rpc};
use crate::support::{Db, assert_error, on_both_databases};

on_both_databases!(a_settings_change_through_one_replica_holds_on_every_replica_at_once);

async fn a_settings_change_through_one_replica_holds_on_every_replica_at_once(db: Db) {
    let f = fleet(db, 2, 64, json!({})).await;
    let last = f.servers.len() - 1;
    let admin = f.servers[0].admin();
    // The last replica has read (and holds) the pool, the offer and the policy.
    f.create(last, f.ask("k-1", 2, None)).await;

    let policy = r#"permit(principal, action == Orl::Action::"compute:reservations:create", resource) when { context.gpuCount <= 2 };"#;
    let (status, body) = admin
        .put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": policy }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, err) = rpc(&f.tenant(last), "create", f.ask("k-2", 4, None)).await;
    assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");

    let (status, body) = admin
        .post(
            &format!("/v1/pools/{}/offers", f.pool),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": 2 } }),
        )
        .await;
    assert!(status.is_success(), "{body}");
    let (status, err) = rpc(&f.tenant(last), "create", f.ask("k-3", 1, None)).await;
    assert_error(status, &err, StatusCode::CONFLICT, "QUOTA_EXCEEDED");

    let (status, body) = admin
        .post(&format!("/v1/pools/{}/archive", f.pool), json!({}))
        .await;
    assert!(status.is_success(), "{body}");
    let (status, err) = rpc(&f.tenant(last), "create", f.ask("k-4", 1, None)).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "NOT_FOUND");
}
