//! `extend`: moves the end of a reservation later, all or nothing, after one IAM decision.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::create::check_budget;
use super::engine::{EXTEND, attributes, bookable_pool, emit, not_found};
use super::lifecycle::{audit_method, authorized};
use super::store::{self, ComputeReservation, Reservation};
use crate::iam::policy::{self, Decision};
use crate::iam::{Permission, Principal};
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
    let state = r.state;
    r.extend_started_ms = Some(now);
    store::update(&mut tx, &r, state).await?;
    tx.commit().await?;

    let outcome = decide_extension(app, caller, &mut r, new_end).await;
    // Whatever happened, the claim is released.
    let mut tx = app.store.begin().await?;
    if let Some(mut current) = store::find(&mut tx, &r.id, app.store.for_update()).await? {
        let state = current.state;
        current.extend_started_ms = None;
        if let Ok(Some(end)) = &outcome {
            current.end_ms = *end;
            current.operate("extend", app.now_ms());
            store::extend_bookings(&mut tx, &r.id, *end).await?;
        }
        store::update(&mut tx, &current, state).await?;
        if let Ok(Some(end)) = &outcome {
            emit(
                &mut tx,
                &current,
                "reservation.extended",
                json!({ "end": end }),
            )
            .await?;
            audit_method(
                &mut tx,
                caller,
                &current,
                "compute-reservation.extend",
                app.now_ms(),
            )
            .await?;
        }
        r = current;
    }
    tx.commit().await?;
    match outcome {
        Ok(Some(_)) => Ok(Extended {
            reservation: r.view(),
            extended: true,
            available_until: None,
        }),
        Ok(None) => unreachable!("decide_extension answers Some or an error"),
        Err(Error::Conflict {
            details: Some(d), ..
        }) if d.get("availableUntil").is_some() => Ok(Extended {
            reservation: r.view(),
            extended: false,
            available_until: d["availableUntil"].as_i64(),
        }),
        Err(err) => Err(err),
    }
}

/// The IAM decision (with the new total duration), the spend-guard, and whether the
/// bookings can reach `new_end`.
async fn decide_extension(
    app: &App,
    caller: &Principal,
    r: &mut Reservation,
    new_end: i64,
) -> Result<Option<i64>> {
    let mut conn = app.store.pool().acquire().await?;
    let (pool, offer) = bookable_pool(&mut conn, &r.pool_id, &r.tenant_id)
        .await
        .map_err(|_| not_found(&r.id))?;
    let mut longer = r.clone();
    longer.end_ms = new_end;
    let attrs = attributes(&r.request, &longer, "");
    let policy_text = policy::find(&mut conn, &r.tenant_id).await?;
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
    check_budget(app, &mut conn, &pool, offer.as_ref(), &extra).await?;
    // Every member of a gang moves together: the earliest later booking on any of them blocks.
    let mut blocked: Option<i64> = None;
    for member in r.members.iter().filter(|m| !m.unit_ids.is_empty()) {
        if let Some(at) = store::next_booking_start(
            &mut conn,
            &r.id,
            &member.node_id,
            &member.unit_ids,
            r.end_ms,
            new_end,
        )
        .await?
        {
            blocked = Some(blocked.map_or(at, |b| b.min(at)));
        }
    }
    if let Some(blocked_at) = blocked {
        return Err(Error::conflict(
            "a later booking blocks",
            Some(json!({ "availableUntil": blocked_at })),
        ));
    }
    Ok(Some(new_end))
}
