//! The methods on an existing reservation: `get`, `release`, `cancel`, `renew`, and the
//! terminal transition they share with the reconciler.

use serde::Deserialize;
use serde_json::json;
use sqlx::AnyConnection;

use super::engine::{Laying, laying, not_found, push_event};
use super::group::Writer;
use super::store::{self, ComputeReservation, Reservation};
use super::{State, check_reservation_id, check_tenant_id};
use crate::audit::{self, Entry};
use crate::capacity::{Change, Since};
use crate::iam::{Permission, Principal};
use crate::store::{Backend, Batch};
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
    let charge = mark_ended(r, state, reason, now);
    if !store::update(conn, r).await? {
        return Ok(false);
    }
    ended_effects(conn, r, state, reason, charge, now)
        .await?
        .execute(conn)
        .await?;
    Ok(true)
}

/// Moves `r` to the terminal `state` for `reason` (in memory), and answers the charge it
/// held: cleared in the update that ends it, so that only that update refunds it.
fn mark_ended(
    r: &mut Reservation,
    state: State,
    reason: &str,
    now: i64,
) -> Option<std::collections::BTreeMap<String, i64>> {
    let charge = r.charge.take();
    r.state = state;
    r.reason = Some(reason.to_string());
    r.lease_deadline_ms = None;
    r.next_attempt_ms = None;
    r.extend_started_ms = None;
    r.operate(reason, now);
    charge
}

/// The side effects of ending `r` once its update matched: its node asked to unbind (a
/// bound kubernetes reservation's devices stay booked while its node still holds them),
/// then, in the batch answered for the caller to add to and run, its bookings released,
/// `charge` refunded and its event.
async fn ended_effects(
    conn: &mut AnyConnection,
    r: &mut Reservation,
    state: State,
    reason: &str,
    charge: Option<std::collections::BTreeMap<String, i64>>,
    now: i64,
) -> Result<Batch> {
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
    Ok(batch)
}

/// How often a reservation that changed between its read and its write is ended again
/// from what it became, or a write that gave up waiting for a lock is tried again.
const END_ATTEMPTS: u32 = 3;

/// A terminal move: to `state` for `reason`, audited as `action` by `by`.
pub struct Ending<'a> {
    pub state: State,
    pub reason: &'a str,
    pub by: &'a Principal,
    pub action: &'a str,
}

/// Ends `r`, as read outside any transaction, as [`terminate`] does, with its audit entry
/// and what `then` adds: the guarded update and where the capacity feed stands in one round
/// trip, then, only if it matched, the effects in another; the view drops its bookings once
/// they commit. Answers `r` ended, or `None`, having written nothing, when it changed since
/// it was read.
///
/// On SQLite it writes in the open group commit ([`super::group`]), as creates do: one
/// writer, whose turn it takes for two round trips instead of a whole transaction. On
/// PostgreSQL it commits alone: in a group it would hold the tenant's quota rows, which
/// every release and create of the tenant updates, until the group's last member is done,
/// and replicas' groups would wait on each other.
pub(crate) async fn end(
    app: &App,
    r: Reservation,
    ending: Ending<'_>,
    then: impl Fn(&mut Batch, &Reservation),
) -> Result<Option<Reservation>> {
    for attempt in 0..END_ATTEMPTS {
        let mut ended = r.clone();
        let mut writer = match app.store.backend() {
            Backend::Sqlite => Writer::Member(app.placements.join(&app.store).await?),
            Backend::Postgres => Writer::Alone(app.store.begin().await?),
        };
        match write_end(app, &mut writer, &mut ended, &ending, &then).await {
            Ok(Some(since)) => {
                let laying = match ended.binding {
                    super::Binding::Hold => {
                        let change = |node| {
                            let reservation_id = ended.id.clone();
                            (node, Change::Ended { reservation_id })
                        };
                        laying(app, ended.node_ids().into_iter().map(change).collect()).await
                    }
                    // Its binding changed too, and may keep the devices booked.
                    _ => Laying::Forget(ended.node_ids()),
                };
                writer.keep(app, since, laying).await?;
                return Ok(Some(ended));
            }
            Ok(None) => {
                writer.drop_writes().await?;
                return Ok(None);
            }
            Err(err) if err.is_transaction_conflict() && attempt + 1 < END_ATTEMPTS => {
                writer.drop_writes().await?;
            }
            Err(err) => {
                writer.drop_writes().await?;
                return Err(err);
            }
        }
    }
    unreachable!("the last attempt never asks to write again")
}

