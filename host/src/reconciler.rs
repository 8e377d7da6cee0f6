//! The reconciler: drives compute reservations in time. `placed → active` at the window's
//! start (`placed → binding` for `node` and `kubernetes` bindings, which a node agent then
//! reports bound), marks silent nodes lost and carries devices a node still holds (see
//! [`crate::booking::binding`]), `expired` at its end, `released` (`lease-lapsed`) when a lease is not renewed,
//! retries `pending` every 30 s (queued ones as capacity frees; a pool's due ones
//! together, after the pass's other moves, see [`place::retry_pool`]), and times out
//! `awaiting-confirmation` after 30 minutes, and deletes the drafts that creates which did
//! not go through (quota, spend limit, a failed policy decision) left behind, once
//! [`DRAFT_RETENTION_MS`] has passed: a retry with the same idempotency key finds its
//! draft until then. Every move is a conditional update on the reservation's current
//! state, so several replicas may run it at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::audit::{self, Entry};
use crate::booking::binding;
use crate::booking::lifecycle::{Ending, end, push_audit_move};
use crate::booking::place;
use crate::booking::store::{self, Reservation};
use crate::booking::{Binding, State};
use crate::iam::Principal;
use crate::iam::confirmations::CONFIRMATION_WINDOW_MS;
use crate::store::Batch;
use crate::{App, Result, events};

/// How long a draft left by a create that did not go through is kept, by the server clock.
pub const DRAFT_RETENTION_MS: i64 = 24 * 60 * 60 * 1000;
/// Drafts deleted per transaction.
const DRAFT_SWEEP_BATCH: i64 = 500;
/// Reservations started per transaction ([`start`]).
const START_BATCH: usize = 50;

/// One pass over every reservation that time may move. Each move is conditional on the
/// version the pass read (an end in a transaction of its own, starts [`START_BATCH`] to a
/// transaction): a reservation another replica (or a request) changed meanwhile is left for
/// the next pass, and a move that fails is logged and never stops the others.
pub async fn run_once(app: &App) -> Result<()> {
    let now = app.now_ms();
    let started = std::time::Instant::now();
    // Node loss and held devices first, so the work list below sees what they ended.
    // Pools where capacity freed, with the nodes it freed on where they are known.
    let mut freed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pool in binding::detect_lost_nodes(app).await? {
        freed.entry(pool).or_default();
    }
    for pool in binding::carry_held(app).await? {
        freed.entry(pool).or_default();
    }
    let work = {
        let mut conn = app.store.pool().acquire().await?;
        store::due(&mut conn, now, CONFIRMATION_WINDOW_MS).await?
    };
    let due = work.len();
    let lag = work.iter().map(|r| now - due_since(r)).max().unwrap_or(0);
    // Pending reservations due for another attempt, by pool: tried after every other move,
    // with what those freed, a pool's together.
    let mut retries: BTreeMap<String, Vec<Reservation>> = BTreeMap::new();
    let mut starting = Vec::new();
    for r in work {
        let id = r.id.clone();
        match advance(app, r, now).await {
            Ok(Next::Freed(pool, nodes)) => freed.entry(pool).or_default().extend(nodes),
            Ok(Next::Start(r)) => starting.push(*r),
            Ok(Next::Retry(r)) => retries.entry(r.pool_id.clone()).or_default().push(*r),
            Ok(Next::Nothing) => {}
            Err(err) => {
                tracing::warn!(reservation = %id, error = %format_args!("{err:#}"), "reconciler move failed")
            }
        }
    }
    for batch in starting.chunks(START_BATCH) {
        if let Err(err) = start(app, batch).await {
            tracing::warn!(reservations = batch.len(), error = %format_args!("{err:#}"), "reconciler starts failed");
        }
    }
    let pools: BTreeSet<String> = freed.keys().chain(retries.keys()).cloned().collect();
    for pool in pools {
        let due = retries.remove(&pool).unwrap_or_default();
        let tried = match freed.get(&pool) {
            Some(nodes) => wake(app, &pool, nodes, due).await,
            None => place::retry_pool(app, &pool, due).await,
        };
        // One pool's failure leaves the others' retries to go on.
        if let Err(err) = tried {
            tracing::warn!(pool = %pool, error = %format_args!("{err:#}"), "pending retries failed");
        }
    }
    sweep_drafts(app, now).await?;
    app.metrics
        .observe_reconciler_pass(started.elapsed().as_secs_f64(), due, lag);
    app.capacity.prune(&app.store).await
}

