//! Placing a reservation: decide on the capacity view, then book in a short transaction in
//! which the database arbitrates.
//!
//! A decision (the pool's placer, the plugin call included) runs on the view, outside any
//! transaction and any lock, so a slow plugin on one pool never holds up another pool's
//! writes. The write that follows checks again, under the locks it takes, everything the
//! view may not have heard of yet: the node (still reporting, its host resources), the
//! node-reservation rights on the chosen units, the host resources already booked; the
//! database's overlap constraint refuses a unit booked twice. A decision that lost to such
//! a commit writes nothing: the caller rolls back, the nodes it chose are loaded again, and
//! it decides again, at most [`PLACE_ATTEMPTS`] times.
//!
//! The write locks, in this order: the pool (pool-lease pools, whose queue is served in
//! order, and preemptions, which take turns), the reservation, the chosen nodes (by id),
//! their node reservations (shared), then the bookings.

use serde_json::json;
use sqlx::{AnyConnection, Row as _};

use super::availability::explain_pending;
use super::engine::{
    self, Laying, commit_laying, lock_pool, mark_pending, mark_placed, older_pending_exists,
    push_event,
};
use super::placement::{Census, Snapshot};
use super::preempt;
use super::store::{self, Member, Reservation};
use super::{HostBooking, State};
use crate::capacity::{Assumed, Assumption, Change};
use crate::condition::Condition;
use crate::placer::{Candidates, Failure, FailureKind, Placer, Refusal, check_choice};
use crate::pools::PlacerMode;
use crate::pools::store::Pool;
use crate::settings::Version;
use crate::store::{Backend, Batch, violates};
use crate::{App, Error, Result};

/// How many candidate nodes a placer is offered at first: enough for a good fit, few
/// enough that a decision costs the same in a pool of 500 nodes as in one of 20,000.
pub(super) const CANDIDATE_NODES: usize = 256;

/// How many times a placement decides again after losing to a commit its view had not seen.
pub(super) const PLACE_ATTEMPTS: u32 = 3;

/// Why a placement that kept losing to concurrent commits waits.
const BOOKED_CONCURRENTLY: &str = "the chosen units were booked concurrently";

/// Where a decision put a reservation, before anything is written: one member per node
/// (a gang has several), and who decided.
pub(super) struct Chosen {
    pub members: Vec<Member>,
    pub decided_by: String,
    /// Whether the view showed node reservations on a chosen node: the write then reads
    /// their rights again.
    pub claimed: bool,
}

/// Bookings of a placement added to the batch that then writes the placed reservation
/// (its update, audit entry, charge and event), so that they go in the same round trip;
/// `expect` is how many rows they change when every unit is still on its node. The caller
/// executes the batch; a loss shows as other counts, or as an overlap error.
pub(super) struct Deferred {
    pub batch: Batch,
    pub expect: Vec<u64>,
    /// Whether a statement before took the chosen nodes' locks ([`lock_chosen`]).
    pub locked: bool,
}

/// The statement that locks the nodes `decided` chose, on PostgreSQL, when the bookings
/// will be written in the caller's batch and no node reservation claims the nodes: run in
/// a round trip before that batch, whose statement then starts after the locks, so that
/// its checks of each node ([`node_room`]) see every placement that held the lock before,
/// and no separate check is needed. `None` where no such lock is taken.
pub(super) fn lock_chosen(
    backend: Backend,
    pool: &Pool,
    decided: &Decided,
    attempt: u32,
) -> Option<String> {
    let Decided::Chosen(chosen) = decided else {
        return None;
    };
    // A pool-lease pool takes its pool lock first, then the nodes'.
    if backend != Backend::Postgres
        || chosen.claimed
        || writes_at_once(decided, attempt)
        || pool.policy.placer == PlacerMode::PoolLease
    {
        return None;
    }
    let ids: Vec<String> = chosen
        .members
        .iter()
        .map(|m| crate::store::literal(&m.node_id))
        .collect();
    // In id order, so that two placements sharing nodes never wait for each other.
    Some(format!(
        "SELECT id FROM nodes WHERE id IN ({}) ORDER BY id FOR NO KEY UPDATE",
        ids.join(", ")
    ))
}

/// Where [`book`] writes the bookings.
pub(super) enum Write<'a> {
    /// Now; with `go_on` under a savepoint, so that the transaction can go on after a loss.
    Now { go_on: bool },
    /// Into the caller's batch.
    Into(&'a mut Deferred),
}

