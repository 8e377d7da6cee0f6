//! What the reservation methods share: the pool a tenant may book into, the IAM
//! attributes of a request, placement (with the pool-lease queue) and events.

use serde_json::json;
use sqlx::AnyConnection;

use super::placement::{Refusal, Snapshot, check_choice};
use super::preempt;
use super::store::{self, Reservation};
use super::{CreateRequest, State};
use crate::events;
use crate::iam::policy::Attributes;
use crate::pools::PlacerMode;
use crate::pools::store::{Offer, Pool};
use crate::store::violates;
use crate::{App, Error, Result};

/// How long a default-placer reservation waits before its next placement attempt.
pub const RETRY_AFTER_MS: i64 = 30_000;

/// How many times a placement decides again after losing to a commit its view had not seen.
const PLACE_ATTEMPTS: u32 = 3;

/// Why a placement that kept losing to concurrent commits waits.
const BOOKED_CONCURRENTLY: &str = "the chosen units were booked concurrently";

/// What one placement attempt on one snapshot came to.
pub(super) enum Attempt {
    /// Booked, and `r` marked placed.
    Placed,
    /// It does not fit: why. Nothing written.
    NoFit(String),
    /// The snapshot was stale: a commit it had not seen booked or claimed units chosen on
    /// these nodes. Nothing written.
    Lost(Vec<String>),
}

pub(super) const CREATE: &str = "compute:reservations:create";
pub(super) const READ: &str = "compute:reservations:read";
pub(super) const EXTEND: &str = "compute:reservations:extend";

pub(super) fn not_found(id: &str) -> Error {
    Error::not_found(format_args!("reservation {id}"))
}

/// The attributes IAM sees for a request: `gpuCount`, `vcpu` and `memoryGiB` (with 1 GiB
/// hugepages) are summed over every member of a gang.
pub(super) fn attributes(request: &CreateRequest, r: &Reservation, region: &str) -> Attributes {
    let duration_ms = r.end_ms - r.start_ms;
    let members = request.gang_size();
    Attributes {
        gpu_model: request.gpu_model().unwrap_or_default().to_string(),
        gpu_count: request.total_gpu_count(),
        duration_hours: (duration_ms + 3_599_999) / 3_600_000,
        region: region.to_string(),
        vcpu: r.resources.vcpu * members,
        memory_gib: (r.resources.memory_gib + r.resources.hugepages_1gi) * members,
        pool_id: r.pool_id.clone(),
        spot: r.spot,
    }
}

/// The pool `tenant` may book into: owned by or offered to it, not archived.
pub(super) async fn bookable_pool(
    conn: &mut AnyConnection,
    pool_id: &str,
    tenant: &str,
) -> Result<(Pool, Option<Offer>)> {
    let missing = || Error::not_found(format_args!("pool {pool_id}"));
    let pool = crate::pools::store::find(conn, pool_id)
        .await?
        .ok_or_else(missing)?;
    let offer = crate::pools::store::find_offer(conn, pool_id, tenant).await?;
    if pool.archived || (pool.owner_org_id != tenant && offer.is_none()) {
        return Err(missing());
    }
    Ok((pool, offer))
}

pub(super) async fn lock_pool(app: &App, conn: &mut AnyConnection, pool_id: &str) -> Result<()> {
    sqlx::query(&format!(
        "SELECT id FROM pools WHERE id = $1{}",
        app.store.for_update()
    ))
    .bind(pool_id)
    .fetch_optional(conn)
    .await?;
    Ok(())
}