/// Deletes the drafts created before `now - DRAFT_RETENTION_MS`, a batch per transaction,
/// each delete conditional on the row still being a draft (a create that found it and went
/// on with it has moved it) and audited. Reads only old drafts (index on `state`).
async fn sweep_drafts(app: &App, now: i64) -> Result<()> {
    let before = now - DRAFT_RETENTION_MS;
    loop {
        let mut tx = app.store.begin().await?;
        let stale: Vec<(String, String)> = sqlx::query_as(
            "SELECT id, tenant_id FROM compute_reservations
             WHERE state = 'draft' AND created_at <= $1 ORDER BY created_at, id LIMIT $2",
        )
        .bind(before)
        .bind(DRAFT_SWEEP_BATCH)
        .fetch_all(&mut **tx)
        .await?;
        let mut swept = 0;
        for (id, tenant_id) in &stale {
            let deleted =
                sqlx::query("DELETE FROM compute_reservations WHERE id = $1 AND state = 'draft'")
                    .bind(id)
                    .execute(&mut **tx)
                    .await?
                    .rows_affected();
            if deleted == 0 {
                continue;
            }
            swept += 1;
            let entry = Entry {
                org_id: tenant_id,
                action: "compute-reservation.draft-swept",
                object_type: "compute-reservation",
                object_id: id,
                reason: None,
                details: Some(json!({ "retentionMs": DRAFT_RETENTION_MS })),
            };
            audit::record(&mut tx, &Principal::system(), entry, now).await?;
        }
        tx.commit().await?;
        if swept > 0 {
            tracing::info!(swept, "deleted drafts of creates that did not go through");
        }
        if (stale.len() as i64) < DRAFT_SWEEP_BATCH {
            return Ok(());
        }
    }
}