/// What a decision on a snapshot came to.
pub(super) enum Decided {
    Chosen(Chosen),
    /// It does not fit: why; the pool's census when the decision read all of it (so that
    /// [`explain_pending`] need not count again); and the nodes where spot work holds units
    /// over the window (what preemption could free).
    NoFit {
        reason: String,
        census: Option<Census>,
        spot_nodes: Vec<String>,
    },
}

/// What booking a decision came to.
pub(super) enum Attempt {
    /// Booked, and `r` marked placed.
    Placed,
    /// The decision was made on a stale view: a commit it had not seen booked or claimed
    /// units chosen on these nodes, or changed the nodes. Nothing written.
    Lost(Vec<String>),
}

/// What placing a reservation in a transaction came to.
pub(super) enum Outcome {
    /// Placed, with its bookings written; spot work terminated to make room on
    /// `preempted` (nodes).
    Placed { preempted: Vec<String> },
    /// Marked `pending` (`Unschedulable` or `Queued`).
    Pending,
    /// The decision lost to a commit the view had not seen: roll back, forget these nodes
    /// ([`crate::capacity::View::forget`]) and decide again.
    Lost(Vec<String>),
}

/// Decides where `r` goes on the pool as the capacity view holds it, outside any
/// transaction, and holds the choice in the view until the write is done
/// ([`crate::capacity::View::assume`]). Decisions of one pool take turns on this replica
/// ([`crate::capacity::View::turn`]), so each places around the ones before it; the turn
/// ends with the decision, before anything is written. A choice the view shows taken by
/// then (another replica's commit, heard meanwhile) is not assumed: the database arbitrates.
pub(super) async fn decide(
    app: &App,
    (pool, at): (&Pool, Version),
    r: &Reservation,
) -> Result<(Decided, Option<Assumed>)> {
    let turn = app.capacity.turn(&pool.id).await;
    let snapshot = Snapshot::load(app, &pool.id, r, app.now_ms()).await?;
    let decided = {
        let mut conn = app.store.pool().acquire().await?;
        decide_on(app, &mut conn, (pool, at), r, &snapshot).await?
    };
    let chosen = match decided {
        Decided::Chosen(chosen) => chosen,
        // Why it waits and until when, worked out after the pool's turn.
        Decided::NoFit {
            reason,
            census,
            spot_nodes,
        } => {
            drop(turn);
            let reason = explain_pending(&reason, census, r, &snapshot, app.now_ms());
            let decided = Decided::NoFit {
                reason,
                census,
                spot_nodes,
            };
            return Ok((decided, None));
        }
    };
    let members: Vec<(&str, &[String])> = chosen
        .members
        .iter()
        .map(|m| (m.node_id.as_str(), m.unit_ids.as_slice()))
        .collect();
    let assumption = Assumption {
        reservation_id: &r.id,
        spot: r.spot,
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        members: &members,
        host: r.resources.into(),
    };
    let assumed = app.capacity.assume(assumption).await;
    drop(turn);
    Ok((Decided::Chosen(chosen), assumed))
}

/// Asks the pool's placer (its assignment read on `conn`) for units on `snapshot`. A gang
/// is decided member by member ([`super::gang`]).
pub(super) async fn decide_on(
    app: &App,
    conn: &mut AnyConnection,
    (pool, at): (&Pool, Version),
    r: &Reservation,
    snapshot: &Snapshot,
) -> Result<Decided> {
    let placer = crate::policy::assignment::placer_for(app, conn, at, pool).await?;
    let decided = if r.request.gang.is_some() {
        super::gang::decide(placer.as_ref(), r, snapshot).await?
    } else {
        decide_one(placer.as_ref(), r, snapshot).await?
    };
    Ok(match decided {
        Ok(chosen) => Decided::Chosen(chosen),
        // Spot work gives way only to work that is not spot.
        Err((reason, census)) => Decided::NoFit {
            reason,
            census,
            spot_nodes: match r.spot {
                true => Vec::new(),
                false => snapshot.nodes_holding_spot(),
            },
        },
    })
}