/// Tries to place `r` now: on success it is `placed` with its bookings written; otherwise
/// it is `pending` with `Unschedulable` (retried every 30 s) or `Queued` (pool-lease).
/// A pool-lease queue is served in order: nothing jumps an older queued reservation.
/// A request that is not spot and does not fit may preempt spot work: the terminations and
/// the placement after them commit together or not at all.
pub(super) async fn try_place(
    app: &App,
    conn: &mut AnyConnection,
    pool: &Pool,
    r: &mut Reservation,
    now: i64,
) -> Result<bool> {
    let queued = pool.policy.placer == PlacerMode::PoolLease;
    if queued && older_pending_exists(conn, r).await? {
        mark_pending(
            r,
            queued,
            "waiting behind older reservations in the pool's queue".into(),
            now,
        );
        return Ok(false);
    }
    // The view may not have heard of a commit yet: a decision that lost to one forgets the
    // nodes it chose and decides again on what the database says of them now.
    let mut lost = 0;
    let (snapshot, reason) = loop {
        let snapshot =
            Snapshot::load(app, &pool.node_ids, &r.id, r.start_ms, r.end_ms, now).await?;
        match place_now(app, conn, pool, r, &snapshot, now).await? {
            Attempt::Placed => return Ok(true),
            Attempt::NoFit(reason) => break (snapshot, reason),
            Attempt::Lost(nodes) => {
                app.capacity.forget(&nodes).await;
                lost += 1;
                if lost == PLACE_ATTEMPTS {
                    break (snapshot, BOOKED_CONCURRENTLY.to_string());
                }
            }
        }
    };
    let spot_nodes = snapshot.nodes_holding_spot();
    if !r.spot && !spot_nodes.is_empty() {
        // Preemption terminates what the snapshot shows: read the nodes holding spot work
        // again, so that no victim is chosen that a concurrent create already took.
        app.capacity.forget(&spot_nodes).await;
        let snapshot =
            Snapshot::load(app, &pool.node_ids, &r.id, r.start_ms, r.end_ms, now).await?;
        let mut attempt = sqlx::Connection::begin(&mut *conn).await?;
        if preempt::make_room(app, &mut attempt, pool, r, &snapshot, now).await? {
            // The terminations changed what is free: place on a fresh snapshot.
            let freed = Snapshot::read(
                &mut attempt,
                &pool.node_ids,
                &r.id,
                r.start_ms,
                r.end_ms,
                now,
            )
            .await?;
            if let Attempt::Placed = place_now(app, &mut attempt, pool, r, &freed, now).await? {
                attempt.commit().await?;
                return Ok(true);
            }
        }
        attempt.rollback().await?;
    }
    mark_pending(r, queued, reason, now);
    Ok(false)
}

/// Asks the pool's placer for units on `snapshot` (the pool as the view sees it) and books
/// them. A gang is placed member by member, all or none ([`super::gang`]).
async fn place_now(
    app: &App,
    conn: &mut AnyConnection,
    pool: &Pool,
    r: &mut Reservation,
    snapshot: &Snapshot,
    now: i64,
) -> Result<Attempt> {
    if r.request.gang.is_some() {
        return super::gang::place(app, conn, pool, r, snapshot, now).await;
    }
    let offer = snapshot.candidates(r, false);
    let placer = crate::policy::assignment::placer_for(app, conn, pool).await?;
    // A decision is CPU work bounded by the plugin's deadline; keep it off the async workers.
    let (choice, decided_by) =
        match tokio::task::block_in_place(|| placer.place(&offer.request, &offer.candidates)) {
            Ok(decision) => decision,
            Err(Refusal::Unschedulable(reason)) => return Ok(Attempt::NoFit(reason)),
            Err(Refusal::Failed(failure)) => return Err(Error::PolicyFailed(failure)),
        };
    if let Err(message) = check_choice(&offer.request, &offer.candidates, &choice) {
        let kind = crate::policy::FailureKind::InvalidAnswer;
        return Err(Error::PolicyFailed(crate::policy::Failure {
            plugin_id: placer.id(),
            kind,
            message,
        }));
    }
    let (node_index, _) = offer.index[choice.units[0] as usize];
    let node = &snapshot.nodes[node_index];
    let chosen: Vec<String> = choice
        .units
        .iter()
        .map(|u| node.units[offer.index[*u as usize].1].id.clone())
        .collect();
    let units = Snapshot::booked_units(node, r, chosen);
    if !Snapshot::rights_still_allow(conn, app.store.for_share(), r, &node.id, &units, now).await? {
        return Ok(Attempt::Lost(vec![node.id.clone()]));
    }
    let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
    match store::insert_bookings(
        &mut savepoint,
        r,
        &node.id,
        &units,
        app.provider_share_bps,
        now,
    )
    .await
    {
        Ok(()) => savepoint.commit().await?,
        Err(err) if violates(&err, "bookings_no_overlap") => {
            savepoint.rollback().await?;
            return Ok(Attempt::Lost(vec![node.id.clone()]));
        }
        Err(err) => return Err(err.into()),
    }
    r.members = vec![store::Member {
        node_id: node.id.clone(),
        unit_ids: units.clone(),
    }];
    r.unit_ids = units;
    mark_placed(r, node.id.clone(), decided_by, now);
    Ok(Attempt::Placed)
}

