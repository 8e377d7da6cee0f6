//! `extend`: moves the end of a reservation later, all or nothing, after one IAM decision.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::AnyConnection;

use super::create::check_budget;
use super::engine::{EXTEND, attributes, bookable_pool, emit, not_found};
use super::lifecycle::{audit_method, authorized, changed_concurrently};
use super::placement::Snapshot;
use super::store::{self, ComputeReservation, Reservation};
use crate::iam::policy::{self, Decision};
use crate::iam::{Permission, Principal};
use crate::store::violates;
use crate::{App, Error, Result};

/// How long an extend decision blocks other extends of the same reservation.
const EXTEND_LOCK_MS: i64 = 10_000;

/// Input of `extend`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtendInput {
    pub tenant_id: String,
    pub reservation_id: String,
    /// The new end, epoch milliseconds.
    #[serde(default)]
    pub until: Option<i64>,
    /// How much later, as `duration` in create.
    #[serde(default)]
    pub by: Option<super::Duration>,
    pub idempotency_key: String,
}

/// The answer of `extend`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Extended {
    pub reservation: ComputeReservation,
    pub extended: bool,
    /// When a later booking blocks: the latest end the bookings can reach.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_until: Option<i64>,
}

/// `extend`: moves the end of a placed, binding or active reservation later, all or nothing.
pub async fn extend(app: &App, caller: &Principal, input: ExtendInput) -> Result<Extended> {
    super::check_idempotency_key(&input.idempotency_key)?;
    let by_ms = match (&input.until, &input.by) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(Error::invalid("until", "give exactly one of until or by"));
        }
        (Some(until), None) => {
            crate::validation::range("until", *until, 0, super::MAX_INSTANT_MS)?;
            None
        }
        (None, Some(by)) => Some(by.to_ms("by")?),
    };
    let now = app.now_ms();
    // Claim the reservation for this decision (a short transaction), so concurrent extends
    // of it are refused rather than decided twice.
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
    if !r.state.holds_units() {
        return Err(Error::InvalidState(format!(
            "reservation {} is {}; only placed, binding or active reservations extend",
            r.id,
            r.state.as_str()
        )));
    }
    let new_end = input
        .until
        .unwrap_or_else(|| r.end_ms.saturating_add(by_ms.unwrap_or(0)));
    if new_end <= r.end_ms {
        return Ok(Extended {
            reservation: r.view(),
            extended: false,
            available_until: None,
        });
    }
    if new_end - r.start_ms > super::MAX_DURATION_MS {
        return Err(Error::invalid("until", "the window would exceed 366 days"));
    }
    if r.extend_started_ms
        .is_some_and(|t| t + EXTEND_LOCK_MS > now)
    {
        let retry = (r.extend_started_ms.unwrap_or(now) + EXTEND_LOCK_MS - now + 999) / 1000;
        return Err(Error::conflict(
            "another extend of this reservation is being decided",
            Some(
                json!({ "reason": "extend-in-flight", "retryAfterSeconds": retry.max(1), "reservationId": r.id }),
            ),
        ));
    }
    r.extend_started_ms = Some(now);
    if !store::update(&mut tx, &mut r).await? {
        return Err(changed_concurrently(&r));
    }
    tx.commit().await?;
    #[cfg(debug_assertions)]
    super::gate::hold_at("ORL_TEST_EXTEND_GATE").await;

    let decided = decide_extension(app, caller, &r, new_end).await;
    // Whatever was decided, the claim is given back, on the reservation as it is now.
    let mut tx = app.store.begin().await?;
    let mut current = store::find(&mut tx, &r.id, app.store.for_update())
        .await?
        .ok_or_else(|| not_found(&r.id))?;
    let ours = current.extend_started_ms == Some(now);
    if ours {
        current.extend_started_ms = None;
    }
    if !current.state.holds_units() {
        // Released, cancelled or ended while the extend was decided: nothing to extend.
        tx.rollback().await?;
        decided?;
        return Err(Error::InvalidState(format!(
            "reservation {} became {} while the extend was decided",
            current.id,
            current.state.as_str()
        )));
    }
    let outcome = match decided {
        Ok(()) => book_until(app, &mut tx, &current, new_end).await?,
        Err(err) => Err(err),
    };
    let at = app.now_ms();
    let extended = outcome.as_ref().is_ok_and(Option::is_none);
    if extended {
        current.end_ms = new_end;
        current.operate("extend", at);
    }
    if (ours || extended) && !store::update(&mut tx, &mut current).await? {
        return Err(changed_concurrently(&current));
    }
    let blocked = match outcome {
        Ok(blocked) => blocked,
        Err(err) => {
            tx.commit().await?;
            return Err(err);
        }
    };
    if extended {
        emit(
            &mut tx,
            &current,
            "reservation.extended",
            json!({ "end": new_end }),
        )
        .await?;
        audit_method(&mut tx, caller, &current, "compute-reservation.extend", at).await?;
    }
    tx.commit().await?;
    Ok(Extended {
        reservation: current.view(),
        extended,
        available_until: blocked,
    })
}