/// Since when `r` has been due (its earliest due time that has passed).
fn due_since(r: &Reservation) -> i64 {
    [
        (r.state == State::AwaitingConfirmation).then_some(r.created_at + CONFIRMATION_WINDOW_MS),
        r.lease_deadline_ms,
        (!r.state.is_terminal()).then_some(r.end_ms),
        (r.state == State::Placed).then_some(r.start_ms),
        r.next_attempt_ms,
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(i64::MAX)
}

/// What a pass does next for a reservation it moved, or did not.
enum Next {
    Nothing,
    /// It freed capacity in the pool, on the nodes.
    Freed(String, Vec<String>),
    /// It is placed and its window has started ([`start`]).
    Start(Box<Reservation>),
    /// It is pending and due for another attempt.
    Retry(Box<Reservation>),
}

/// The move time makes on `r` at `now`, if any.
async fn advance(app: &App, r: Reservation, now: i64) -> Result<Next> {
    let transition = match r.state {
        State::AwaitingConfirmation if r.created_at + CONFIRMATION_WINDOW_MS <= now => {
            Some((State::Expired, "confirmation-timeout"))
        }
        State::Placed | State::Binding | State::Active
            if r.lease_deadline_ms.is_some_and(|d| d <= now) =>
        {
            Some((State::Released, "lease-lapsed"))
        }
        State::Placed | State::Binding | State::Active | State::Pending if r.end_ms <= now => {
            Some((State::Expired, "window-ended"))
        }
        _ => None,
    };
    if let Some((state, reason)) = transition {
        let frees = r.state != State::AwaitingConfirmation;
        let (pool, nodes) = (r.pool_id.clone(), r.node_ids());
        let moved = finish(app, r, state, reason).await?;
        return Ok(match moved && frees {
            true => Next::Freed(pool, nodes),
            false => Next::Nothing,
        });
    }
    Ok(match r.state {
        State::Placed if r.start_ms <= now => Next::Start(Box::new(r)),
        State::Pending if r.next_attempt_ms.is_none_or(|t| t <= now) => Next::Retry(Box::new(r)),
        _ => Next::Nothing,
    })
}

/// Ends `r` (as the pass read it) in `state`; answers whether this replica moved it.
async fn finish(app: &App, r: Reservation, state: State, reason: &str) -> Result<bool> {
    let action = format!("compute-reservation.{reason}");
    let ending = Ending {
        state,
        reason,
        by: &Principal::system(),
        action: &action,
    };
    let ended = end(app, r, ending, |batch, r| {
        if reason == "confirmation-timeout" {
            batch.push(
                "UPDATE confirmations SET state = 'expired' WHERE reservation_id = $1 AND state = 'pending'",
                vec![(&r.id).into()],
            );
        }
    });
    Ok(ended.await?.is_some())
}

/// Placed reservations whose windows have started, as the pass read them: a held one
/// becomes active (`hold` needs no node to bind); a `node` or `kubernetes` one starts
/// `binding`, and its node is asked to bind it. One transaction and two round trips for
/// the lot: each update conditional on the version read, then, for those that matched, the
/// events, audit entries and bind requests. One changed since (extended, released, …) is
/// left for the next pass to decide.
async fn start(app: &App, due: &[Reservation]) -> Result<()> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let mut updates = Batch::on(&tx);
    let moved: Vec<Reservation> = (due.iter().cloned())
        .map(|mut r| {
            let (state, name, _) = started(r.binding);
            r.state = state;
            r.operate(name, now);
            store::push_update(&mut updates, &r);
            r
        })
        .collect();
    let matched = updates.execute(&mut tx).await?;
    let mut effects = Batch::on(&tx);
    for (mut r, _) in moved
        .into_iter()
        .zip(matched)
        .filter(|(_, rows)| *rows == 1)
    {
        r.version += 1;
        let (_, name, kind) = started(r.binding);
        if r.binding != Binding::Hold {
            binding::push_request_bind(&mut effects, &r, now);
        }
        let payload = json!({ "reservation": r.view() });
        events::push(&mut effects, kind, &r.id, &[&r.tenant_id], &payload, now);
        push_audit_move(&mut effects, &r, name, now);
    }
    effects.execute(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// What starting a reservation of `binding` moves it to: its state, the move's name and
/// the event announcing it.
fn started(binding: Binding) -> (State, &'static str, &'static str) {
    match binding {
        Binding::Hold => (State::Active, "activate", "reservation.active"),
        Binding::Node | Binding::Kubernetes => (State::Binding, "bind", "reservation.binding"),
    }
}

/// Freed capacity: tries the pool's pending reservations again, oldest first. `freed` are
/// the nodes this replica just freed units on, already current in its capacity view.
pub async fn wake_pool(app: &App, pool_id: &str, freed: &[String]) -> Result<()> {
    wake(app, pool_id, freed, Vec::new()).await
}

/// [`wake_pool`], with `due` (pending reservations of the pool due for another attempt
/// anyway) tried whether or not they may fit on the freed nodes.
async fn wake(app: &App, pool_id: &str, freed: &[String], due: Vec<Reservation>) -> Result<()> {
    let pending = {
        let mut conn = app.store.pool().acquire().await?;
        store::pending_in_pool(&mut conn, pool_id).await?
    };
    if pending.is_empty() {
        return Ok(());
    }
    // What did not fit before can fit now only where capacity freed: skip what no freed
    // node has room for (a gang, or freed capacity of unknown nodes, is always retried).
    let freed = if freed.is_empty() {
        None
    } else {
        Some(app.capacity.nodes(freed).await?)
    };
    let now = app.now_ms();
    let due: BTreeSet<String> = due.into_iter().map(|r| r.id).collect();
    let tried: Vec<Reservation> = (pending.into_iter())
        .filter(|r| {
            let wanted: i64 = r.request.devices.iter().map(|d| d.count).sum();
            due.contains(&r.id)
                || r.request.gang.is_some()
                || freed.as_ref().is_none_or(|nodes| {
                    nodes
                        .iter()
                        .any(|n| n.free_units(r.start_ms.max(now), r.end_ms) as i64 >= wanted)
                })
        })
        .collect();
    place::retry_pool(app, pool_id, tried).await
}

/// Runs the reconciler every `every` until the process stops.
pub fn spawn(app: Arc<App>, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(err) = run_once(&app).await {
                tracing::warn!(error = %err, "reconciler pass failed");
            }
        }
    })
}
