//! The rules that must hold after any sequence of requests, read from the database itself:
//! no unit booked (or billed) twice, nor claimed by two node reservations at once, no node's
//! host resources booked past what it has, quota equal to the sum of live charges, bookings
//! consistent with states, and one terminal event per ended reservation, named for how it
//! ended.

use std::collections::BTreeMap;

use sqlx::Row as _;

use crate::call_log::Call;
use crate::support::Server;

const LIVE: [&str; 4] = ["placed", "binding", "active", "releasing"];
const TERMINAL: [&str; 5] = ["released", "failed", "cancelled", "expired", "denied"];
const TERMINAL_EVENTS: [&str; 5] = [
    "reservation.released",
    "reservation.failed",
    "reservation.cancelled",
    "reservation.expired",
    "reservation.denied",
];

/// Asserts every invariant on `server`'s database; the message names the first broken one.
pub async fn check(server: &Server) {
    check_database(&server.database_url(), &server.calls.calls()).await;
}

/// Asserts every invariant on the database at `url`, where `calls` are the successful
/// mutating calls the test made.
pub async fn check_database(url: &str, calls: &[Call]) {
    let mut db = crate::support::connect(url).await;
    crate::call_log::check_audited(&mut db, calls).await;

    // No two bookings of one unit overlap in time, active or not: a unit is never held, nor
    // billed, twice.
    let overlaps: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM bookings a JOIN bookings b
           ON a.node_id = b.node_id AND a.unit_id = b.unit_id AND a.reservation_id < b.reservation_id
         WHERE a.start_ms < b.end_ms AND b.start_ms < a.end_ms
           AND a.end_ms > a.start_ms AND b.end_ms > b.start_ms",
    )
    .fetch_one(&mut db)
    .await
    .unwrap();
    assert_eq!(overlaps, 0, "two bookings of one unit overlap");

    // No two node reservations that are not cancelled claim one unit for overlapping terms.
    let claimed_twice: Vec<(String, String)> = sqlx::query_as(
        "SELECT a.reservation_id, b.reservation_id
         FROM node_reservation_units a
         JOIN node_reservation_units b
           ON a.node_id = b.node_id AND a.unit_id = b.unit_id AND a.reservation_id < b.reservation_id
         JOIN node_reservations ra ON ra.id = a.reservation_id
         JOIN node_reservations rb ON rb.id = b.reservation_id
         WHERE ra.lifecycle <> 'cancelled' AND rb.lifecycle <> 'cancelled'
           AND (ra.ends_at IS NULL OR ra.ends_at > rb.starts_at)
           AND (rb.ends_at IS NULL OR rb.ends_at > ra.starts_at)",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert!(
        claimed_twice.is_empty(),
        "node reservations claim a unit twice: {claimed_twice:?}"
    );

    // A node's host resources are never booked past what it has: at the start of each
    // active host booking, the active host bookings overlapping that instant fit the node.
    let over: Vec<(String, i64)> = sqlx::query_as(
        "SELECT h.node_id, h.start_ms FROM host_bookings h JOIN nodes n ON n.id = h.node_id
         WHERE h.active = $1 GROUP BY h.node_id, h.start_ms, n.host_vcpu, n.host_memory_gib, n.host_hugepages_1gi
         HAVING (SELECT SUM(o.vcpu) FROM host_bookings o WHERE o.node_id = h.node_id AND o.active = $1
                   AND o.start_ms <= h.start_ms AND o.end_ms > h.start_ms) > n.host_vcpu
             OR (SELECT SUM(o.memory_gib) FROM host_bookings o WHERE o.node_id = h.node_id AND o.active = $1
                   AND o.start_ms <= h.start_ms AND o.end_ms > h.start_ms) > n.host_memory_gib
             OR (SELECT SUM(o.hugepages_1gi) FROM host_bookings o WHERE o.node_id = h.node_id AND o.active = $1
                   AND o.start_ms <= h.start_ms AND o.end_ms > h.start_ms) > n.host_hugepages_1gi",
    )
    .bind(true)
    .fetch_all(&mut db)
    .await
    .unwrap();
    assert!(
        over.is_empty(),
        "host resources booked past a node's: {over:?}"
    );

    // Quota in use is the sum of the charges of reservations that hold one.
    let mut charged: BTreeMap<(String, String, String), i64> = BTreeMap::new();
    let rows = sqlx::query(
        "SELECT pool_id, tenant_id, state, charge FROM compute_reservations WHERE charge IS NOT NULL",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    for row in &rows {
        let state: String = row.get("state");
        assert!(
            !TERMINAL.contains(&state.as_str()),
            "a {state} reservation still holds a charge"
        );
        let charge: BTreeMap<String, i64> =
            serde_json::from_str(&row.get::<String, _>("charge")).unwrap();
        for (resource, amount) in charge {
            *charged
                .entry((row.get("pool_id"), row.get("tenant_id"), resource))
                .or_default() += amount;
        }
    }
    let used = sqlx::query("SELECT pool_id, tenant_id, resource, used FROM quota_usage")
        .fetch_all(&mut db)
        .await
        .unwrap();
    for row in &used {
        let key = (
            row.get("pool_id"),
            row.get("tenant_id"),
            row.get("resource"),
        );
        let used: i64 = row.get("used");
        assert_eq!(
            used,
            charged.remove(&key).unwrap_or(0),
            "quota in use for {key:?} differs from the live charges"
        );
    }
    charged.retain(|_, amount| *amount != 0);
    assert!(
        charged.is_empty(),
        "charges without quota usage: {charged:?}"
    );

    // Bookings follow states: a live reservation holds active bookings, an ended one none
    // (unless its node still holds the devices).
    let rows = sqlx::query(
        "SELECT r.id, r.state, r.conditions,
                (SELECT COUNT(*) FROM bookings b WHERE b.reservation_id = r.id AND b.active = $1) AS active
         FROM compute_reservations r",
    )
    .bind(true)
    .fetch_all(&mut db)
    .await
    .unwrap();
    for row in &rows {
        let id: String = row.get("id");
        let state: String = row.get("state");
        let active: i64 = row.get("active");
        let held = row.get::<String, _>("conditions").contains("DevicesHeld");
        if LIVE.contains(&state.as_str()) {
            assert!(active > 0, "{state} reservation {id} holds no booking");
        } else if !held {
            assert_eq!(active, 0, "{state} reservation {id} still holds bookings");
        }
    }

    // One terminal event per ended reservation, and nothing after it.
    let rows = sqlx::query("SELECT object_id, type FROM events ORDER BY seq")
        .fetch_all(&mut db)
        .await
        .unwrap();
    let mut ended: BTreeMap<String, String> = BTreeMap::new();
    for row in &rows {
        let id: String = row.get("object_id");
        let kind: String = row.get("type");
        if !kind.starts_with("reservation.") || kind == "reservation.allocation-released" {
            continue;
        }
        if let Some(first) = ended.get(&id) {
            panic!("reservation {id}: {kind} after {first}");
        }
        if TERMINAL_EVENTS.contains(&kind.as_str()) {
            ended.insert(id, kind);
        }
    }
    let terminal: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM compute_reservations WHERE state IN ('released', 'failed', 'cancelled', 'expired', 'denied')",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    for id in terminal {
        assert!(
            ended.contains_key(&id),
            "reservation {id} ended without its event"
        );
    }

    // Every state a reservation reached was announced: its last event names it and the
    // state it is in now (a draft has announced nothing yet).
    let mut last: BTreeMap<String, (String, serde_json::Value)> = BTreeMap::new();
    let rows = sqlx::query("SELECT object_id, type, payload FROM events ORDER BY seq")
        .fetch_all(&mut db)
        .await
        .unwrap();
    for row in &rows {
        let kind: String = row.get("type");
        if kind.starts_with("reservation.") && kind != "reservation.allocation-released" {
            let payload = serde_json::from_str(&row.get::<String, _>("payload")).unwrap();
            last.insert(row.get("object_id"), (kind, payload));
        }
    }
    let states: Vec<(String, String)> =
        sqlx::query_as("SELECT id, state FROM compute_reservations WHERE state <> 'draft'")
            .fetch_all(&mut db)
            .await
            .unwrap();
    for (id, state) in states {
        let Some((kind, payload)) = last.get(&id) else {
            panic!("{state} reservation {id} has no event");
        };
        assert_eq!(
            (
                payload["reservation"]["id"].as_str(),
                payload["reservation"]["state"].as_str()
            ),
            (Some(id.as_str()), Some(state.as_str())),
            "reservation {id} is {state}, but its last event {kind} says otherwise: {payload}"
        );
        // An ended one's last event is named for how it ended.
        if TERMINAL.contains(&state.as_str()) {
            assert_eq!(
                *kind,
                format!("reservation.{state}"),
                "reservation {id} is {state}, but its terminal event is {kind}"
            );
        }
    }
}