/// One node for `r`: the placer's answer, checked against what it was offered; or why
/// it does not fit. The placer is offered the first [`CANDIDATE_NODES`] candidate nodes
/// from where the pool's last decision stopped, and all of them only if it refuses those.
async fn decide_one(
    placer: &dyn Placer,
    r: &Reservation,
    snapshot: &Snapshot,
) -> Result<std::result::Result<Chosen, (String, Option<Census>)>> {
    let mut offer = snapshot.candidates(r, false, Some(CANDIDATE_NODES));
    let (choice, decided_by) = loop {
        let facts = |c: &Candidates| snapshot.facts(c);
        match (placer.place(&offer.request, &offer.candidates, &facts)).await {
            Ok(decision) => break decision,
            Err(Refusal::Unschedulable(_)) if offer.partial => {
                offer = snapshot.candidates(r, false, None);
            }
            Err(Refusal::Unschedulable(reason)) => return Ok(Err((reason, offer.census))),
            Err(Refusal::Failed(failure)) => return Err(Error::PolicyFailed(failure)),
        }
    };
    if let Err(message) = check_choice(&offer.request, &offer.candidates, &choice) {
        return Err(Error::PolicyFailed(Failure {
            plugin_id: placer.id(),
            kind: FailureKind::InvalidAnswer,
            message,
        }));
    }
    let (n, _) = offer.index[choice.units[0] as usize];
    let node = snapshot.node(n);
    let chosen: Vec<String> = choice
        .units
        .iter()
        .map(|u| node.units[offer.index[*u as usize].1].id.clone())
        .collect();
    Ok(Ok(Chosen {
        members: vec![Member {
            node_id: node.id.clone(),
            unit_ids: Snapshot::booked_units(node, r, chosen),
        }],
        decided_by,
        claimed: snapshot.claimed(n),
    }))
}

/// Whether [`try_place`] may write on `decided` before the caller's batch runs: the last
/// attempt books at once, and a preemption terminates spot work first.
pub(super) fn writes_at_once(decided: &Decided, attempt: u32) -> bool {
    match decided {
        Decided::Chosen(_) => attempt + 1 == PLACE_ATTEMPTS,
        Decided::NoFit { spot_nodes, .. } => !spot_nodes.is_empty(),
    }
}

/// Places `r` in `conn`'s transaction as `decided` (made on the view, outside it): books
/// the choice, or, when it does not fit, lets spot work give way or marks it `pending`
/// (`Unschedulable`, retried every 30 s; `Queued` in a pool-lease pool). A pool-lease queue
/// is served in order: nothing jumps an older queued reservation. On the last attempt a
/// lost decision waits as `pending` instead of asking to decide again. With `defer`, the
/// bookings of a choice are added to it instead of written, except on the last attempt.
#[allow(clippy::too_many_arguments)]
pub(super) async fn try_place(
    app: &App,
    conn: &mut AnyConnection,
    pool: &Pool,
    r: &mut Reservation,
    decided: Decided,
    attempt: u32,
    now: i64,
    defer: Option<&mut Deferred>,
) -> Result<Outcome> {
    let queued = pool.policy.placer == PlacerMode::PoolLease;
    if queued {
        lock_pool(app, conn, &pool.id).await?;
        if older_pending_exists(conn, r).await? {
            let why = "waiting behind older reservations in the pool's queue";
            mark_pending(r, queued, why.into(), now);
            return Ok(Outcome::Pending);
        }
    }
    let (reason, spot_nodes) = match decided {
        Decided::Chosen(chosen) => {
            let last = attempt + 1 == PLACE_ATTEMPTS;
            let write = match defer {
                Some(deferred) if !last => Write::Into(deferred),
                _ => Write::Now { go_on: last },
            };
            return match book(app, conn, r, chosen, write, now).await? {
                Attempt::Placed => Ok(Outcome::Placed {
                    preempted: Vec::new(),
                }),
                Attempt::Lost(nodes) if !last => Ok(Outcome::Lost(nodes)),
                Attempt::Lost(nodes) => {
                    app.capacity.forget(&nodes).await;
                    mark_pending(r, queued, BOOKED_CONCURRENTLY.into(), now);
                    Ok(Outcome::Pending)
                }
            };
        }
        Decided::NoFit {
            reason, spot_nodes, ..
        } => (reason, spot_nodes),
    };
    if !spot_nodes.is_empty() && preempt_and_place(app, conn, pool, r, &spot_nodes, now).await? {
        return Ok(Outcome::Placed {
            preempted: spot_nodes,
        });
    }
    mark_pending(r, queued, reason, now);
    Ok(Outcome::Pending)
}

