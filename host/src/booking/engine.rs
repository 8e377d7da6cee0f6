//! The seven methods of the reservation API, each a transaction with its audit entry and
//! event: create (draft → IAM decision → quota → placement), get, list, release, cancel,
//! extend and renew; plus the placement retry and the terminal transition the reconciler
//! shares.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::AnyConnection;

use super::placement::{Choice, FirstFit, Placer, Snapshot, check_choice};
use super::store::{self, ComputeReservation, Reservation};
use super::{
    Binding, CreateRequest, State, check_reservation_id, check_tenant_id, cost_minor,
    host_resources, quota_charge, reservation_id,
};
use crate::audit::{self, Entry};
use crate::events;
use crate::iam::confirmations;
use crate::iam::policy::{self, Attributes, Decision};
use crate::iam::{Permission, Principal};
use crate::pools::store::{Offer, Pool};
use crate::pools::{PlacerMode, per_gpu_share};
use crate::store::violates;
use crate::{App, Error, Result};

/// How long a default-placer reservation waits before its next placement attempt.
pub const RETRY_AFTER_MS: i64 = 30_000;
/// How long an extend decision blocks other extends of the same reservation.
const EXTEND_LOCK_MS: i64 = 10_000;

const CREATE: &str = "compute:reservations:create";
const READ: &str = "compute:reservations:read";
const EXTEND: &str = "compute:reservations:extend";

fn not_found(id: &str) -> Error {
    Error::not_found(format_args!("reservation {id}"))
}

/// The placement policy of a pool.
fn placer_for(_pool: &Pool) -> Box<dyn Placer> {
    Box::new(FirstFit)
}

/// The attributes IAM sees for a request.
fn attributes(request: &CreateRequest, r: &Reservation, region: &str) -> Attributes {
    let duration_ms = r.end_ms - r.start_ms;
    Attributes {
        gpu_model: request.gpu_model().unwrap_or_default().to_string(),
        gpu_count: request.gpu_count(),
        duration_hours: (duration_ms + 3_599_999) / 3_600_000,
        region: region.to_string(),
        vcpu: r.resources.vcpu,
        memory_gib: r.resources.memory_gib + r.resources.hugepages_1gi,
        pool_id: r.pool_id.clone(),
        spot: r.spot,
    }
}