/// Moves the end of `r`'s bookings to `new_end`, unless a later booking of any of its units
/// (on any gang member) starts before it, or a node reservation whose audience the tenant
/// is not in claims one of them: then nothing moves and the answer is when that booking or
/// claim starts, the latest end the bookings can reach. Runs in the write transaction, and
/// the database's overlap constraint refuses a booking that a concurrent create made.
async fn book_until(
    app: &App,
    conn: &mut AnyConnection,
    r: &Reservation,
    new_end: i64,
) -> Result<Result<Option<i64>>> {
    let blocked = [
        next_booking(conn, r, new_end).await?,
        refused_from(app, conn, r, new_end).await?,
    ];
    if let Some(at) = blocked.into_iter().flatten().min() {
        return Ok(Ok(Some(at)));
    }
    #[cfg(debug_assertions)]
    super::gate::hold_at("ORL_TEST_EXTEND_BOOK_GATE").await;
    let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
    match store::extend_bookings(&mut savepoint, &r.id, new_end).await {
        Ok(()) => {
            savepoint.commit().await?;
            Ok(Ok(None))
        }
        Err(err) if violates(&err, "bookings_no_overlap") => {
            savepoint.rollback().await?;
            let at = next_booking(conn, r, new_end).await?.unwrap_or(r.end_ms);
            Ok(Ok(Some(at)))
        }
        Err(err) => Err(err.into()),
    }
}

/// The earliest start of another booking of `r`'s units between its end and `until`.
async fn next_booking(
    conn: &mut AnyConnection,
    r: &Reservation,
    until: i64,
) -> Result<Option<i64>> {
    let mut blocked: Option<i64> = None;
    for member in r.members.iter().filter(|m| !m.unit_ids.is_empty()) {
        if let Some(at) = store::next_booking_start(
            conn,
            &r.id,
            &member.node_id,
            &member.unit_ids,
            r.end_ms,
            until,
        )
        .await?
        {
            blocked = Some(blocked.map_or(at, |b| b.min(at)));
        }
    }
    Ok(blocked)
}

/// When the node reservations on `r`'s nodes first refuse it the time from its end to
/// `until` ([`Snapshot::rights_refuse_from`]). Read without a lock: a reclaim that takes
/// released units back terminates `r` itself, so it waits for the reservation's lock, which
/// the caller holds; the other changes of a node reservation never read bookings.
async fn refused_from(
    app: &App,
    conn: &mut AnyConnection,
    r: &Reservation,
    until: i64,
) -> Result<Option<i64>> {
    let mut added = r.clone();
    (added.start_ms, added.end_ms) = (r.end_ms, until);
    let now = app.now_ms();
    let mut refused: Option<i64> = None;
    for m in r.members.iter().filter(|m| !m.unit_ids.is_empty()) {
        let from =
            Snapshot::rights_refuse_from(conn, "", &added, &m.node_id, &m.unit_ids, now).await?;
        refused = refused.into_iter().chain(from).min();
    }
    Ok(refused)
}

/// The IAM decision (with the new total duration) and the spend-guard on the longer window.
async fn decide_extension(
    app: &App,
    caller: &Principal,
    r: &Reservation,
    new_end: i64,
) -> Result<()> {
    let mut conn = app.store.pool().acquire().await?;
    let at = app.settings.version(&mut conn).await?;
    let (pool, offer) = bookable_pool(app, &mut conn, at, &r.pool_id, &r.tenant_id)
        .await
        .map_err(|_| not_found(&r.id))?;
    let mut longer = r.clone();
    longer.end_ms = new_end;
    let attrs = attributes(&r.request, &longer, "");
    let policy_text = app.settings.policy(&mut conn, at, &r.tenant_id).await?;
    if policy::decide(
        policy_text.as_deref(),
        caller,
        EXTEND,
        (&r.id, &r.tenant_id),
        &attrs,
    )? != Decision::Allow
    {
        return Err(Error::AccessDenied(format!(
            "IAM refused {EXTEND} to {} hours",
            attrs.duration_hours
        )));
    }
    let mut extra = longer.clone();
    extra.start_ms = r.end_ms;
    check_budget(app, &mut conn, (&pool, at), offer.as_ref(), &extra).await?;
    Ok(())
}