/// The writes of [`end`], through `writer`: `None` when the update did not match.
async fn write_end(
    app: &App,
    writer: &mut Writer,
    r: &mut Reservation,
    ending: &Ending<'_>,
    then: &impl Fn(&mut Batch, &Reservation),
) -> Result<Option<Since>> {
    let now = app.now_ms();
    let Ending {
        state,
        reason,
        by,
        action,
    } = *ending;
    let charge = mark_ended(r, state, reason, now);
    let feed = app.capacity.since_sql();
    let mut batch = Batch::on(writer.conn());
    writer.begin_in(&mut batch).await?;
    store::push_update(&mut batch, r);
    let (rows, after) = batch.execute_then(writer.conn(), feed).await?;
    if rows != [1] {
        return Ok(None);
    }
    #[cfg(debug_assertions)]
    super::gate::hold_at("ORL_TEST_END_GATE").await;
    r.version += 1;
    let conn = writer.conn();
    let mut batch = ended_effects(conn, r, state, reason, charge, now).await?;
    audit::push(&mut batch, by, move_entry(r, action), now);
    then(&mut batch, r);
    let (_, until) = batch.execute_then(conn, feed).await?;
    Ok(Some(app.capacity.since_of(after).until(until)))
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
    end_on_request(app, caller, &input, "release", |r| match r.state {
        _ if r.state.is_draft() => Err(Error::InvalidState(format!(
            "reservation {} is still a {}",
            r.id,
            r.state.as_str()
        ))),
        _ if r.state.is_terminal() => Ok(None),
        State::Pending => Ok(Some(State::Cancelled)),
        _ => Ok(Some(State::Released)),
    })
    .await
}

/// `cancel`: withdraws a reservation that has not started (`pending` or `placed`).
pub async fn cancel(
    app: &App,
    caller: &Principal,
    input: ReservationRef,
) -> Result<ComputeReservation> {
    end_on_request(app, caller, &input, "cancel", |r| match r.state {
        State::Draft | State::AwaitingConfirmation => Err(not_found(&r.id)),
        State::Cancelled => Ok(None),
        State::Pending | State::Placed => Ok(Some(State::Cancelled)),
        other => Err(Error::InvalidState(format!(
            "reservation {} is {}; use release for a started reservation",
            r.id,
            other.as_str()
        ))),
    })
    .await
}

/// A caller's `method` that ends a reservation: `next` says, on the reservation as read,
/// what state it ends in (`None`: it answers as it is). Read again when it changed before
/// the write.
async fn end_on_request(
    app: &App,
    caller: &Principal,
    input: &ReservationRef,
    method: &str,
    next: impl Fn(&Reservation) -> Result<Option<State>>,
) -> Result<ComputeReservation> {
    let action = format!("compute-reservation.{method}");
    let mut changed = None;
    for _ in 0..END_ATTEMPTS {
        let r = {
            let mut conn = app.store.pool().acquire().await?;
            let (tenant, id) = (&input.tenant_id, &input.reservation_id);
            authorized(
                &mut conn,
                caller,
                Permission::ComputeRelease,
                tenant,
                id,
                "",
            )
            .await?
        };
        let Some(state) = next(&r)? else {
            return Ok(r.view());
        };
        let ending = Ending {
            state,
            reason: method,
            by: caller,
            action: &action,
        };
        match end(app, r.clone(), ending, |_, _| {}).await? {
            Some(ended) => {
                crate::reconciler::wake_pool(app, &ended.pool_id, &ended.node_ids()).await?;
                return Ok(ended.view());
            }
            None => changed = Some(r),
        }
    }
    Err(changed_concurrently(&changed.expect("tried")))
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