/// The pool `tenant` may book into: owned by or offered to it, not archived.
async fn bookable_pool(
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

/// Checks the request against what the pool is: its device classes, sharing mode and
/// bindings.
fn check_against_pool(
    request: &CreateRequest,
    binding: Binding,
    pool: &Pool,
    snapshot: &Snapshot,
) -> Result<()> {
    for (i, device) in request.devices.iter().enumerate() {
        let offered = snapshot
            .nodes
            .iter()
            .flat_map(|n| &n.units)
            .any(|u| u.device_class == device.class);
        if !offered {
            return Err(Error::invalid(
                format!("devices[{i}].class"),
                format!("the pool has no {} devices", device.class.as_str()),
            ));
        }
        if let Some(sharing) = device.sharing {
            if sharing != pool.policy.sharing {
                return Err(Error::invalid(
                    format!("devices[{i}].sharing"),
                    "does not match the pool's sharing mode",
                ));
            }
        }
    }
    match binding {
        Binding::Hold => {}
        Binding::Node if !pool.policy.tenant_root => {
            return Err(Error::invalid(
                "binding",
                "the pool does not hand nodes to tenants (policy.tenantRoot)",
            ));
        }
        Binding::Node if request.resources.is_some() => {
            return Err(Error::invalid(
                "resources",
                "a node binding takes the whole node; do not ask for resources",
            ));
        }
        Binding::Kubernetes if !pool.policy.kubernetes => {
            return Err(Error::invalid(
                "binding",
                "the pool is not a Kubernetes pool (policy.kubernetes)",
            ));
        }
        Binding::Kubernetes if request.tenant_id != pool.owner_org_id => {
            return Err(Error::invalid(
                "binding",
                "only the cluster's owner books kubernetes bindings into it",
            ));
        }
        Binding::Node | Binding::Kubernetes => {
            return Err(Error::Unsupported(
                "node and kubernetes bindings are not served by this release".into(),
            ));
        }
    }
    if request.gang.is_some() {
        return Err(Error::Unsupported(
            "gangs are not served by this release".into(),
        ));
    }
    Ok(())
}

/// `create`: books devices of one pool for a window after one IAM decision on the draft.
pub async fn create(
    app: &App,
    caller: &Principal,
    request: CreateRequest,
) -> Result<ComputeReservation> {
    request.validate()?;
    let binding = request.binding()?;
    if !(caller.has(Permission::ComputeCreate) && caller.acts_for(&request.tenant_id)) {
        return Err(Error::not_found(format_args!("pool {}", request.pool_id)));
    }
    let id = reservation_id(&request.tenant_id, &caller.key_id, &request.idempotency_key);
    let wait_ms = request.wait.map_or(0, |w| w.timeout_ms);
    let reservation = decide_and_place(app, caller, &id, request, binding).await?;
    let reservation = if wait_ms > 0 && reservation.state == State::Pending {
        wait_while_pending(app, &id, wait_ms).await?
    } else {
        reservation
    };
    Ok(reservation.view())
}

/// What the database says before a create decides: the stored reservation under this id,
/// the pool and the tenant's offer, the pool's nodes, the tenant's policy.
struct Context {
    existing: Option<Reservation>,
    confirmation: Option<String>,
    pool: Pool,
    offer: Option<Offer>,
    snapshot: Snapshot,
    policy: Option<String>,
}

async fn read_context(app: &App, id: &str, request: &CreateRequest, now: i64) -> Result<Context> {
    let mut conn = app.store.pool().acquire().await?;
    let existing = store::find(&mut conn, id, "").await?;
    let confirmation = match &existing {
        Some(r) if r.state == State::AwaitingConfirmation => {
            Some(confirmation_state(&mut conn, r).await?)
        }
        _ => None,
    };
    let (pool, offer) = bookable_pool(&mut conn, &request.pool_id, &request.tenant_id).await?;
    let snapshot = Snapshot::load(&mut conn, &pool.node_ids, id, now, now, now).await?;
    let policy = policy::find(&mut conn, &request.tenant_id).await?;
    Ok(Context {
        existing,
        confirmation,
        pool,
        offer,
        snapshot,
        policy,
    })
}

async fn decide_and_place(
    app: &App,
    caller: &Principal,
    id: &str,
    request: CreateRequest,
    binding: Binding,
) -> Result<Reservation> {
    let now = app.now_ms();
    // Reads happen on a connection that is given back before any write transaction begins,
    // so concurrent creates never hold one connection while waiting for another.
    let replay = {
        let mut conn = app.store.pool().acquire().await?;
        store::find(&mut conn, id, "").await?
    };
    let mut confirmed = false;
    if let Some(existing) = &replay {
        if existing.request.fingerprint() != request.fingerprint() {
            return Err(Error::conflict(
                "this idempotencyKey was used for a different request",
                Some(json!({ "reservationId": id })),
            ));
        }
        match existing.state {
            State::Denied => return Err(Error::AccessDenied("the request was refused".into())),
            State::Draft | State::AwaitingConfirmation => {}
            _ => return Ok(existing.clone()),
        }
    }
    let Context {
        existing,
        confirmation,
        pool,
        offer,
        snapshot,
        policy: policy_text,
    } = read_context(app, id, &request, now).await?;
    if let Some(existing) = &existing {
        if existing.state == State::AwaitingConfirmation {
            match confirmation.as_deref() {
                Some("approved") => confirmed = true,
                Some("pending") => return Err(confirmation_required(existing)),
                _ => {
                    let mut denied = existing.clone();
                    finish_draft(app, caller, &mut denied, "confirmation-denied").await?;
                    return Err(Error::AccessDenied(
                        "the confirmation request was denied or expired".into(),
                    ));
                }
            }
        }
    }
    check_against_pool(&request, binding, &pool, &snapshot)?;
    let mut draft = match existing {
        Some(existing) => existing,
        None => {
            let draft = new_draft(caller, id, &request, binding, &pool, &snapshot, now)?;
            let mut tx = app.store.begin().await?;
            match store::insert(&mut tx, &draft).await {
                Ok(()) => {
                    let entry = Entry {
                        org_id: &draft.tenant_id,
                        action: "compute-reservation.draft",
                        object_type: "compute-reservation",
                        object_id: id,
                        reason: None,
                        details: Some(json!({ "request": draft.request })),
                    };
                    audit::record(&mut tx, caller, entry, now).await?;
                    tx.commit().await?;
                }
                Err(err) if crate::store::is_unique_violation(&err) => {
                    // A concurrent create with the same key won: answer as a replay.
                    drop(tx);
                    return Box::pin(decide_and_place(app, caller, id, request, binding)).await;
                }
                Err(err) => return Err(err.into()),
            }
            draft
        }
    };
    let region = snapshot
        .nodes
        .iter()
        .find_map(|n| n.region.clone())
        .unwrap_or_default();
    let attrs = attributes(&request, &draft, &region);
    if !confirmed {
        match policy::decide(
            policy_text.as_deref(),
            caller,
            CREATE,
            (id, &request.tenant_id),
            &attrs,
        )? {
            Decision::Allow => {}
            Decision::Deny => {
                finish_draft(app, caller, &mut draft, "access-denied").await?;
                return Err(Error::AccessDenied(format!(
                    "IAM refused {CREATE} on this request"
                )));
            }
            Decision::NeedsConfirmation => {
                let attrs_json = serde_json::to_value(&attrs).expect("attributes serialize");
                let mut tx = app.store.begin().await?;
                let confirmation =
                    confirmations::open(&mut tx, caller, id, CREATE, &attrs_json, now).await?;
                let expected = draft.state;
                draft.state = State::AwaitingConfirmation;
                draft.confirmation_id = Some(confirmation.id.clone());
                draft.updated_at = now;
                if store::update(&mut tx, &draft, expected).await? {
                    emit(
                        &mut tx,
                        &draft,
                        "reservation.awaiting-confirmation",
                        json!({ "confirmationId": confirmation.id }),
                    )
                    .await?;
                    tx.commit().await?;
                }
                return Err(confirmation_required(&draft));
            }
        }
    }
    charge_and_place(app, caller, &pool, offer.as_ref(), draft).await
}

fn confirmation_required(r: &Reservation) -> Error {
    Error::ConfirmationRequired {
        message: "a person of the tenant must approve this request; retry with the same idempotencyKey after approval".into(),
        details: json!({ "reservationId": r.id, "confirmationId": r.confirmation_id }),
    }
}

async fn confirmation_state(conn: &mut AnyConnection, r: &Reservation) -> Result<String> {
    let Some(id) = &r.confirmation_id else {
        return Ok("pending".into());
    };
    Ok(confirmations::find(conn, id)
        .await?
        .map_or_else(|| "expired".into(), |c| c.state))
}

fn new_draft(
    caller: &Principal,
    id: &str,
    request: &CreateRequest,
    binding: Binding,
    pool: &Pool,
    snapshot: &Snapshot,
    now: i64,
) -> Result<Reservation> {
    let start = request.start.unwrap_or(now).max(now);
    let duration = request.duration.to_ms("duration")?;
    let gpu_hosts: Vec<(i64, i64, i64)> = snapshot
        .nodes
        .iter()
        .map(|n| {
            (
                n.host.vcpu,
                n.host.memory_gib,
                n.units
                    .iter()
                    .filter(|u| u.device_class == crate::inventory::DeviceClass::Gpu)
                    .count() as i64,
            )
        })
        .collect();
    let (resources, _) = host_resources(
        request.gpu_count(),
        per_gpu_share(&pool.policy, &gpu_hosts),
        request.resources,
    );
    let mut stored = request.clone();
    stored.wait = None;
    Ok(Reservation {
        id: id.to_string(),
        tenant_id: request.tenant_id.clone(),
        pool_id: request.pool_id.clone(),
        project_id: request.project_id.clone(),
        caller_key_id: caller.key_id.clone(),
        idempotency_key: request.idempotency_key.clone(),
        request: stored,
        state: State::Draft,
        spot: request.is_spot(),
        binding,
        start_ms: start,
        end_ms: start.saturating_add(duration),
        lease_seconds: request.lease_seconds,
        lease_deadline_ms: None,
        resources,
        charge: None,
        conditions: Vec::new(),
        reason: None,
        node_id: None,
        placed_by: None,
        confirmation_id: None,
        extend_started_ms: None,
        next_attempt_ms: None,
        created_at: now,
        updated_at: now,
        unit_ids: Vec::new(),
    })
}

/// Moves a refused draft to `denied`, audited; the same key stays refused.
async fn finish_draft(
    app: &App,
    caller: &Principal,
    draft: &mut Reservation,
    reason: &str,
) -> Result<()> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let expected = draft.state;
    draft.state = State::Denied;
    draft.reason = Some(reason.to_string());
    draft.updated_at = now;
    if store::update(&mut tx, draft, expected).await? {
        let entry = Entry {
            org_id: &draft.tenant_id,
            action: "compute-reservation.deny",
            object_type: "compute-reservation",
            object_id: &draft.id,
            reason: Some(reason),
            details: None,
        };
        audit::record(&mut tx, caller, entry, now).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// The spend-guard: when the pool or the offer asks for a budget check, the tenant's
/// booked GPU time in the pool plus this request must fit the offer's budget.
async fn check_budget(
    conn: &mut AnyConnection,
    pool: &Pool,
    offer: Option<&Offer>,
    r: &Reservation,
) -> Result<()> {
    let Some(offer) = offer else { return Ok(()) };
    if !(pool.policy.budget_check || offer.budget.is_some()) {
        return Ok(());
    }
    let (Some(budget), Some(price)) = (offer.budget, offer.price_per_gpu_hour) else {
        return Ok(());
    };
    let booked_gpu_ms: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(SUM(b.end_ms - b.start_ms) AS BIGINT) FROM bookings b JOIN compute_reservations r ON r.id = b.reservation_id
         WHERE r.tenant_id = $1 AND r.pool_id = $2 AND r.id <> $3",
    )
    .bind(&r.tenant_id)
    .bind(&r.pool_id)
    .bind(&r.id)
    .fetch_one(&mut *conn)
    .await?;
    let spent = cost_minor(1, booked_gpu_ms.unwrap_or(0), price);
    let charge = cost_minor(r.request.gpu_count(), r.end_ms - r.start_ms, price);
    if spent + charge > budget {
        return Err(Error::SpendLimitReached(format!(
            "the charge of {charge} would exceed the budget: {spent} of {budget} already booked"
        )));
    }
    Ok(())
}

/// Charges quota and places, in one transaction: `placed`, or `pending` (`Unschedulable` or
/// `Queued`). A charge that does not fit is `QUOTA_EXCEEDED` and leaves the draft.
async fn charge_and_place(
    app: &App,
    caller: &Principal,
    pool: &Pool,
    offer: Option<&Offer>,
    mut r: Reservation,
) -> Result<Reservation> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    lock_pool(app, &mut tx, &pool.id).await?;
    let current = store::find(&mut tx, &r.id, app.store.for_update())
        .await?
        .ok_or_else(|| not_found(&r.id))?;
    if !current.state.is_draft() {
        return Ok(current);
    }
    let expected = current.state;
    check_budget(&mut tx, pool, offer, &r).await?;
    let charge = charge_of(&r, pool, &mut tx).await?;
    let limits = offer.map(|o| o.quota.clone()).unwrap_or_default();
    if let Some(resource) =
        store::apply_charge(&mut tx, &r.pool_id, &r.tenant_id, &charge, 1, Some(&limits)).await?
    {
        drop(tx);
        let mut conn = app.store.pool().acquire().await?;
        let used = crate::pools::store::quota_used(&mut conn, &r.pool_id, &r.tenant_id).await?;
        return Err(Error::QuotaExceeded {
            message: format!(
                "the request needs {} {resource} but the quota leaves {}",
                charge[&resource],
                limits.get(&resource).copied().unwrap_or(0)
                    - used.get(&resource).copied().unwrap_or(0)
            ),
            details: json!({ "resource": resource, "requested": charge[&resource], "limit": limits.get(&resource).copied().unwrap_or(0), "used": used.get(&resource).copied().unwrap_or(0) }),
        });
    }
    r.charge = Some(charge);
    r.confirmation_id = current.confirmation_id.clone().or(r.confirmation_id);
    let placed = try_place(&mut tx, pool, &mut r, now).await?;
    r.updated_at = now;
    if !store::update(&mut tx, &r, expected).await? {
        return Err(Error::conflict(
            "the reservation changed concurrently; retry",
            Some(json!({ "reservationId": r.id })),
        ));
    }
    let entry = Entry {
        org_id: &r.tenant_id,
        action: "compute-reservation.create",
        object_type: "compute-reservation",
        object_id: &r.id,
        reason: None,
        details: Some(json!({ "state": r.state, "charge": r.charge })),
    };
    audit::record(&mut tx, caller, entry, now).await?;
    emit_placement(&mut tx, &r, placed, pool).await?;
    tx.commit().await?;
    Ok(r)
}