/// Terminates spot work so that `r` fits, and places it: the terminations and the placement
/// commit together or not at all. Decided inside the transaction, on what it sees.
async fn preempt_and_place(
    app: &App,
    conn: &mut AnyConnection,
    pool: &Pool,
    r: &mut Reservation,
    spot_nodes: &[String],
    now: i64,
) -> Result<bool> {
    // Preemptions of one pool take turns on its lock, and each terminates what it sees
    // after the one before it committed: the nodes holding spot work are read again, so
    // that no victim is chosen that a concurrent create already took.
    if pool.policy.placer != PlacerMode::PoolLease {
        lock_pool(app, conn, &pool.id).await?;
    }
    app.capacity.forget(spot_nodes).await;
    let at = app.settings.version(conn).await?;
    let snapshot = Snapshot::load(app, &pool.id, r, now).await?;
    let mut attempt = sqlx::Connection::begin(&mut *conn).await?;
    if preempt::make_room(app, &mut attempt, (pool, at), r, &snapshot, now).await? {
        // The terminations changed what is free: place on what the transaction sees.
        let freed = snapshot.read_again(&mut attempt, spot_nodes).await?;
        if let Decided::Chosen(chosen) = decide_on(app, &mut attempt, (pool, at), r, &freed).await?
            && let Attempt::Placed = book(
                app,
                &mut attempt,
                r,
                chosen,
                Write::Now { go_on: false },
                now,
            )
            .await?
        {
            attempt.commit().await?;
            return Ok(true);
        }
    }
    attempt.rollback().await?;
    Ok(false)
}

/// Writes the bookings `chosen` names (as `write` says), all members or none, after
/// checking under locks what the view that decided may not have seen; marks `r` placed.
/// After a loss the caller rolls the transaction back, unless the bookings were written
/// under a savepoint.
pub(super) async fn book(
    app: &App,
    conn: &mut AnyConnection,
    r: &mut Reservation,
    chosen: Chosen,
    write: Write<'_>,
    now: i64,
) -> Result<Attempt> {
    let Chosen {
        mut members,
        decided_by,
        claimed,
    } = chosen;
    let nodes = |members: &[Member]| members.iter().map(|m| m.node_id.clone()).collect();
    // Where the batch's statements run in turn under the one writer, which is then the
    // node's lock, or where a statement before took the nodes' locks ([`lock_chosen`]), a
    // node without node reservations is checked by the statement that books its units
    // ([`node_room`]).
    let checked_in_batch = match &write {
        Write::Into(deferred) => !claimed && (deferred.batch.sequential() || deferred.locked),
        Write::Now { .. } => false,
    };
    if !checked_in_batch {
        // Nodes in id order, so that two placements sharing nodes never wait for each other.
        let mut order: Vec<&Member> = members.iter().collect();
        order.sort_by(|a, b| a.node_id.cmp(&b.node_id));
        for member in order {
            let allowed = match node_check(app, conn, r, &member.node_id, now).await? {
                NodeCheck::NoRoom => false,
                NodeCheck::Room { claimed: false } => true,
                NodeCheck::Room { claimed: true } => Snapshot::rights_refuse_from(
                    conn,
                    app.store.for_share(),
                    r,
                    &member.node_id,
                    &member.unit_ids,
                    now,
                )
                .await?
                .is_none(),
            };
            if !allowed {
                return Ok(Attempt::Lost(nodes(&members)));
            }
        }
    }
    let written = match write {
        Write::Into(deferred) => {
            let room = checked_in_batch.then(|| node_room(r.resources));
            for m in &members {
                let share = app.provider_share_bps;
                let rows = store::push_bookings(
                    &mut deferred.batch,
                    r,
                    (&m.node_id, &m.unit_ids),
                    share,
                    now,
                    room.as_ref(),
                );
                deferred.expect.extend(rows);
            }
            true
        }
        Write::Now { go_on: true } => {
            let mut savepoint = sqlx::Connection::begin(&mut *conn).await?;
            let written = insert_members(app, &mut savepoint, r, &members, now).await?;
            match written {
                true => savepoint.commit().await?,
                false => savepoint.rollback().await?,
            }
            written
        }
        Write::Now { go_on: false } => insert_members(app, conn, r, &members, now).await?,
    };
    if !written {
        return Ok(Attempt::Lost(nodes(&members)));
    }
    let first = members[0].node_id.clone();
    store::order_members(&mut members, Some(&first));
    r.unit_ids = members.iter().flat_map(|m| m.unit_ids.clone()).collect();
    r.members = members;
    mark_placed(r, first, decided_by, now);
    Ok(Attempt::Placed)
}

