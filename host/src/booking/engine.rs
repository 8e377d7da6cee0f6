//! What the reservation methods share: the pool a tenant may book into, the IAM
//! attributes of a request, the placed and pending states, and events.

use serde_json::json;
use sqlx::AnyConnection;

use super::store::Reservation;
use super::{CreateRequest, State};
use crate::capacity::{Change, Edit, Since};
use crate::events;
use crate::iam::policy::Attributes;
use crate::pools::PlacerMode;
use crate::pools::store::{Offer, Pool};
use crate::settings::Version;
use crate::store::Batch;
use crate::{App, Error, Result};

/// How long a default-placer reservation waits before its next placement attempt.
pub const RETRY_AFTER_MS: i64 = 30_000;

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

/// The pool `tenant` may book into: owned by or offered to it, not archived, as of
/// settings version `at`. Its member list is not read: placements read the pool's nodes
/// from the capacity view.
pub(super) async fn bookable_pool(
    app: &App,
    conn: &mut AnyConnection,
    at: Version,
    pool_id: &str,
    tenant: &str,
) -> Result<(Pool, Option<Offer>)> {
    let missing = || Error::not_found(format_args!("pool {pool_id}"));
    let pool = app
        .settings
        .pool(conn, at, pool_id)
        .await?
        .ok_or_else(missing)?;
    let offer = app.settings.terms(conn, at, pool_id, tenant).await?;
    if pool.archived || (pool.owner_org_id != tenant && offer.is_none()) {
        return Err(missing());
    }
    Ok((pool, offer))
}

/// What a transaction lays onto the capacity view as it commits ([`commit_laying`]).
pub(crate) enum Laying {
    /// Its changes by node, each made against the generation the view held of the node
    /// before the commit.
    Edits(Vec<Edit>),
    /// Nodes the view loads again instead (none: nothing to lay on).
    Forget(Vec<String>),
}

/// What `changes` (by node) lay onto the view, against the generations it holds now, before
/// the transaction that made them commits.
pub(super) async fn laying(app: &App, changes: Vec<(String, Change)>) -> Laying {
    let nodes: Vec<String> = changes.iter().map(|(node, _)| node.clone()).collect();
    let generations = app.capacity.generations(&nodes).await;
    let edits = changes
        .into_iter()
        .zip(generations)
        .map(|((node_id, change), generation)| Edit {
            node_id,
            generation,
            change,
        })
        .collect();
    Laying::Edits(edits)
}

/// Commits `tx` and lays `laying` onto the capacity view
/// ([`crate::capacity::View::apply`], [`crate::capacity::View::forget`]); `since` was read
/// in `tx` before it changed capacity.
pub(super) async fn commit_laying(
    app: &App,
    tx: crate::store::Tx,
    since: Since,
    laying: Laying,
) -> Result<()> {
    match laying {
        Laying::Edits(edits) if !edits.is_empty() => {
            let turn = tx.commit_in_turn().await?;
            app.capacity.apply(since, edits).await;
            drop(turn);
        }
        Laying::Edits(_) => tx.commit().await?,
        Laying::Forget(nodes) => {
            tx.commit().await?;
            if !nodes.is_empty() {
                app.capacity.forget(&nodes).await;
            }
        }
    }
    Ok(())
}

pub(super) async fn lock_pool(app: &App, conn: &mut AnyConnection, pool_id: &str) -> Result<()> {
    sqlx::query(&format!(
        "SELECT id FROM pools WHERE id = $1{}",
        app.store.for_turn()
    ))
    .bind(pool_id)
    .fetch_optional(conn)
    .await?;
    Ok(())
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

/// Whether a pending reservation of `r`'s pool queued before it; for a request not stored
/// yet (a plan), whether any is pending.
pub(super) async fn older_pending_exists(
    conn: &mut AnyConnection,
    r: &Reservation,
) -> Result<bool> {
    let count: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM compute_reservations
         WHERE pool_id = $1 AND state = 'pending'
           AND position < COALESCE((SELECT position FROM compute_reservations WHERE id = $2),
                                   9223372036854775807)",
    )
    .bind(&r.pool_id)
    .bind(&r.id)
    .fetch_one(conn)
    .await?;
    Ok(count > 0)
}

/// The event of a placement that booked `r` (`placed`) or left it waiting.
pub(super) fn placement_event(placed: bool, pool: &Pool) -> &'static str {
    match (placed, pool.policy.placer) {
        (true, _) => "reservation.placed",
        (false, PlacerMode::PoolLease) => "reservation.queued",
        (false, PlacerMode::Default) => "reservation.pending",
    }
}

pub(super) async fn emit(
    conn: &mut AnyConnection,
    r: &Reservation,
    kind: &str,
    extra: serde_json::Value,
) -> Result<()> {
    let mut batch = Batch::on(conn);
    push_event(&mut batch, r, kind, extra);
    batch.execute(conn).await?;
    Ok(())
}

/// Adds the event `kind` about `r` (its view, with `extra`'s fields) to `batch`.
pub(super) fn push_event(batch: &mut Batch, r: &Reservation, kind: &str, extra: serde_json::Value) {
    let mut payload = json!({ "reservation": r.view() });
    if let (Some(target), Some(extra)) = (payload.as_object_mut(), extra.as_object()) {
        target.extend(extra.clone());
    }
    events::push(batch, kind, &r.id, &[&r.tenant_id], &payload, r.updated_at);
}
