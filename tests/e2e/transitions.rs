//! What each transition records: its event and its audit entry, once, whoever makes it
//! (a caller or the reconciler), and nothing for a change that changes nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::races::{fleet, rpc};
use crate::support::{Db, Server, T0, on_both_databases};

const HOUR: i64 = 3_600_000;

on_both_databases!(
    a_refused_create_writes_its_denied_event,
    the_reconcilers_moves_are_audited_as_the_system,
    releasing_units_already_released_records_nothing,
);

/// Every audit entry the ops admin can see, newest first: (action, objectId).
async fn audit(server: &Server) -> Vec<(String, String)> {
    let (status, page) = server.admin().get("/v1/audit?limit=200").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["objectId"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn events(server: &Server) -> Vec<Value> {
    let (status, page) = server.admin().get("/v1/events?limit=500").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page["items"].as_array().unwrap().clone()
}

async fn a_refused_create_writes_its_denied_event(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let policy = r#"permit(principal, action == Orl::Action::"compute:reservations:create", resource) when { context.gpuCount <= 2 };"#;
    let (status, body) = f.servers[0]
        .admin()
        .put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": policy }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, err) = rpc(&f.tenant(0), "create", f.ask("big", 4, None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    let denied: Vec<Value> = events(&f.servers[0])
        .await
        .into_iter()
        .filter(|e| e["type"] == "reservation.denied")
        .collect();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0]["payload"]["reason"], "access-denied");
    assert_eq!(denied[0]["payload"]["reservation"]["state"], "denied");
}

async fn the_reconcilers_moves_are_audited_as_the_system(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let r = f.create(0, f.ask("later", 2, Some(T0 + HOUR))).await;
    let id = r["id"].as_str().unwrap().to_string();
    let full = f.create(0, f.ask("full", 8, Some(T0 + 2 * HOUR))).await;
    assert_eq!(full["state"], "pending", "{full}");
    f.set_clocks(T0 + HOUR).await;
    f.set_clocks(T0 + 3 * HOUR).await;
    assert_eq!(f.get(&r["id"]).await["state"], "expired");
    // Placed as the capacity freed; its start has passed, so the next pass may have
    // activated it already.
    let state = f.get(&full["id"]).await["state"].clone();
    assert!(state == "placed" || state == "active", "{state}");
    let trail = audit(&f.servers[0]).await;
    let mine: Vec<&str> = trail
        .iter()
        .filter(|(_, object)| *object == id)
        .map(|(action, _)| action.as_str())
        .collect();
    assert_eq!(
        mine,
        [
            "compute-reservation.window-ended",
            "compute-reservation.activate",
            "compute-reservation.create",
            "compute-reservation.draft"
        ]
    );
    let full_id = full["id"].as_str().unwrap();
    assert!(
        trail
            .iter()
            .any(|(a, o)| a == "compute-reservation.place" && o == full_id),
        "{trail:?}"
    );
    let (_, page) = f.servers[0].admin().get("/v1/audit?limit=200").await;
    let ended = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "compute-reservation.window-ended")
        .unwrap()
        .clone();
    assert_eq!(ended["reason"], "window-ended", "{ended}");
}

async fn releasing_units_already_released_records_nothing(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let admin = f.servers[0].admin();
    f.servers[0].org_with_key("anchor", "member").await;
    let (status, nr) = admin
        .post(
            "/v1/nodes/n1/reservations",
            json!({ "unitIds": ["n1-gpu0", "n1-gpu1"], "allowedOrgIds": ["anchor"] }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{nr}");
    let path = format!(
        "/v1/nodes/n1/reservations/{}/release",
        nr["id"].as_str().unwrap()
    );
    let (status, first) = admin.post(&path, json!({ "unitIds": ["n1-gpu0"] })).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (events_before, audit_before) = (
        events(&f.servers[0]).await.len(),
        audit(&f.servers[0]).await.len(),
    );
    let (status, again) = admin.post(&path, json!({ "unitIds": ["n1-gpu0"] })).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["releasedUnitIds"], json!(["n1-gpu0"]));
    assert_eq!(again["updatedAt"], first["updatedAt"]);
    assert_eq!(events(&f.servers[0]).await.len(), events_before);
    assert_eq!(audit(&f.servers[0]).await.len(), audit_before);
}
