//! The methods on an existing reservation: `get`, `release`, `cancel`, `renew`, and the
//! terminal transition they share with the reconciler.

use serde::Deserialize;
use serde_json::json;
use sqlx::AnyConnection;

use super::engine::{commit_with, not_found, push_event};
use super::store::{self, ComputeReservation, Reservation};
use super::{State, check_reservation_id, check_tenant_id};
use crate::audit::{self, Entry};
use crate::capacity::{Change, Since};
use crate::iam::{Permission, Principal};
use crate::store::Batch;
use crate::{App, Error, Result};

/// Ends `r` in a terminal `state`, as one transition: the state changes only if the row is
/// still the version `r` was read at, and only then are its bookings released at `now`
/// (unless its node still holds the devices), its quota refunded (the charge is cleared in
/// the same update, so it is refunded once) and its event emitted. Returns false, having
/// written nothing, when another writer changed it first; `r` is then stale.
pub async fn terminate(
    conn: &mut AnyConnection,
    r: &mut Reservation,
    state: State,
    reason: &str,
    now: i64,
) -> Result<bool> {
    let charge = r.charge.take();
    r.state = state;
    r.reason = Some(reason.to_string());
    r.lease_deadline_ms = None;
    r.next_attempt_ms = None;
    r.extend_started_ms = None;
    r.operate(reason, now);
    if !store::update(conn, r).await? {
        return Ok(false);
    }
    // Only once the update matched: the side effects, in one round trip.
    // A bound kubernetes reservation's devices stay booked while its node still holds them.
    let keeps_devices = super::binding::on_terminate(conn, r, state, reason, now).await?;
    if keeps_devices {
        store::update(conn, r).await?;
    }
    let mut batch = Batch::on(conn);
    if !keeps_devices {
        store::push_release_bookings(&mut batch, &r.id, now);
    }
    if let Some(charge) = charge {
        store::push_charge(&mut batch, (&r.pool_id, &r.tenant_id), &charge, -1, None);
    }
    let kind = match state {
        State::Cancelled => "reservation.cancelled",
        State::Released => "reservation.released",
        State::Failed => "reservation.failed",
        _ => "reservation.expired",
    };
    push_event(&mut batch, r, kind, json!({ "reason": reason }));
    batch.execute(conn).await?;
    Ok(true)
}

/// Commits `tx`, in which `r` was ended ([`terminate`]), and takes its bookings off the
/// capacity view. A reservation bound to its node (whose binding changed too, and may keep
/// the devices booked) is loaded again instead. `since` was read in `tx` before it
/// changed capacity.
pub async fn commit_ended(
    app: &App,
    tx: crate::store::Tx,
    since: Since,
    r: &Reservation,
) -> Result<()> {
    let nodes = r.node_ids();
    if r.binding != super::Binding::Hold {
        tx.commit().await?;
        app.capacity.forget(&nodes).await;
        return Ok(());
    }
    let changes = nodes
        .into_iter()
        .map(|node| {
            let change = Change::Ended {
                reservation_id: r.id.clone(),
            };
            (node, change)
        })
        .collect();
    commit_with(app, tx, since, changes).await
}

/// A transition of a reservation read in this transaction found it changed: the caller
/// retries on the current state.
pub(super) fn changed_concurrently(r: &Reservation) -> Error {
    Error::conflict(
        "the reservation changed concurrently; retry",
        Some(json!({ "reservationId": r.id })),
    )
}

/// Audits a move the server made on its own (the reconciler, node loss), as the system:
/// action `compute-reservation.<name>`.
pub async fn audit_move(
    conn: &mut AnyConnection,
    r: &Reservation,
    name: &str,
    now: i64,
) -> Result<()> {
    let action = format!("compute-reservation.{name}");
    audit::record(conn, &Principal::system(), move_entry(r, &action), now).await
}

/// Adds the audit entry of a move the server made on its own ([`audit_move`]) to `batch`.
pub fn push_audit_move(batch: &mut Batch, r: &Reservation, name: &str, now: i64) {
    let action = format!("compute-reservation.{name}");
    audit::push(batch, &Principal::system(), move_entry(r, &action), now);
}

fn move_entry<'a>(r: &'a Reservation, action: &'a str) -> Entry<'a> {
    Entry {
        org_id: &r.tenant_id,
        action,
        object_type: "compute-reservation",
        object_id: &r.id,
        reason: r.reason.as_deref(),
        details: Some(json!({ "state": r.state })),
    }
}

/// Loads a reservation of `tenant` for a method that needs `permission`; callers decide
/// what a draft means to them.
pub(super) async fn authorized(
    conn: &mut AnyConnection,
    caller: &Principal,
    permission: Permission,
    tenant: &str,
    id: &str,
    lock: &str,
) -> Result<Reservation> {
    check_tenant_id(tenant)?;
    check_reservation_id("reservationId", id)?;
    if !(caller.has(permission) && caller.acts_for(tenant)) {
        return Err(not_found(id));
    }
    match store::find(conn, id, lock).await? {
        Some(r) if r.tenant_id == tenant => Ok(r),
        _ => Err(not_found(id)),
    }
}

