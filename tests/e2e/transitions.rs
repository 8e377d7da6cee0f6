//! What each transition records: its event and its audit entry, once, whoever makes it
//! (a caller or the reconciler), and nothing for a change that changes nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::races::{fleet, rpc};
use crate::support::{Db, HOUR, Server, T0, on_both_databases};

on_both_databases!(
    a_refused_create_writes_its_denied_event,
    the_reconcilers_moves_are_audited_as_the_system,
    releasing_units_already_released_records_nothing,
    an_unconfirmed_request_expires_thirty_minutes_after_it_was_made_and_not_before,
    the_reconcilers_lag_is_how_long_the_oldest_move_it_finds_due_has_waited,
    a_reservation_ending_hands_its_units_to_one_waiting_before_its_next_retry,
    freed_units_wake_the_waiting_they_could_serve_and_due_ones_anyway,
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

/// An agent's request that waits for a person expires, with its confirmation, when thirty
/// minutes have passed since it was made, on whichever replica reconciles first, once; the
/// reconciler's lag counts from then.
async fn an_unconfirmed_request_expires_thirty_minutes_after_it_was_made_and_not_before(db: Db) {
    const MINUTE: i64 = 60_000;
    let f = fleet(db, 1, 64, json!({})).await;
    let policy = r#"
        permit(principal, action, resource) when { !principal.agent };
        permit(principal, action == Orl::Action::"compute:reservations:create", resource) when { context.confirmed };
    "#;
    let admin = f.servers[0].admin();
    let (status, body) = admin
        .put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": policy }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let agent_key = (f.servers[0])
        .key_in("tenant-a", json!({ "role": "member", "agent": true }))
        .await;
    let agent = f.servers[f.servers.len() - 1].as_key(&agent_key);
    let ask = f.ask("unconfirmed", 4, None);
    let (status, err) = rpc(&agent, "create", ask.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    assert_eq!(err["error"]["code"], "CONFIRMATION_REQUIRED", "{err}");
    let id = err["error"]["details"]["reservationId"]
        .as_str()
        .unwrap()
        .to_string();
    let confirmation_state = || async {
        let (status, page) = admin.get("/v1/orgs/tenant-a/confirmations").await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["items"][0]["state"].as_str().unwrap().to_string()
    };

    f.set_clocks(T0 + 30 * MINUTE - 1).await;
    assert_eq!(confirmation_state().await, "pending");
    let (status, err) = rpc(&agent, "create", ask.clone()).await;
    assert_eq!(
        (status, &err["error"]["code"]),
        (StatusCode::FORBIDDEN, &json!("CONFIRMATION_REQUIRED")),
        "{err}"
    );

    f.set_clocks(T0 + 30 * MINUTE).await;
    assert_eq!(confirmation_state().await, "expired");
    let (status, expired) = rpc(&agent, "create", ask).await;
    assert_eq!(status, StatusCode::OK, "{expired}");
    assert_eq!(
        (expired["id"].as_str(), &expired["state"]),
        (Some(id.as_str()), &json!("expired"))
    );
    let timeouts: Vec<(String, String)> = audit(&f.servers[0])
        .await
        .into_iter()
        .filter(|(action, object)| {
            action == "compute-reservation.confirmation-timeout" && *object == id
        })
        .collect();
    assert_eq!(timeouts.len(), 1, "{timeouts:?}");
    let ended: Vec<Value> = events(&f.servers[0])
        .await
        .into_iter()
        .filter(|e| e["type"] == "reservation.expired" && e["payload"]["reservation"]["id"] == id)
        .collect();
    assert_eq!(ended.len(), 1, "{ended:?}");
    assert_eq!(ended[0]["payload"]["reason"], "confirmation-timeout");

    // A replica's pass is as far behind as the oldest request it finds past its thirty
    // minutes: one made at T0 + 30 min, seen at T0 + 61 min, a minute late.
    let (status, err) = rpc(&agent, "create", f.ask("unconfirmed-2", 4, None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    f.servers[0].set_clock(T0 + 61 * MINUTE).await;
    let (status, health) = admin.get("/v1/status").await;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_eq!(health["reconciler"]["lagSeconds"], 60.0, "{health}");
}

/// The reconciler's lag is how long the oldest move a pass finds due has waited: a start a
/// minute late, then an end two minutes late (not the start, long past by then). Only the
/// first replica's clock moves, so only it finds anything due.
async fn the_reconcilers_lag_is_how_long_the_oldest_move_it_finds_due_has_waited(db: Db) {
    const MINUTE: i64 = 60_000;
    let f = fleet(db, 1, 64, json!({})).await;
    let server = &f.servers[0];
    let lag = || async {
        let (status, health) = server.admin().get("/v1/status").await;
        assert_eq!(status, StatusCode::OK, "{health}");
        health["reconciler"]["lagSeconds"].clone()
    };
    let r = f.create(0, f.ask("late", 2, None)).await;
    assert_eq!(r["state"], "placed", "{r}");
    // Not due before its start: left placed, and no part of the lag.
    let later = f.create(0, f.ask("later", 2, Some(T0 + HOUR))).await;
    server.set_clock(T0 + MINUTE).await;
    assert_eq!(f.get(&r["id"]).await["state"], "active");
    assert_eq!(f.get(&later["id"]).await["state"], "placed");
    assert_eq!(lag().await, 60.0);
    f.release(0, &later["id"]).await;
    server.set_clock(T0 + 2 * HOUR + 2 * MINUTE).await;
    assert_eq!(f.get(&r["id"]).await["state"], "expired");
    assert_eq!(lag().await, 120.0);
}

/// A reservation whose window ends frees its units for the pool's waiting reservations in
/// the same pass, not at their next 30-second retry.
async fn a_reservation_ending_hands_its_units_to_one_waiting_before_its_next_retry(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let server = &f.servers[0];
    let first = f.create(0, f.ask("first", 8, None)).await;
    assert_eq!(first["state"], "placed", "{first}");
    server.set_clock(T0 + 2 * HOUR - 10_000).await;
    let waiting = f.create(0, f.ask("waiting", 8, None)).await;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    // Its next attempt is due 30 s after its refusal, 20 s after the first one ends.
    server.set_clock(T0 + 2 * HOUR).await;
    assert_eq!(f.get(&first["id"]).await["state"], "expired");
    let placed = f.get(&waiting["id"]).await;
    assert_eq!(placed["state"], "placed", "{placed}");
}

/// Units freed wake a pool's waiting reservations that a node they were freed on now has
/// room for; one asking for more waits for its next attempt, and one due for its attempt
/// in the same pass is tried whether or not it fits.
async fn freed_units_wake_the_waiting_they_could_serve_and_due_ones_anyway(db: Db) {
    let f = fleet(db, 1, 64, json!({})).await;
    let server = &f.servers[0];
    let first = f.create(0, f.ask("first", 4, None)).await;
    let later = f.create(0, f.ask("later", 4, Some(T0 + HOUR))).await;
    server.set_clock(T0 + 2 * HOUR - 10_000).await;
    let waiting = f.create(0, f.ask("waiting", 8, None)).await;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    // The first ends in the pass its next attempt is due in: tried, and four units do not
    // take eight.
    let before = server.pending_retries().await;
    let retries = || async { server.pending_retries().await - before };
    server.set_clock(T0 + 2 * HOUR + 20_000).await;
    assert_eq!(f.get(&first["id"]).await["state"], "expired");
    assert_eq!(retries().await, 1.0, "due: tried");
    assert_eq!(f.get(&waiting["id"]).await["state"], "pending");
    // Four units freed again, before its next attempt: not tried.
    let other = f.create(0, f.ask("other", 4, None)).await;
    assert_eq!(other["state"], "placed", "{other}");
    f.release(0, &other["id"]).await;
    assert_eq!(retries().await, 1.0, "four free: not tried");
    assert_eq!(f.get(&waiting["id"]).await["state"], "pending");
    // Eight free: tried at once, and placed.
    f.release(0, &later["id"]).await;
    assert_eq!(retries().await, 2.0, "eight free: tried");
    let placed = f.get(&waiting["id"]).await;
    assert_eq!(placed["state"], "placed", "{placed}");
}