/// Moves `r` to `placed` on `node_id` (its first member), decided by `decided_by`.
pub(super) fn mark_placed(r: &mut Reservation, node_id: String, decided_by: String, now: i64) {
    r.state = State::Placed;
    r.node_id = Some(node_id);
    r.placed_by = Some(decided_by);
    r.next_attempt_ms = None;
    r.clear_condition("Unschedulable");
    r.clear_condition("Queued");
    // A lease counts from when the reservation starts holding its units.
    if let Some(lease) = r.lease_seconds {
        r.lease_deadline_ms = Some(r.start_ms.max(now) + lease * 1000);
    }
}

pub(super) fn mark_pending(r: &mut Reservation, queued: bool, message: String, now: i64) {
    r.state = State::Pending;
    if queued {
        r.set_condition("Queued", "WaitingForCapacity", message, now);
        r.next_attempt_ms = None;
    } else {
        r.set_condition("Unschedulable", "NoFit", message, now);
        r.next_attempt_ms = Some(now + RETRY_AFTER_MS);
    }
}

pub(super) async fn older_pending_exists(
    conn: &mut AnyConnection,
    r: &Reservation,
) -> Result<bool> {
    let count: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM compute_reservations
         WHERE pool_id = $1 AND state = 'pending'
           AND position < (SELECT position FROM compute_reservations WHERE id = $2)",
    )
    .bind(&r.pool_id)
    .bind(&r.id)
    .fetch_one(conn)
    .await?;
    Ok(count > 0)
}

pub(super) async fn emit_placement(
    conn: &mut AnyConnection,
    r: &Reservation,
    placed: bool,
    pool: &Pool,
) -> Result<()> {
    let kind = match (placed, pool.policy.placer) {
        (true, _) => "reservation.placed",
        (false, PlacerMode::PoolLease) => "reservation.queued",
        (false, PlacerMode::Default) => "reservation.pending",
    };
    emit(conn, r, kind, json!({})).await
}

pub(super) async fn emit(
    conn: &mut AnyConnection,
    r: &Reservation,
    kind: &str,
    extra: serde_json::Value,
) -> Result<()> {
    let mut payload = json!({ "reservation": r.view() });
    if let (Some(target), Some(extra)) = (payload.as_object_mut(), extra.as_object()) {
        target.extend(extra.clone());
    }
    events::emit(conn, kind, &r.id, &[&r.tenant_id], &payload, r.updated_at).await
}

/// Retries placing a pending reservation (the reconciler's and the wake-up's path).
pub async fn retry(app: &App, id: &str) -> Result<bool> {
    let mut tx = app.store.begin().await?;
    let Some(mut r) = store::find(&mut tx, id, app.store.for_update()).await? else {
        return Ok(false);
    };
    if r.state != State::Pending {
        return Ok(false);
    }
    let Some(pool) = crate::pools::store::find(&mut tx, &r.pool_id).await? else {
        return Ok(false);
    };
    lock_pool(app, &mut tx, &pool.id).await?;
    // Read after the locks: the bookings written below start no earlier than this.
    let now = app.now_ms();
    let before = r.conditions.clone();
    let placed = try_place(app, &mut tx, &pool, &mut r, now).await?;
    if !placed
        && r.conditions
            .iter()
            .map(|c| (&c.kind, &c.message))
            .eq(before.iter().map(|c| (&c.kind, &c.message)))
    {
        // Still waiting for the same reason: only the next attempt moves.
        r.conditions = before;
    }
    if placed {
        r.operate("place", now);
    }
    if !store::update(&mut tx, &mut r).await? {
        tx.rollback().await?;
        return Ok(false);
    }
    if placed {
        emit(&mut tx, &r, "reservation.placed", json!({})).await?;
        let entry = crate::audit::Entry {
            org_id: &r.tenant_id,
            action: "compute-reservation.place",
            object_type: "compute-reservation",
            object_id: &r.id,
            reason: None,
            details: Some(json!({ "state": r.state, "placedBy": r.placed_by })),
        };
        crate::audit::record(&mut tx, &crate::iam::Principal::system(), entry, now).await?;
    }
    tx.commit().await?;
    app.capacity.forget(&r.node_ids()).await;
    Ok(placed)
}