/// Writes every member's bookings; `false` when one lost to a booking the view had not
/// seen (the caller undoes what was written).
async fn insert_members(
    app: &App,
    conn: &mut AnyConnection,
    r: &Reservation,
    members: &[Member],
    now: i64,
) -> Result<bool> {
    for member in members {
        let written = store::insert_bookings(
            conn,
            r,
            &member.node_id,
            &member.unit_ids,
            app.provider_share_bps,
            now,
        )
        .await;
        match written {
            Ok(true) => {}
            Ok(false) => return Ok(false),
            Err(err) if violates(&err, "bookings_no_overlap") => return Ok(false),
            Err(err) => return Err(err.into()),
        }
    }
    Ok(true)
}

/// What a placement finds of a node at write time.
enum NodeCheck {
    /// The node is gone or lost, or has no room for the host resources.
    NoRoom,
    /// It takes the placement's host resources; `claimed` when node reservations that
    /// are not cancelled exist on it (whose rights are then read again).
    Room { claimed: bool },
}

/// Whether `node_id` still takes placements and has room for `r`'s host resources over its
/// window, read under a lock on the node (so two placements on one node take turns, and
/// each sees the other's host bookings), and whether node reservations that are not
/// cancelled exist on it. On SQLite the one writer is the lock.
async fn node_check(
    app: &App,
    conn: &mut AnyConnection,
    r: &Reservation,
    node_id: &str,
    now: i64,
) -> Result<NodeCheck> {
    let want = r.resources;
    if app.store.backend() == Backend::Postgres {
        // Locked first, read after: a statement that waits for a row lock still reads with
        // the snapshot it started with, so sums read in the locking statement would miss the
        // host bookings of the placement it waited for.
        sqlx::query(&format!(
            "SELECT id FROM nodes WHERE id = $1{}",
            app.store.for_turn()
        ))
        .bind(node_id)
        .fetch_optional(&mut *conn)
        .await?;
    }
    let Some(node) = sqlx::query(&format!(
        "SELECT n.host_vcpu, n.host_memory_gib, n.host_hugepages_1gi, n.lost_at,
                b.vcpu, b.memory_gib, b.hugepages_1gi,
                CAST(CASE WHEN EXISTS (SELECT 1 FROM node_reservations nr
                                       WHERE nr.node_id = n.id AND nr.lifecycle <> 'cancelled')
                          THEN 1 ELSE 0 END AS BIGINT) AS claimed
         FROM nodes n, {} WHERE n.id = $1",
        booked_host(NODE_CHECK_PARAMS),
    ))
    .bind(node_id)
    .bind(&r.id)
    .bind(r.end_ms)
    .bind(r.start_ms.max(now))
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(NodeCheck::NoRoom);
    };
    let fits = |column: &str, want: i64| {
        node.get::<i64, _>(column) + want <= node.get::<i64, _>(format!("host_{column}").as_str())
    };
    let room = node.get::<Option<i64>, _>("lost_at").is_none()
        && (want == HostBooking::default()
            || fits("vcpu", want.vcpu)
                && fits("memory_gib", want.memory_gib)
                && fits("hugepages_1gi", want.hugepages_1gi));
    Ok(if room {
        NodeCheck::Room {
            claimed: node.get::<i64, _>("claimed") != 0,
        }
    } else {
        NodeCheck::NoRoom
    })
}

/// [`booked_host`]'s parameters in [`node_check`]'s statement.
const NODE_CHECK_PARAMS: [&str; 4] = ["$1", "$2", "$3", "$4"];