/// Input of `get`, `release`, `cancel` and `renew`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReservationRef {
    pub tenant_id: String,
    pub reservation_id: String,
}

/// `get`: one reservation of the tenant; drafts are not found.
pub async fn get(
    app: &App,
    caller: &Principal,
    input: ReservationRef,
) -> Result<ComputeReservation> {
    let mut conn = app.store.pool().acquire().await?;
    let r = authorized(
        &mut conn,
        caller,
        Permission::ComputeRead,
        &input.tenant_id,
        &input.reservation_id,
        "",
    )
    .await?;
    if r.state.is_draft() {
        return Err(not_found(&r.id));
    }
    let mut view = r.view();
    view.binding = super::binding::view_of(&mut conn, &r).await?;
    Ok(view)
}

/// `release`: ends a reservation now. Pending becomes `cancelled`; terminal is unchanged;
/// drafts are `INVALID_STATE`.
pub async fn release(
    app: &App,
    caller: &Principal,
    input: ReservationRef,
) -> Result<ComputeReservation> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let mut r = authorized(
        &mut tx,
        caller,
        Permission::ComputeRelease,
        &input.tenant_id,
        &input.reservation_id,
        app.store.for_update(),
    )
    .await?;
    if r.state.is_draft() {
        return Err(Error::InvalidState(format!(
            "reservation {} is still a {}",
            r.id,
            r.state.as_str()
        )));
    }
    if r.state.is_terminal() {
        return Ok(r.view());
    }
    let state = if r.state == State::Pending {
        State::Cancelled
    } else {
        State::Released
    };
    let since = app.capacity.since(&mut tx).await?;
    if !terminate(&mut tx, &mut r, state, "release", now).await? {
        return Err(changed_concurrently(&r));
    }
    audit_method(&mut tx, caller, &r, "compute-reservation.release", now).await?;
    commit_ended(app, tx, since, &r).await?;
    crate::reconciler::wake_pool(app, &r.pool_id, &r.node_ids()).await?;
    Ok(r.view())
}

/// `cancel`: withdraws a reservation that has not started (`pending` or `placed`).
pub async fn cancel(
    app: &App,
    caller: &Principal,
    input: ReservationRef,
) -> Result<ComputeReservation> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let mut r = authorized(
        &mut tx,
        caller,
        Permission::ComputeRelease,
        &input.tenant_id,
        &input.reservation_id,
        app.store.for_update(),
    )
    .await?;
    match r.state {
        State::Draft | State::AwaitingConfirmation => return Err(not_found(&r.id)),
        State::Cancelled => return Ok(r.view()),
        State::Pending | State::Placed => {}
        other => {
            return Err(Error::InvalidState(format!(
                "reservation {} is {}; use release for a started reservation",
                r.id,
                other.as_str()
            )));
        }
    }
    let since = app.capacity.since(&mut tx).await?;
    if !terminate(&mut tx, &mut r, State::Cancelled, "cancel", now).await? {
        return Err(changed_concurrently(&r));
    }
    audit_method(&mut tx, caller, &r, "compute-reservation.cancel", now).await?;
    commit_ended(app, tx, since, &r).await?;
    crate::reconciler::wake_pool(app, &r.pool_id, &r.node_ids()).await?;
    Ok(r.view())
}

pub(super) async fn audit_method(
    conn: &mut AnyConnection,
    caller: &Principal,
    r: &Reservation,
    action: &str,
    now: i64,
) -> Result<()> {
    let entry = Entry {
        org_id: &r.tenant_id,
        action,
        object_type: "compute-reservation",
        object_id: &r.id,
        reason: r.reason.as_deref(),
        details: Some(json!({ "state": r.state })),
    };
    audit::record(conn, caller, entry, now).await
}

/// `renew`: moves the lease deadline to now plus `leaseSeconds`.
pub async fn renew(
    app: &App,
    caller: &Principal,
    input: ReservationRef,
) -> Result<ComputeReservation> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let mut r = authorized(
        &mut tx,
        caller,
        Permission::ComputeExtend,
        &input.tenant_id,
        &input.reservation_id,
        app.store.for_update(),
    )
    .await?;
    if r.state.is_draft() {
        return Err(not_found(&r.id));
    }
    let Some(lease) = r.lease_seconds else {
        return Err(Error::InvalidState(format!(
            "reservation {} was created without leaseSeconds",
            r.id
        )));
    };
    if !r.state.holds_units() {
        return Err(Error::InvalidState(format!(
            "reservation {} is {}; only placed, binding or active reservations renew",
            r.id,
            r.state.as_str()
        )));
    }
    // A lease counts from the start: renewing before it opens cannot make it lapse early.
    r.lease_deadline_ms = Some(r.start_ms.max(now) + lease * 1000);
    r.operate("renew", now);
    if !store::update(&mut tx, &mut r).await? {
        return Err(changed_concurrently(&r));
    }
    audit_method(&mut tx, caller, &r, "compute-reservation.renew", now).await?;
    tx.commit().await?;
    Ok(r.view())
}