/// What the reservation charges to quota: its devices, and host resources above the
/// pool's per-GPU share.
async fn charge_of(
    r: &Reservation,
    pool: &Pool,
    conn: &mut AnyConnection,
) -> Result<BTreeMap<String, i64>> {
    let snapshot = Snapshot::load(
        conn,
        &pool.node_ids,
        &r.id,
        r.start_ms,
        r.start_ms,
        r.start_ms,
    )
    .await?;
    let gpu_hosts: Vec<(i64, i64, i64)> = snapshot
        .nodes
        .iter()
        .map(|n| {
            (
                n.host.vcpu,
                n.host.memory_gib,
                n.units
                    .iter()
                    .filter(|u| u.device_class == crate::inventory::DeviceClass::Gpu)
                    .count() as i64,
            )
        })
        .collect();
    let (_, excess) = host_resources(
        r.request.gpu_count(),
        per_gpu_share(&pool.policy, &gpu_hosts),
        r.request.resources,
    );
    Ok(quota_charge(&r.request, excess))
}

async fn lock_pool(app: &App, conn: &mut AnyConnection, pool_id: &str) -> Result<()> {
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
async fn try_place(
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
    let snapshot = Snapshot::load(conn, &pool.node_ids, &r.id, r.start_ms, r.end_ms, now).await?;
    let (request, nodes, index) = snapshot.candidates(r);
    let placer = placer_for(pool);
    let choice = placer.place(&request, &nodes).and_then(|choice: Choice| {
        check_choice(&request, &nodes, &choice)
            .map_err(|e| format!("placer {} answered badly: {e}", placer.id()))?;
        Ok(choice)
    });
    let choice = match choice {
        Ok(choice) => choice,
        Err(reason) => {
            mark_pending(r, queued, reason, now);
            return Ok(false);
        }
    };
    let (node_index, _) = index[choice.units[0] as usize];
    let node = &snapshot.nodes[node_index];
    let units: Vec<String> = choice
        .units
        .iter()
        .map(|u| node.units[index[*u as usize].1].id.clone())
        .collect();
    let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
    r.state = State::Placed;
    match store::insert_bookings(&mut savepoint, r, &node.id, &units).await {
        Ok(()) => savepoint.commit().await?,
        Err(err) if violates(&err, "bookings_no_overlap") => {
            savepoint.rollback().await?;
            mark_pending(
                r,
                queued,
                "the chosen units were booked concurrently".into(),
                now,
            );
            return Ok(false);
        }
        Err(err) => return Err(err.into()),
    }
    r.node_id = Some(node.id.clone());
    r.unit_ids = units;
    r.placed_by = Some(placer.id());
    r.next_attempt_ms = None;
    r.clear_condition("Unschedulable");
    r.clear_condition("Queued");
    if let Some(lease) = r.lease_seconds {
        r.lease_deadline_ms = Some(now + lease * 1000);
    }
    Ok(true)
}

fn mark_pending(r: &mut Reservation, queued: bool, message: String, now: i64) {
    r.state = State::Pending;
    if queued {
        r.set_condition("Queued", "WaitingForCapacity", message, now);
        r.next_attempt_ms = None;
    } else {
        r.set_condition("Unschedulable", "NoFit", message, now);
        r.next_attempt_ms = Some(now + RETRY_AFTER_MS);
    }
}

async fn older_pending_exists(conn: &mut AnyConnection, r: &Reservation) -> Result<bool> {
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

async fn emit_placement(
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

async fn emit(
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

async fn wait_while_pending(app: &App, id: &str, wait_ms: i64) -> Result<Reservation> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms as u64);
    loop {
        let mut conn = app.store.pool().acquire().await?;
        let r = store::find(&mut conn, id, "")
            .await?
            .ok_or_else(|| not_found(id))?;
        if r.state != State::Pending || tokio::time::Instant::now() >= deadline {
            return Ok(r);
        }
        drop(conn);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Ends `r` in a terminal `state`: its bookings are released at `now`, its quota refunded
/// (once: the charge is cleared with it), and its event emitted. Returns false when another
/// writer moved it first.
pub async fn terminate(
    conn: &mut AnyConnection,
    r: &mut Reservation,
    state: State,
    reason: &str,
    now: i64,
) -> Result<bool> {
    let expected = r.state;
    store::release_bookings(conn, &r.id, now).await?;
    if let Some(charge) = r.charge.take() {
        store::apply_charge(conn, &r.pool_id, &r.tenant_id, &charge, -1, None).await?;
    }
    r.state = state;
    r.reason = Some(reason.to_string());
    r.lease_deadline_ms = None;
    r.next_attempt_ms = None;
    r.extend_started_ms = None;
    r.updated_at = now;
    if !store::update(conn, r, expected).await? {
        return Ok(false);
    }
    let kind = match state {
        State::Cancelled => "reservation.cancelled",
        State::Released => "reservation.released",
        State::Failed => "reservation.failed",
        _ => "reservation.expired",
    };
    emit(conn, r, kind, json!({ "reason": reason })).await?;
    Ok(true)
}

/// Loads a reservation of `tenant` for a method that needs `permission`; callers decide
/// what a draft means to them.
async fn authorized(
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
    Ok(r.view())
}

/// Input of `list`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    pub tenant_id: String,
    #[serde(default)]
    pub scope: Option<Scope>,
    #[serde(default)]
    pub state: Option<State>,
    #[serde(default)]
    pub pool_id: Option<String>,
    #[serde(default)]
    pub limit: Option<i64>,
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Mine,
    All,
}

/// A page of reservations.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReservationPage {
    pub items: Vec<ComputeReservation>,
    /// The id to pass as `cursor` for the next page, while more remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `list`: the tenant's reservations newest first, drafts skipped; `scope: all` checks each
/// one as `compute:reservations:read`.
pub async fn list(app: &App, caller: &Principal, input: ListInput) -> Result<ReservationPage> {
    check_tenant_id(&input.tenant_id)?;
    if let Some(pool) = &input.pool_id {
        super::check_pool_id(pool)?;
    }
    if let Some(cursor) = &input.cursor {
        check_reservation_id("cursor", cursor)?;
    }
    let limit = input.limit.unwrap_or(50);
    crate::validation::range("limit", limit, 1, 200)?;
    if !(caller.has(Permission::ComputeRead) && caller.acts_for(&input.tenant_id)) {
        return Err(Error::not_found(format_args!("tenant {}", input.tenant_id)));
    }
    let scope = input.scope.unwrap_or(Scope::Mine);
    let mut conn = app.store.pool().acquire().await?;
    let mine = (scope == Scope::Mine).then_some(caller.key_id.as_str());
    let policy_text = policy::find(&mut conn, &input.tenant_id).await?;
    let mut items = Vec::new();
    let mut cursor = input.cursor.clone();
    // Items the read decision refuses are skipped, so fetch until the page is full.
    loop {
        let batch = store::page(
            &mut conn,
            &input.tenant_id,
            input.state,
            input.pool_id.as_deref(),
            mine,
            cursor.as_deref(),
            limit + 1,
        )
        .await?;
        let exhausted = batch.len() as i64 <= limit;
        for r in batch.into_iter().take(limit as usize) {
            cursor = Some(r.id.clone());
            let allowed = scope == Scope::Mine || {
                let attrs = attributes(&r.request, &r, "");
                policy::decide(
                    policy_text.as_deref(),
                    caller,
                    READ,
                    (&r.id, &r.tenant_id),
                    &attrs,
                )? == Decision::Allow
            };
            if allowed {
                items.push(r.view());
                if items.len() as i64 == limit {
                    break;
                }
            }
        }
        if exhausted || items.len() as i64 == limit {
            let more = !exhausted
                || items.len() as i64 == limit && {
                    let next = store::page(
                        &mut conn,
                        &input.tenant_id,
                        input.state,
                        input.pool_id.as_deref(),
                        mine,
                        items.last().map(|i| i.id.as_str()),
                        1,
                    )
                    .await?;
                    !next.is_empty()
                };
            let cursor = if more {
                items.last().map(|i| i.id.clone())
            } else {
                None
            };
            return Ok(ReservationPage { items, cursor });
        }
    }
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
    terminate(&mut tx, &mut r, state, "release", now).await?;
    audit_method(&mut tx, caller, &r, "compute-reservation.release", now).await?;
    tx.commit().await?;
    crate::reconciler::wake_pool(app, &r.pool_id).await?;
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
    terminate(&mut tx, &mut r, State::Cancelled, "cancel", now).await?;
    audit_method(&mut tx, caller, &r, "compute-reservation.cancel", now).await?;
    tx.commit().await?;
    crate::reconciler::wake_pool(app, &r.pool_id).await?;
    Ok(r.view())
}

async fn audit_method(
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
            current.updated_at = app.now_ms();
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
        .or_else(|_| -> Result<_> { Err(not_found(&r.id)) })?;
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
    check_budget(&mut conn, &pool, offer.as_ref(), &extra).await?;
    if let Some(node) = &r.node_id {
        if let Some(blocked_at) =
            store::next_booking_start(&mut conn, &r.id, node, &r.unit_ids, r.end_ms, new_end)
                .await?
        {
            return Err(Error::conflict(
                "a later booking blocks",
                Some(json!({ "availableUntil": blocked_at })),
            ));
        }
    }
    Ok(Some(new_end))
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
    let state = r.state;
    r.lease_deadline_ms = Some(now + lease * 1000);
    r.updated_at = now;
    store::update(&mut tx, &r, state).await?;
    tx.commit().await?;
    Ok(r.view())
}

/// Retries placing a pending reservation (the reconciler's and the wake-up's path).
pub async fn retry(app: &App, id: &str) -> Result<bool> {
    let now = app.now_ms();
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
    let before = r.conditions.clone();
    let placed = try_place(&mut tx, &pool, &mut r, now).await?;
    if !placed
        && r.conditions
            .iter()
            .map(|c| (&c.kind, &c.message))
            .eq(before.iter().map(|c| (&c.kind, &c.message)))
    {
        // Still waiting for the same reason: only the next attempt moves.
        r.conditions = before;
    }
    r.updated_at = now;
    if store::update(&mut tx, &r, State::Pending).await? && placed {
        emit(&mut tx, &r, "reservation.placed", json!({})).await?;
    }
    tx.commit().await?;
    Ok(placed)
}