/// The host resources booked on node `node` over the window `start`–`end` by reservations
/// other than `id` (each named by its parameter), as a table `b` of one row with a column
/// per resource: one read of the node's live host bookings, through their index (`IS
/// TRUE`, as its predicate says), not the node's history.
fn booked_host([node, id, end, start]: [&str; 4]) -> String {
    format!(
        "(SELECT CAST(COALESCE(SUM(h.vcpu), 0) AS BIGINT) AS vcpu,
                 CAST(COALESCE(SUM(h.memory_gib), 0) AS BIGINT) AS memory_gib,
                 CAST(COALESCE(SUM(h.hugepages_1gi), 0) AS BIGINT) AS hugepages_1gi
          FROM host_bookings h
          WHERE h.node_id = {node} AND h.active IS TRUE AND h.reservation_id <> {id}
            AND h.start_ms < {end} AND h.end_ms > {start}) b"
    )
}

/// What [`node_check`] checks of a node without node reservations, as a condition on the
/// statement that books its units ([`store::push_bookings`]): the node still reports,
/// holds no node reservation, and has room for `want` over the window. A node that fails it
/// books no unit, which shows as a lost decision.
fn node_room(want: HostBooking) -> store::NodeCondition {
    let (booked, host, values) = match want == HostBooking::default() {
        true => (String::new(), "", Vec::new()),
        false => (
            format!(", {}", booked_host(["$2", "$1", "$4", "$3"])),
            " AND b.vcpu + $10 <= n.host_vcpu AND b.memory_gib + $11 <= n.host_memory_gib
              AND b.hugepages_1gi + $12 <= n.host_hugepages_1gi",
            vec![
                want.vcpu.into(),
                want.memory_gib.into(),
                want.hugepages_1gi.into(),
            ],
        ),
    };
    store::NodeCondition {
        sql: format!(
            "EXISTS (SELECT 1 FROM nodes n{booked} WHERE n.id = $2 AND n.lost_at IS NULL
                       AND NOT EXISTS (SELECT 1 FROM node_reservations nr
                                       WHERE nr.node_id = n.id AND nr.lifecycle <> 'cancelled'){host})"
        ),
        values,
    }
}

/// How many reservations that still do not fit one transaction marks waiting again.
const WAITING_BATCH: usize = 100;

