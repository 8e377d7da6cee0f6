//! `create`: the draft, the one IAM decision on it (with confirmation for agents), the
//! spend-guard, and quota charged together with placement.

use serde_json::json;
use sqlx::{AnyConnection, Row as _};

use super::engine::{
    CREATE, Laying, attributes, bookable_pool, emit, not_found, placement_event, push_event,
};
use super::group::Writer;
use super::place;
use super::store::{self, ComputeReservation, Reservation};
use std::collections::BTreeMap;
use std::time::Duration;

use super::placement::Snapshot;
use super::{
    Binding, CreateRequest, State, cost_minor, host_resources, quota_charge, reservation_id,
};
use crate::audit::{self, Entry};
use crate::capacity::Since;
use crate::iam::confirmations;
use crate::iam::policy::{self, Decision};
use crate::iam::{Permission, Principal};
use crate::pools::store::{Offer, Pool};
use crate::settings::Version;
use crate::store::{Backend, Batch, is_unique_violation, violates};
use crate::{App, Error, Result};

/// Checks the request against what the pool is: its device classes, sharing mode and
/// bindings.
pub(super) fn check_against_pool(
    request: &CreateRequest,
    binding: Binding,
    pool: &Pool,
    snapshot: &Snapshot,
) -> Result<()> {
    for (i, device) in request.devices.iter().enumerate() {
        let offered = snapshot
            .nodes()
            .flat_map(|n| &n.units)
            .any(|u| u.device_class == device.class);
        if !offered {
            return Err(Error::invalid(
                format!("devices[{i}].class"),
                format!("the pool has no {} devices", device.class.as_str()),
            ));
        }
        if let Some(sharing) = device.sharing
            && sharing != pool.policy.sharing
        {
            return Err(Error::invalid(
                format!("devices[{i}].sharing"),
                "does not match the pool's sharing mode",
            ));
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
        Binding::Node | Binding::Kubernetes => {}
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

/// `CONFLICT` when the key of the stored reservation `existing` was used for another request.
pub(super) fn check_replay(existing: &Reservation, request: &CreateRequest) -> Result<()> {
    if existing.request.fingerprint() != request.fingerprint() {
        return Err(Error::conflict(
            "this idempotencyKey was used for a different request",
            Some(json!({ "reservationId": existing.id })),
        ));
    }
    Ok(())
}

/// What the database says before a create decides: the stored reservation under this id,
/// the pool and the tenant's offer, the pool's nodes (their inventory), the tenant's policy.
pub(super) struct Context {
    pub existing: Option<Reservation>,
    /// The state of the confirmation an awaiting reservation waits for.
    pub confirmation: Option<String>,
    pub at: Version,
    pub pool: Pool,
    pub offer: Option<Offer>,
    pub snapshot: Snapshot,
    pub policy: Option<String>,
}

pub(super) async fn read_context(
    app: &App,
    existing: Option<Reservation>,
    request: &CreateRequest,
) -> Result<Context> {
    let mut conn = app.store.pool().acquire().await?;
    let confirmation = match &existing {
        Some(r) if r.state == State::AwaitingConfirmation => {
            Some(confirmation_state(&mut conn, r).await?)
        }
        _ => None,
    };
    let at = app.settings.version(&mut conn).await?;
    let (pool, offer) =
        bookable_pool(app, &mut conn, at, &request.pool_id, &request.tenant_id).await?;
    let policy = app
        .settings
        .policy(&mut conn, at, &request.tenant_id)
        .await?;
    drop(conn);
    let snapshot = Snapshot::inventory(app, &pool.id).await?;
    Ok(Context {
        existing,
        confirmation,
        at,
        pool,
        offer,
        snapshot,
        policy,
    })
}

/// Decides and places ([`decide_once`]) until there is an answer. A create that finds its
/// id taken by a concurrent create with the same key decides again once the group it wrote
/// in has committed (the other create may be in it), and answers as a replay of that one.
/// Racing creates with one key may still go round several times while the other commits
/// on another replica, so this is a loop, not a recursion whose depth they would choose.
async fn decide_and_place(
    app: &App,
    caller: &Principal,
    id: &str,
    request: CreateRequest,
    binding: Binding,
) -> Result<Reservation> {
    loop {
        if let Some(r) = decide_once(app, caller, id, &request, binding).await? {
            return Ok(r);
        }
        app.placements.settled().await;
    }
}

/// One decision and placement; `None` when a concurrent create with the same key stored its
/// reservation first.
async fn decide_once(
    app: &App,
    caller: &Principal,
    id: &str,
    request: &CreateRequest,
    binding: Binding,
) -> Result<Option<Reservation>> {
    let now = app.now_ms();
    // Reads happen on a connection that is given back before any write transaction begins,
    // so concurrent creates never hold one connection while waiting for another.
    let replay = {
        let mut conn = app.store.pool().acquire().await?;
        store::find(&mut conn, id, "").await?
    };
    let mut confirmed = false;
    if let Some(existing) = &replay {
        check_replay(existing, request)?;
        match existing.state {
            State::Denied => return Err(Error::AccessDenied("the request was refused".into())),
            State::Draft | State::AwaitingConfirmation => {}
            _ => return Ok(Some(existing.clone())),
        }
    }
    let Context {
        existing,
        confirmation,
        at,
        pool,
        offer,
        snapshot,
        policy: policy_text,
    } = read_context(app, replay, request).await?;
    if let Some(existing) = &existing
        && existing.state == State::AwaitingConfirmation
    {
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
    check_against_pool(request, binding, &pool, &snapshot)?;
    let share = snapshot.per_gpu_share(&pool.policy);
    let (mut draft, stored) = match existing {
        Some(existing) => (existing, true),
        None => (new_draft(caller, id, request, binding, share, now)?, false),
    };
    let region = snapshot
        .nodes()
        .find_map(|n| n.region.clone())
        .unwrap_or_default();
    // Let go of the pool's node list: while a create holds it, every change to a node of
    // the pool copies that node's part of the list instead of patching it in place.
    drop(snapshot);
    let attrs = attributes(request, &draft, &region);
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
                if !stored && !store_draft(app, caller, &draft).await? {
                    return Ok(None);
                }
                finish_draft(app, caller, &mut draft, "access-denied").await?;
                return Err(Error::AccessDenied(format!(
                    "IAM refused {CREATE} on this request"
                )));
            }
            Decision::NeedsConfirmation => {
                if !stored && !store_draft(app, caller, &draft).await? {
                    return Ok(None);
                }
                let attrs_json = serde_json::to_value(&attrs).expect("attributes serialize");
                let mut tx = app.store.begin().await?;
                let confirmation =
                    confirmations::open(&mut tx, caller, id, CREATE, &attrs_json, now).await?;
                draft.state = State::AwaitingConfirmation;
                draft.confirmation_id = Some(confirmation.id.clone());
                draft.operate("create", now);
                if store::update(&mut tx, &mut draft).await? {
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
    // Quota: the devices, and host resources above the pool's per-GPU share.
    let (_, excess) = host_resources(request.gpu_count(), share, request.resources);
    let charge = quota_charge(request, excess);
    let placing = Placing {
        caller,
        pool: (&pool, at),
        offer: offer.as_ref(),
        stored,
    };
    match charge_and_place(app, placing, draft.clone(), charge).await {
        // `None`: a concurrent create with the same key stored it first.
        Ok(placed) => Ok(placed),
        Err(err) => {
            // The draft stays (QUOTA_EXCEEDED, SPEND_LIMIT_REACHED, a failed policy), so the
            // same key can be retried.
            if !stored {
                store_draft(app, caller, &draft).await?;
            }
            Err(err)
        }
    }
}

/// Stores a new draft, audited; `false` when a concurrent create with the same key stored
/// it first.
async fn store_draft(app: &App, caller: &Principal, draft: &Reservation) -> Result<bool> {
    let mut tx = app.store.begin().await?;
    let mut batch = Batch::on(&tx);
    push_draft(&mut batch, caller, draft);
    if insert_draft(app, &mut tx, batch).await?.is_none() {
        tx.rollback().await?;
        return Ok(false);
    }
    tx.commit().await?;
    Ok(true)
}

/// Runs `batch`, which inserts a new draft ([`push_draft`]) (and may then take locks), and
/// reads where the capacity feed stands for this transaction
/// ([`crate::capacity::View::since`]), in one round trip; `None` when the id exists: the
/// caller rolls back (the entry was written).
async fn insert_draft(app: &App, conn: &mut AnyConnection, batch: Batch) -> Result<Option<Since>> {
    let (rows, since) = batch.execute_then(conn, app.capacity.since_sql()).await?;
    Ok((rows[..DRAFT_ROWS.len()] == DRAFT_ROWS).then(|| app.capacity.since_of(since)))
}

/// How many rows [`push_draft`]'s statements change when the id is new.
const DRAFT_ROWS: [u64; 2] = [1, 1];

/// Adds the insert of a new draft, with its audit entry, to `batch`.
fn push_draft(batch: &mut Batch, caller: &Principal, draft: &Reservation) {
    store::push_insert(batch, draft);
    let entry = Entry {
        org_id: &draft.tenant_id,
        action: "compute-reservation.draft",
        object_type: "compute-reservation",
        object_id: &draft.id,
        reason: None,
        details: Some(json!({ "request": draft.request })),
    };
    audit::push(batch, caller, entry, draft.created_at);
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

pub(crate) fn new_draft(
    caller: &Principal,
    id: &str,
    request: &CreateRequest,
    binding: Binding,
    share: Option<crate::pools::PerGpu>,
    now: i64,
) -> Result<Reservation> {
    let start = request.start.unwrap_or(now).max(now);
    let duration = request.duration.to_ms("duration")?;
    let (resources, _) = host_resources(request.gpu_count(), share, request.resources);
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
        operation: Some(super::store::Operation {
            name: "create".into(),
            at: now,
        }),
        created_at: now,
        updated_at: now,
        version: 0,
        unit_ids: Vec::new(),
        members: Vec::new(),
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
    draft.state = State::Denied;
    draft.reason = Some(reason.to_string());
    draft.operate("create", now);
    if store::update(&mut tx, draft).await? {
        emit(
            &mut tx,
            draft,
            "reservation.denied",
            json!({ "reason": reason }),
        )
        .await?;
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

/// What the spend-guard decides on: the charge, and the tenant's budget with what it has
/// spent and has booked in the pool.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Spending {
    charge: orl_spend_guard_default::Charge,
    budget: orl_spend_guard_default::Budget,
}

/// What the spend-guard decides on for `r`, read on `conn`; `None` when neither the pool
/// nor the offer asks for a budget check.
pub(super) async fn spending(
    app: &App,
    conn: &mut AnyConnection,
    pool: &Pool,
    offer: Option<&Offer>,
    r: &Reservation,
) -> Result<Option<Spending>> {
    let Some(offer) = offer else { return Ok(None) };
    if !(pool.policy.budget_check || offer.budget.is_some()) {
        return Ok(None);
    }
    let (Some(limit), Some(price)) = (offer.budget, offer.price_per_gpu_hour) else {
        return Ok(None);
    };
    let now = app.now_ms();
    let row = sqlx::query(
        "SELECT CAST(SUM(CASE WHEN b.end_ms <= $1 THEN b.end_ms - b.start_ms WHEN b.start_ms >= $1 THEN 0
                             ELSE $1 - b.start_ms END) AS BIGINT) AS elapsed,
                CAST(SUM(b.end_ms - b.start_ms) AS BIGINT) AS booked
         FROM bookings b JOIN compute_reservations r ON r.id = b.reservation_id
         WHERE r.tenant_id = $2 AND r.pool_id = $3 AND r.id <> $4",
    )
    .bind(now)
    .bind(&r.tenant_id)
    .bind(&r.pool_id)
    .bind(&r.id)
    .fetch_one(&mut *conn)
    .await?;
    let elapsed: i64 = row.get::<Option<i64>, _>("elapsed").unwrap_or(0);
    let booked: i64 = row.get::<Option<i64>, _>("booked").unwrap_or(0);
    Ok(Some(Spending {
        charge: orl_spend_guard_default::Charge {
            amount_minor: cost_minor(r.request.total_gpu_count(), r.end_ms - r.start_ms, price),
            gpu_count: r.request.total_gpu_count().clamp(0, i64::from(u32::MAX)) as u32,
            duration_seconds: ((r.end_ms - r.start_ms) / 1000).max(0) as u64,
            price_per_gpu_hour_minor: price,
        },
        budget: orl_spend_guard_default::Budget {
            limit_minor: limit,
            spent_minor: cost_minor(1, elapsed, price),
            committed_minor: cost_minor(1, booked - elapsed, price),
        },
    }))
}

/// The spend-guard: the pool's spend-guard policy (a WebAssembly component; the built-in
/// one refuses what the remaining budget cannot cover) decides on `spending`.
pub(super) async fn judge_spending(
    app: &App,
    conn: &mut AnyConnection,
    (pool, at): (&Pool, Version),
    spending: &Spending,
) -> Result<()> {
    let Spending { charge, budget } = spending;
    let world = crate::policy::World::SpendGuard;
    let guard = crate::policy::assignment::resolve(app, conn, at, &pool.id, world).await?;
    let decide = async |loaded: &crate::policy::Loaded, config: Option<&serde_json::Value>| {
        let started = std::time::Instant::now();
        let outcome = (app.policy)
            .spend(loaded, charge, budget, config, guard.deadline_ms)
            .await;
        let label = match &outcome {
            Ok(Ok(())) => "allowed",
            Ok(Err(_)) => "refused",
            Err(failure) => {
                let kind = failure.kind.as_str();
                app.metrics
                    .observe_policy_failure(&loaded.id, "spend-guard", kind);
                kind
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        app.metrics
            .observe_decision(&loaded.id, "spend-guard", label, seconds);
        outcome
    };
    // On a failure with `fallback`, the built-in component decides (with no config).
    let outcome = match decide(&guard.loaded, guard.config.as_ref()).await {
        Err(failure) if guard.fallback => {
            tracing::warn!(plugin = %failure.plugin_id, kind = failure.kind.as_str(), message = %failure.message, "spend-guard plugin failed; using the built-in default");
            let default = (app.policy.default_for(world))
                .ok_or_else(|| anyhow::anyhow!("no built-in spend-guard"))?;
            decide(&default, None).await
        }
        outcome => outcome,
    };
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(reason)) => Err(Error::SpendLimitReached(reason.chars().take(500).collect())),
        Err(failure) => Err(Error::PolicyFailed(failure)),
    }
}

/// The spend-guard's answer for `r` with the figures it decided on, read and decided on
/// `conn`, without failing on a refusal; `None` when no budget check applies.
pub(super) async fn budget_check(
    app: &App,
    conn: &mut AnyConnection,
    (pool, at): (&Pool, Version),
    offer: Option<&Offer>,
    r: &Reservation,
) -> Result<Option<super::availability::BudgetCheck>> {
    let Some(spending) = spending(app, conn, pool, offer, r).await? else {
        return Ok(None);
    };
    let reason = match judge_spending(app, conn, (pool, at), &spending).await {
        Ok(()) => None,
        Err(Error::SpendLimitReached(reason)) => Some(reason),
        Err(err) => return Err(err),
    };
    let Spending { charge, budget } = spending;
    Ok(Some(super::availability::BudgetCheck {
        admits: reason.is_none(),
        reason,
        charge_minor: charge.amount_minor,
        limit_minor: budget.limit_minor,
        spent_minor: budget.spent_minor,
        committed_minor: budget.committed_minor,
    }))
}

/// The spend-guard's answer for `r`, read and decided on `conn`.
pub(super) async fn check_budget(
    app: &App,
    conn: &mut AnyConnection,
    pool: (&Pool, Version),
    offer: Option<&Offer>,
    r: &Reservation,
) -> Result<()> {
    match spending(app, conn, pool.0, offer, r).await? {
        Some(spending) => judge_spending(app, conn, pool, &spending).await,
        None => Ok(()),
    }
}

/// What a create places with, besides the reservation and its charge.
#[derive(Clone, Copy)]
struct Placing<'a> {
    caller: &'a Principal,
    /// The pool, as of this settings version.
    pool: (&'a Pool, Version),
    offer: Option<&'a Offer>,
    /// Whether the draft is already stored (a retried create, after a confirmation).
    stored: bool,
}

/// Places and charges quota, in one short transaction: `placed`, or `pending`
/// (`Unschedulable` or `Queued`). The spend-guard and the placer decide before it, on what
/// was read outside it; inside, what they decided on is checked again (the spending read
/// again, the placement by [`place::try_place`]) and a decision made on stale figures is
/// made again. A charge that does not fit is `QUOTA_EXCEEDED` and writes nothing.
/// `None` when a concurrent create with the same key stored its draft first.
async fn charge_and_place(
    app: &App,
    placing: Placing<'_>,
    mut r: Reservation,
    charge: BTreeMap<String, i64>,
) -> Result<Option<Reservation>> {
    let Placing {
        pool: (pool, at),
        offer,
        ..
    } = placing;
    let spent = {
        let mut conn = app.store.pool().acquire().await?;
        let spent = spending(app, &mut conn, pool, offer, &r).await?;
        if let Some(spent) = &spent {
            judge_spending(app, &mut conn, (pool, at), spent).await?;
        }
        spent
    };
    let limits = offer.map(|o| o.quota.clone()).unwrap_or_default();
    let terms = Terms {
        charge: &charge,
        limits: &limits,
        spent: spent.as_ref(),
    };
    for attempt in 0..place::PLACE_ATTEMPTS {
        // Held in the view until the placement commits (or not).
        let (decided, _assumed) = place::decide(app, (pool, at), &r).await?;
        #[cfg(debug_assertions)]
        super::gate::hold_attempt("ORL_TEST_CREATE_GATE", attempt).await;
        let mut writer = writer_for(app, &decided).await?;
        let write = write_placement(app, &mut writer, &placing, &terms, &mut r, decided, attempt);
        match write.await {
            Ok(Written::Keep {
                since,
                laying,
                preempted,
            }) => {
                writer.keep(app, since, laying).await?;
                if !preempted.is_empty() {
                    // What the terminated spot work held beyond the placement's need is free
                    // for the pool's waiting reservations.
                    crate::reconciler::wake_pool(app, &r.pool_id, &preempted).await?;
                }
                return Ok(Some(r));
            }
            Ok(Written::Done(done)) => {
                writer.drop_writes().await?;
                return Ok(done.map(|r| *r));
            }
            Ok(Written::Lost(nodes)) => {
                writer.drop_writes().await?;
                app.capacity.forget(&nodes).await;
            }
            // It gave up waiting for a lock, or deadlocked: tried again once the transaction
            // it waited for is done, it may well succeed.
            Err(err) if err.is_transaction_conflict() && attempt + 1 < place::PLACE_ATTEMPTS => {
                writer.drop_writes().await?;
            }
            Err(err) => {
                writer.drop_writes().await?;
                return Err(err);
            }
        }
    }
    unreachable!("the last placement attempt never asks to decide again")
}

/// Where a placement attempt writes: with the writes made at the same time
/// ([`super::group`]), or alone, when it may terminate spot work: a preemption chooses its
/// victims on what the database holds, so it must see every placement before it committed.
async fn writer_for(app: &App, decided: &place::Decided) -> Result<Writer> {
    Ok(match decided {
        place::Decided::NoFit { spot_nodes, .. } if !spot_nodes.is_empty() => {
            Writer::Alone(app.store.begin().await?)
        }
        _ => Writer::Member(app.placements.join(&app.store).await?),
    })
}

/// What a create charges: the charge, the offer's quota limits, and the spending the
/// spend-guard allowed (read outside the transaction).
struct Terms<'a> {
    charge: &'a BTreeMap<String, i64>,
    limits: &'a BTreeMap<String, i64>,
    spent: Option<&'a Spending>,
}

/// What one placement attempt's writes came to.
enum Written {
    /// To commit: `r` placed or pending, and what it lays onto the view, read from `since`;
    /// `preempted`: the nodes where spot work was terminated to make room.
    Keep {
        since: Since,
        laying: Laying,
        preempted: Vec<String>,
    },
    /// Nothing to keep: the answer of [`charge_and_place`] (the reservation found already
    /// stored; `None` when a concurrent create with the same key stored its draft first).
    Done(Option<Box<Reservation>>),
    /// The decision lost to a commit the view had not seen: forget these nodes and decide
    /// again.
    Lost(Vec<String>),
}

/// Where a create's draft row is written, in a placement attempt.
#[derive(Clone, Copy, PartialEq)]
enum Draft {
    /// Stored already (by an attempt before, or to wait for a confirmation): read again
    /// under its lock, then updated.
    Stored,
    /// In a round trip of its own, before the placement, which may write before its batch
    /// runs; then updated.
    Ahead,
    /// First in the batch that writes the placement, which then updates it: the create
    /// writes in one round trip (SQLite, whose batch's statements run in turn).
    InBatch,
    /// In the batch that writes the placement, after the bookings, inserted as placed: on
    /// PostgreSQL the batch is one statement with one snapshot, where an update would not see
    /// the draft. Only where the nodes' locks ([`place::lock_chosen`]) stand for the checks
    /// the placement would read first.
    InsertedPlaced,
}

impl Draft {
    fn choose(
        backend: Backend,
        stored: bool,
        decided: &place::Decided,
        attempt: u32,
        locked: bool,
    ) -> Draft {
        if stored {
            Draft::Stored
        } else if place::writes_at_once(decided, attempt) {
            Draft::Ahead
        } else {
            match backend {
                Backend::Sqlite => Draft::InBatch,
                Backend::Postgres if locked => Draft::InsertedPlaced,
                Backend::Postgres => Draft::Ahead,
            }
        }
    }
}

/// One placement attempt's writes, through `writer`, from the draft to what is to commit:
/// the write half of [`charge_and_place`]. The caller keeps them or rolls them back, as
/// this answers (rolled back on an error).
async fn write_placement(
    app: &App,
    writer: &mut Writer,
    placing: &Placing<'_>,
    terms: &Terms<'_>,
    r: &mut Reservation,
    decided: place::Decided,
    attempt: u32,
) -> Result<Written> {
    let Placing {
        caller,
        pool: (pool, at),
        offer,
        stored,
    } = *placing;
    let backend = app.store.backend();
    let lock = place::lock_chosen(backend, pool, &decided, attempt);
    let draft = Draft::choose(backend, stored, &decided, attempt, lock.is_some());
    let since = match draft {
        Draft::Stored => {
            writer.start().await?;
            let tx = writer.conn();
            let current = store::find(tx, &r.id, app.store.for_update())
                .await?
                .ok_or_else(|| not_found(&r.id))?;
            if !current.state.is_draft() {
                return Ok(Written::Done(Some(Box::new(current))));
            }
            r.version = current.version;
            r.confirmation_id = current.confirmation_id.clone().or(r.confirmation_id.take());
            Some(app.capacity.since(tx).await?)
        }
        Draft::InBatch | Draft::InsertedPlaced => {
            if let Some(lock) = &lock {
                writer.start_with(lock).await?;
            }
            None
        }
        Draft::Ahead => {
            let mut batch = Batch::on(writer.conn());
            push_draft(&mut batch, caller, r);
            writer.begin_in(&mut batch).await?;
            let Some(since) = insert_draft(app, writer.conn(), batch).await? else {
                return Ok(Written::Done(None));
            };
            Some(since)
        }
    };
    let tx = writer.conn();
    if let Some(spent) = terms.spent {
        let now_spent = spending(app, tx, pool, offer, r).await?;
        if now_spent.as_ref() != Some(spent)
            && let Some(now_spent) = &now_spent
        {
            judge_spending(app, tx, (pool, at), now_spent).await?;
        }
    }
    // Read after the locks: the bookings written below start no earlier than this.
    let now = app.now_ms();
    // Place first, then charge: the rows every placement locks (node reservations, then
    // quota) are taken in the order a reclaim takes them, so the two never deadlock. The
    // bookings are written with what follows, in its round trip.
    let mut deferred = place::Deferred {
        batch: Batch::on(tx),
        expect: Vec::new(),
        locked: draft == Draft::InsertedPlaced,
    };
    if draft == Draft::InBatch {
        push_draft(&mut deferred.batch, caller, r);
        deferred.expect = DRAFT_ROWS.to_vec();
    }
    // What to decide again from if the bookings lose in the final round trip, after the
    // placement marked `r` placed.
    let unplaced = r.clone();
    let placing = place::try_place(app, tx, pool, r, decided, attempt, now, Some(&mut deferred));
    let (placed, preempted) = match placing.await? {
        place::Outcome::Placed { preempted } => (true, preempted),
        place::Outcome::Pending => (false, Vec::new()),
        place::Outcome::Lost(nodes) => return Ok(Written::Lost(nodes)),
    };
    // One round trip writes the bookings, the reservation, its audit entry, the quota
    // charge and the event, so the tenant's quota rows stay locked only until the commit
    // right after. The quota is charged before the event's outbox lock, in the order a
    // release refunds and emits.
    r.charge = Some(terms.charge.clone());
    r.operate("create", now);
    let place::Deferred {
        mut batch, expect, ..
    } = deferred;
    // Where the draft's rows are in the answer, when it went in with the placement.
    let draft_rows = match draft {
        Draft::InBatch => Some(0),
        Draft::InsertedPlaced => Some(expect.len()),
        Draft::Stored | Draft::Ahead => None,
    };
    if draft == Draft::InsertedPlaced {
        r.version += 1;
        push_draft(&mut batch, caller, r);
    } else {
        store::push_update(&mut batch, r);
    }
    let entry = Entry {
        org_id: &r.tenant_id,
        action: "compute-reservation.create",
        object_type: "compute-reservation",
        object_id: &r.id,
        reason: None,
        details: Some(json!({ "state": r.state, "charge": r.charge })),
    };
    audit::push(&mut batch, caller, entry, now);
    let tenant = (r.pool_id.as_str(), r.tenant_id.as_str());
    let charged = store::push_charge(&mut batch, tenant, terms.charge, 1, Some(terms.limits));
    push_event(&mut batch, r, placement_event(placed, pool), json!({}));
    // Read before the write that locks the tenant's quota rows: nothing waits between it
    // and the commit that lets them go.
    let laying = place::laying(app, r, &preempted, now).await;
    // A booking loses to one the view had not seen (an overlap), or to a unit no longer on
    // its node (fewer rows).
    writer.begin_in(&mut batch).await?;
    let tx = writer.conn();
    let feed = app.capacity.since_sql();
    let executed = match since {
        Some(since) => {
            (batch.execute_then(tx, feed).await).map(|(rows, until)| (rows, since, until))
        }
        None if batch.sequential() => (batch.execute_between(tx, feed, feed).await)
            .map(|(rows, after, until)| (rows, app.capacity.since_of(after), until)),
        None => (batch.execute_then(tx, feed).await)
            .map(|(rows, txid)| (rows, app.capacity.since_of(txid), txid)),
    };
    let written = match executed {
        // The draft went in with the placement, and its id was taken meanwhile.
        Ok((rows, ..))
            if draft_rows.is_some_and(|at| rows[at..at + DRAFT_ROWS.len()] != DRAFT_ROWS) =>
        {
            return Ok(Written::Done(None));
        }
        Ok((rows, since, until)) if rows[..expect.len()] == expect[..] => {
            Some((rows, since, until))
        }
        Ok(_) => None,
        Err(err) if violates(&err, "bookings_no_overlap") => None,
        // A new draft's id taken by a create with the same key: its bookings' keys too.
        Err(err) if draft_rows.is_some() && is_unique_violation(&err) => {
            return Ok(Written::Done(None));
        }
        Err(err) => return Err(err.into()),
    };
    let Some((rows, since, until)) = written else {
        let nodes = r.node_ids();
        *r = unplaced;
        return Ok(Written::Lost(nodes));
    };
    // The reservation's row (inserted as placed, or its draft updated), then its audit
    // entry, then the charges.
    let rows = match draft {
        Draft::InsertedPlaced => &rows[expect.len() + DRAFT_ROWS.len()..],
        _ if rows[expect.len()] != 1 => {
            return Err(super::lifecycle::changed_concurrently(r));
        }
        _ => {
            r.version += 1;
            &rows[expect.len() + 1..]
        }
    };
    if let Some(resource) = store::unfitting(charged, &rows[1..]) {
        return Err(quota_exceeded(tx, r, terms.charge, terms.limits, &resource).await?);
    }
    Ok(Written::Keep {
        since: since.until(until),
        laying,
        preempted,
    })
}

/// `QUOTA_EXCEEDED` for `resource`, with what the quota leaves, read in the transaction that
/// refused the charge (which sees the charges of the placements written with it).
async fn quota_exceeded(
    conn: &mut AnyConnection,
    r: &Reservation,
    charge: &BTreeMap<String, i64>,
    limits: &BTreeMap<String, i64>,
    resource: &str,
) -> Result<Error> {
    let used = crate::pools::store::quota_used(conn, &r.pool_id, &r.tenant_id).await?;
    let limit = limits.get(resource).copied().unwrap_or(0);
    let used = used.get(resource).copied().unwrap_or(0);
    Ok(Error::QuotaExceeded {
        message: format!(
            "the request needs {} {resource} but the quota leaves {}",
            charge[resource],
            limit - used
        ),
        details: json!({ "resource": resource, "requested": charge[resource], "limit": limit, "used": used }),
    })
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