/// Retries placing the pending reservations `pending` of pool `pool_id`, in order (the
/// reconciler's and the wake-up's path). They share one read of the pool's settings and
/// placer, and each is decided on the capacity view as the ones before it left it. One that
/// fits, or that spot work could make room for, or that waits in a pool-lease queue, is
/// placed in its own transaction as a create is; those that still do not fit are marked
/// waiting again together, [`WAITING_BATCH`] to a transaction, each by a conditional update
/// on the version decided on (one changed meanwhile is left as it is). A failure (a failing
/// placement plugin, say) is that reservation's alone: it is logged and the reservation
/// waits for its next attempt.
pub async fn retry_pool(app: &App, pool_id: &str, pending: Vec<Reservation>) -> Result<()> {
    let (pool, at) = {
        let mut conn = app.store.pool().acquire().await?;
        let at = app.settings.version(&mut conn).await?;
        let Some(pool) = app.settings.pool(&mut conn, at, pool_id).await? else {
            return Ok(());
        };
        (pool, at)
    };
    let started = std::time::Instant::now();
    let queued = pool.policy.placer == PlacerMode::PoolLease;
    let mut waiting = Vec::new();
    let mut tried = 0;
    for r in pending.into_iter().filter(|r| r.state == State::Pending) {
        tried += 1;
        let decision = match decide(app, (&pool, at), &r).await {
            Ok(decision) => decision,
            Err(err) => {
                tracing::warn!(reservation = %r.id, error = %err, "placement retry failed");
                continue;
            }
        };
        match decision {
            (
                Decided::NoFit {
                    reason, spot_nodes, ..
                },
                _,
            ) if !queued && spot_nodes.is_empty() => {
                waiting.push((r, reason));
            }
            decision => {
                if let Err(err) = retry(app, &r.id, (&pool, at), decision).await {
                    tracing::warn!(reservation = %r.id, error = %err, "placement retry failed");
                }
            }
        }
    }
    for chunk in waiting.chunks(WAITING_BATCH) {
        still_waiting(app, chunk).await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    app.metrics.observe_pending_retries(tried, seconds);
    Ok(())
}

/// Marks the reservations of `waiting`, each as decided on with why it does not fit,
/// waiting again in one transaction and one round trip: the next attempt, and the reason
/// where it changed. One changed since it was read is left as it is.
async fn still_waiting(app: &App, waiting: &[(Reservation, String)]) -> Result<()> {
    let mut tx = app.store.begin().await?;
    let now = app.now_ms();
    let mut batch = Batch::on(&tx);
    for (decided_on, reason) in waiting {
        let mut r = decided_on.clone();
        mark_pending(&mut r, false, reason.clone(), now);
        if same_conditions(&r.conditions, &decided_on.conditions) {
            r.conditions = decided_on.conditions.clone();
        }
        store::push_update(&mut batch, &r);
    }
    batch.execute(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Whether `now` are the conditions of `before` (only their times may have moved).
fn same_conditions(now: &[Condition], before: &[Condition]) -> bool {
    (now.iter().map(|c| (&c.kind, &c.message))).eq(before.iter().map(|c| (&c.kind, &c.message)))
}

/// Places the pending reservation `id` as `first` decided (read again and decided again
/// after a lost write), or marks it waiting; answers whether it was placed.
async fn retry(
    app: &App,
    id: &str,
    (pool, at): (&Pool, Version),
    first: (Decided, Option<Assumed>),
) -> Result<bool> {
    let mut first = Some(first);
    for attempt in 0..PLACE_ATTEMPTS {
        let (decided, _assumed) = match first.take() {
            Some(decision) => decision,
            None => {
                let mut conn = app.store.pool().acquire().await?;
                let Some(r) = store::find(&mut conn, id, "").await? else {
                    return Ok(false);
                };
                if r.state != State::Pending {
                    return Ok(false);
                }
                drop(conn);
                decide(app, (pool, at), &r).await?
            }
        };
        #[cfg(debug_assertions)]
        super::gate::hold_at("ORL_TEST_RETRY_GATE").await;
        let mut tx = app.store.begin().await?;
        let Some(mut r) = store::find(&mut tx, id, app.store.for_update()).await? else {
            return Ok(false);
        };
        if r.state != State::Pending {
            return Ok(false);
        }
        // Read after the locks: the bookings written below start no earlier than this.
        let now = app.now_ms();
        let before = r.conditions.clone();
        let since = app.capacity.since(&mut tx).await?;
        let (placed, preempted) =
            match try_place(app, &mut tx, pool, &mut r, decided, attempt, now, None).await? {
                Outcome::Placed { preempted } => (true, preempted),
                Outcome::Pending => (false, Vec::new()),
                Outcome::Lost(nodes) => {
                    tx.rollback().await?;
                    app.capacity.forget(&nodes).await;
                    continue;
                }
            };
        if !placed && same_conditions(&r.conditions, &before) {
            // Still waiting for the same reason: only the next attempt moves.
            r.conditions = before;
        }
        if placed {
            r.operate("place", now);
        }
        let written = store::update_then(&mut tx, &mut r, |batch, r| {
            if placed {
                push_event(batch, r, "reservation.placed", json!({}));
                let entry = crate::audit::Entry {
                    org_id: &r.tenant_id,
                    action: "compute-reservation.place",
                    object_type: "compute-reservation",
                    object_id: &r.id,
                    reason: None,
                    details: Some(json!({ "state": r.state, "placedBy": r.placed_by })),
                };
                crate::audit::push(batch, &crate::iam::Principal::system(), entry, now);
            }
        })
        .await?;
        if !written {
            tx.rollback().await?;
            return Ok(false);
        }
        let laying = laying(app, &r, &preempted, now).await;
        commit_laying(app, tx, since, laying).await?;
        return Ok(placed);
    }
    Ok(false)
}

/// What the commit of `r`'s placement at `now` (or its move to pending) lays onto the
/// capacity view: the bookings it wrote; where spot work was terminated, the nodes loaded
/// again instead. Read before the commit.
pub(super) async fn laying(app: &App, r: &Reservation, preempted: &[String], now: i64) -> Laying {
    let nodes = r.node_ids();
    if nodes.is_empty() || !preempted.is_empty() {
        return Laying::Forget([nodes, preempted.to_vec()].concat());
    }
    let window = (r.start_ms.max(now), r.end_ms);
    let host = r.resources.into();
    let changes = r
        .members
        .iter()
        .map(|m| {
            let change = Change::booked(&r.id, r.spot, window, &m.unit_ids, host);
            (m.node_id.clone(), change)
        })
        .collect();
    engine::laying(app, changes).await
}
