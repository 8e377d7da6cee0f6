//! Bindings: how a `node` or `kubernetes` reservation reaches its node, and what the node
//! agent says back.
//!
//! At the window's start the reconciler moves such a reservation `placed → binding` and
//! asks its node to bind it; the node agent polls `GET /v1/nodes/{nodeId}/bindings` and
//! reports `bound` (the reservation becomes `active`), `failed` (it ends `failed`, its
//! bookings released and quota refunded) or, after an unbind, `allocation-released`.
//!
//! A bound `kubernetes` reservation that is released (or whose window or lease ends) is
//! terminal at once, but its device and host bookings stay active, and billed, with the
//! `DevicesHeld` condition until the node reports `allocation-released` or is lost: pods of
//! the cluster may still hold the devices. Past the booking's end the booking is carried in
//! 5-minute steps, unbilled (`billable_end_ms` keeps where billing stops), for at most 24
//! hours, never over another booking: one made in advance for those devices takes them at
//! its start. Meanwhile the node is `KubernetesReleaseStuck`.
//!
//! Node loss: a node is watched once its agent has spoken to the platform. When it then
//! reports nothing (inventory or agent calls) for `--node-lost-after`, it is lost: every
//! non-terminal reservation booked on it ends `failed` (`NodeLost`), devices held on it are
//! freed, and it gets no new placements until it reports again. This applies to `hold`
//! reservations too: a unit held on a dead machine is worth nothing to the tenant, and
//! failing it refunds the quota so the tenant can book again elsewhere. A node that never
//! ran an agent (inventory reported by other tooling) is never declared lost, since nothing
//! promises that it reports regularly.

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::engine::{emit, not_found};
use super::lifecycle::terminate;
use super::store::{self, Reservation};
use super::{Binding, HostBooking, State, check_reservation_id};
use crate::audit::{self, Entry};
use crate::iam::{Permission, Principal};
use crate::store::{Batch, violates};
use crate::{App, Error, Result, events, validation};

mod carry;
mod loss;

pub use carry::carry_held;
pub use loss::detect_lost_nodes;

/// How far one carry step moves a held booking past its end.
pub const CARRY_STEP_MS: i64 = 5 * 60_000;
/// How long past its end a held booking may be carried.
pub const CARRY_MAX_MS: i64 = 24 * 3_600_000;

/// The reason a reservation ends with when its node is lost.
pub const NODE_LOST: &str = "node-lost";
/// The reason a reservation ends with when its node could not bind it.
pub const BINDING_FAILED: &str = "binding-failed";

/// Where a reservation's binding stands on its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BindingStatus {
    /// The node is asked to bind the devices.
    Binding,
    /// The node reported the devices bound.
    Bound,
    /// The node is asked to unbind; held devices stay booked until it reports them released.
    Unbinding,
    /// The node gave the devices back.
    Released,
    /// The node could not bind them.
    Failed,
    /// The node was lost.
    Lost,
}

impl BindingStatus {
    const ALL: [BindingStatus; 6] = [
        BindingStatus::Binding,
        BindingStatus::Bound,
        BindingStatus::Unbinding,
        BindingStatus::Released,
        BindingStatus::Failed,
        BindingStatus::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BindingStatus::Binding => "binding",
            BindingStatus::Bound => "bound",
            BindingStatus::Unbinding => "unbinding",
            BindingStatus::Released => "released",
            BindingStatus::Failed => "failed",
            BindingStatus::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Option<BindingStatus> {
        BindingStatus::ALL.into_iter().find(|b| b.as_str() == s)
    }

    /// What the node must do now, if anything.
    pub fn action(self) -> Option<Action> {
        match self {
            BindingStatus::Binding => Some(Action::Bind),
            BindingStatus::Unbinding => Some(Action::Unbind),
            _ => None,
        }
    }
}

/// What a node must do for a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Bind,
    Unbind,
}

/// What a node agent reports about one reservation.
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Report {
    /// `bound`, `allocation-released` or `failed`.
    pub status: String,
    /// What happened, in the node's words (at most 1000 characters).
    #[serde(default)]
    pub message: Option<String>,
}

/// The statuses a node may report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    Bound,
    AllocationReleased,
    Failed,
}

impl Report {
    /// Checks the report: a known status and a bounded message.
    pub fn validate(&self) -> Result<Reported> {
        if let Some(message) = &self.message {
            validation::text("message", message, 1000)?;
        }
        match self.status.as_str() {
            "bound" => Ok(Reported::Bound),
            "allocation-released" => Ok(Reported::AllocationReleased),
            "failed" => Ok(Reported::Failed),
            other => Err(Error::invalid(
                "status",
                format!("{other:?} is not one of bound, allocation-released, failed"),
            )),
        }
    }
}

/// What a report does to a binding in `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `binding → bound`: the reservation becomes `active`.
    Activate,
    /// The binding fails: the reservation ends `failed`.
    Fail,
    /// Held devices are freed: their bookings end now.
    FreeDevices,
    /// The report repeats what is already known: nothing changes.
    Unchanged,
    /// The report does not fit the binding's status.
    Refuse,
}

/// The state table of node reports.
pub fn outcome(status: BindingStatus, reported: Reported) -> Outcome {
    use BindingStatus as S;
    match (status, reported) {
        (S::Binding, Reported::Bound) => Outcome::Activate,
        (S::Bound, Reported::Bound) => Outcome::Unchanged,
        (S::Binding | S::Bound, Reported::Failed) => Outcome::Fail,
        (S::Failed, Reported::Failed) => Outcome::Unchanged,
        (S::Unbinding, Reported::AllocationReleased) => Outcome::FreeDevices,
        (S::Released | S::Lost, Reported::AllocationReleased) => Outcome::Unchanged,
        _ => Outcome::Refuse,
    }
}

/// Whether ending a reservation in `state` for `reason` keeps its devices booked: only a
/// bound `kubernetes` reservation that is released or runs out (pods may still hold the
/// devices); preemption, reclaim, failures and node loss free them at once.
pub fn keeps_devices(binding: Binding, status: BindingStatus, state: State, reason: &str) -> bool {
    binding == Binding::Kubernetes
        && status == BindingStatus::Bound
        && matches!(state, State::Released | State::Expired)
        && matches!(reason, "release" | "lease-lapsed" | "window-ended")
}

/// What the reconciler does with a held booking that ends at `end` when it is `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carry {
    /// The booking still runs: nothing to do.
    Keep,
    /// Carry the booking to this end (after now).
    Extend(i64),
    /// Carry the booking to this end (at or before now; possibly its current end) and end
    /// it there: the 24-hour cap or another booking's start was reached.
    Stop(i64),
}

/// The end the next carry aims at: the first 5-minute step past `now`, capped at 24 hours
/// past the booking's original (billed) end.
pub fn carry_target(end: i64, now: i64, original_end: i64) -> i64 {
    let steps = (now - end).max(0) / CARRY_STEP_MS + 1;
    end.saturating_add(steps * CARRY_STEP_MS)
        .min(original_end.saturating_add(CARRY_MAX_MS))
}

/// One carry decision for a held booking ending at `end`, originally at `original_end`,
/// where `next_start` is the earliest start of another booking of its units in
/// `[end, carry_target)`. A carried booking never overlaps another: it yields at its start.
pub fn carry_step(end: i64, now: i64, original_end: i64, next_start: Option<i64>) -> Carry {
    if end > now {
        return Carry::Keep;
    }
    let limit = carry_target(end, now, original_end).min(next_start.unwrap_or(i64::MAX));
    let limit = limit.max(end);
    if limit > now {
        Carry::Extend(limit)
    } else {
        Carry::Stop(limit)
    }
}

/// Whether a node last seen at `last_seen` is lost at `now`.
pub fn is_lost(last_seen: i64, lost_after_ms: i64, now: i64) -> bool {
    last_seen.saturating_add(lost_after_ms) <= now
}

/// A reservation's binding as its node and its tenant see it. Instants are epoch ms.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BindingView {
    pub reservation_id: String,
    pub tenant_id: String,
    pub node_id: String,
    pub binding: Binding,
    pub status: BindingStatus,
    /// What the node must do now (`bind` or `unbind`), if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    pub unit_ids: Vec<String>,
    /// Host resources the node enforces with the devices.
    pub resources: HostBooking,
    /// The reservation's window.
    pub start: i64,
    pub end: i64,
    /// The reservation's state.
    pub state: State,
    pub requested_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unbind_requested_at: Option<i64>,
    /// Until when the devices are booked while the node still holds them (carried in
    /// 5-minute steps past their end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_until: Option<i64>,
    /// Since when the held devices outlive their booking's end (the node is
    /// `KubernetesReleaseStuck`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stuck_since: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released_at: Option<i64>,
    /// The node's last message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A binding row.
#[derive(Clone, Debug)]
struct Row {
    reservation_id: String,
    node_id: String,
    status: BindingStatus,
    message: Option<String>,
    requested_at: i64,
    bound_at: Option<i64>,
    unbind_requested_at: Option<i64>,
    stuck_since: Option<i64>,
    released_at: Option<i64>,
}

const COLUMNS: &str = "reservation_id, node_id, status, message, requested_at, bound_at, \
                       unbind_requested_at, stuck_since, released_at";

fn from_row(r: &AnyRow) -> Result<Row> {
    let status: String = r.get("status");
    Ok(Row {
        reservation_id: r.get("reservation_id"),
        node_id: r.get("node_id"),
        status: BindingStatus::parse(&status)
            .ok_or_else(|| anyhow::anyhow!("stored binding status {status:?}"))?,
        message: r.get("message"),
        requested_at: r.get("requested_at"),
        bound_at: r.get("bound_at"),
        unbind_requested_at: r.get("unbind_requested_at"),
        stuck_since: r.get("stuck_since"),
        released_at: r.get("released_at"),
    })
}

async fn find_row(conn: &mut AnyConnection, id: &str, lock: &str) -> Result<Option<Row>> {
    sqlx::query(&format!(
        "SELECT {COLUMNS} FROM reservation_bindings WHERE reservation_id = $1{lock}"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?
    .as_ref()
    .map(from_row)
    .transpose()
}

async fn save_row(conn: &mut AnyConnection, row: &Row, now: i64) -> Result<()> {
    sqlx::query(
        "UPDATE reservation_bindings SET status = $1, message = $2, bound_at = $3, unbind_requested_at = $4,
             stuck_since = $5, released_at = $6, updated_at = $7
         WHERE reservation_id = $8",
    )
    .bind(row.status.as_str())
    .bind(&row.message)
    .bind(row.bound_at)
    .bind(row.unbind_requested_at)
    .bind(row.stuck_since)
    .bind(row.released_at)
    .bind(now)
    .bind(&row.reservation_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn binding_str(binding: Binding) -> &'static str {
    match binding {
        Binding::Hold => "hold",
        Binding::Node => "node",
        Binding::Kubernetes => "kubernetes",
    }
}

/// Adds to `batch` the request that the reservation's node bind it (the reconciler's
/// `placed → binding`).
pub fn push_request_bind(batch: &mut Batch, r: &Reservation, now: i64) {
    batch.push(
        "INSERT INTO reservation_bindings (reservation_id, node_id, binding, status, requested_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (reservation_id) DO NOTHING",
        vec![
            (&r.id).into(),
            r.node_id.as_deref().unwrap_or_default().into(),
            binding_str(r.binding).into(),
            BindingStatus::Binding.as_str().into(),
            now.into(),
        ],
    );
}

/// Part of ending `r` in `state` for `reason`: asks its node to unbind, or records why it
/// cannot. Returns whether its bookings stay active because the node still holds the
/// devices (`DevicesHeld`, set on `r`).
pub async fn on_terminate(
    conn: &mut AnyConnection,
    r: &mut Reservation,
    state: State,
    reason: &str,
    now: i64,
) -> Result<bool> {
    if r.binding == Binding::Hold {
        return Ok(false);
    }
    let Some(mut row) = find_row(conn, &r.id, "").await? else {
        return Ok(false);
    };
    if !matches!(row.status, BindingStatus::Binding | BindingStatus::Bound) {
        return Ok(false);
    }
    let keep = keeps_devices(r.binding, row.status, state, reason);
    row.status = match reason {
        NODE_LOST => BindingStatus::Lost,
        BINDING_FAILED => BindingStatus::Failed,
        _ => BindingStatus::Unbinding,
    };
    if row.status == BindingStatus::Unbinding {
        row.unbind_requested_at = Some(now);
    }
    save_row(conn, &row, now).await?;
    if keep {
        r.set_condition(
            "DevicesHeld",
            "AwaitingAllocationRelease",
            "the node withdraws the devices from the kubelet; they stay booked until it reports no pod holds them".into(),
            now,
        );
    }
    Ok(keep)
}

/// The caller may act for the node's owner with `inventory.write`; otherwise the node
/// does not exist. Each call counts as the node reporting.
async fn node_as_agent(
    conn: &mut AnyConnection,
    caller: &Principal,
    node_id: &str,
    now: i64,
) -> Result<String> {
    validation::id("nodeId", node_id)?;
    let org: Option<String> = sqlx::query_scalar("SELECT org_id FROM nodes WHERE id = $1")
        .bind(node_id)
        .fetch_optional(&mut *conn)
        .await?;
    let org = org
        .filter(|org| caller.has(Permission::InventoryWrite) && caller.acts_for(org))
        .ok_or_else(|| Error::not_found(format_args!("node {node_id}")))?;
    sqlx::query("UPDATE nodes SET last_seen_at = $1, agent_seen_at = $1 WHERE id = $2")
        .bind(now)
        .bind(node_id)
        .execute(&mut *conn)
        .await?;
    crate::inventory::nodes::recover(conn, node_id, &org, now).await?;
    Ok(org)
}

async fn view(conn: &mut AnyConnection, row: &Row, r: &Reservation) -> Result<BindingView> {
    let held_until: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(MAX(end_ms) AS BIGINT) FROM bookings WHERE reservation_id = $1 AND active = $2",
    )
    .bind(&r.id)
    .bind(true)
    .fetch_one(&mut *conn)
    .await?;
    Ok(BindingView {
        reservation_id: r.id.clone(),
        tenant_id: r.tenant_id.clone(),
        node_id: row.node_id.clone(),
        binding: r.binding,
        status: row.status,
        action: row.status.action(),
        unit_ids: r.unit_ids.clone(),
        resources: r.resources,
        start: r.start_ms,
        end: r.end_ms,
        state: r.state,
        requested_at: row.requested_at,
        bound_at: row.bound_at,
        unbind_requested_at: row.unbind_requested_at,
        held_until: held_until.filter(|_| row.status == BindingStatus::Unbinding),
        stuck_since: row.stuck_since,
        released_at: row.released_at,
        message: row.message.clone(),
    })
}

/// The binding `get` shows: once a node reported the devices bound.
pub async fn view_of(conn: &mut AnyConnection, r: &Reservation) -> Result<Option<BindingView>> {
    if r.binding == Binding::Hold {
        return Ok(None);
    }
    match find_row(conn, &r.id, "").await? {
        Some(row) if row.bound_at.is_some() => Ok(Some(view(conn, &row, r).await?)),
        _ => Ok(None),
    }
}

/// `GET /v1/nodes/{nodeId}/bindings`: what the node must bind or unbind now, oldest request
/// first; at most `limit` of those after the reservation `after`, read as one page.
pub async fn pending_for_node(
    app: &App,
    caller: &Principal,
    node_id: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<BindingView>> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    node_as_agent(&mut tx, caller, node_id, now).await?;
    // The cursor is a reservation id; the page goes on from where its request stands.
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM reservation_bindings WHERE node_id = $1 AND status IN ($2, $3)
         AND ($4 = '' OR (requested_at, reservation_id) >
              (SELECT requested_at, reservation_id FROM reservation_bindings WHERE reservation_id = $4))
         ORDER BY requested_at, reservation_id LIMIT $5"
    ))
    .bind(node_id)
    .bind(BindingStatus::Binding.as_str())
    .bind(BindingStatus::Unbinding.as_str())
    .bind(after.unwrap_or(""))
    .bind(limit.min(i64::MAX as usize) as i64)
    .fetch_all(&mut **tx)
    .await?
    .iter()
    .map(from_row)
    .collect::<Result<Vec<_>>>()?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if let Some(r) = store::find(&mut tx, &row.reservation_id, "").await? {
            out.push(view(&mut tx, &row, &r).await?);
        }
    }
    tx.commit().await?;
    Ok(out)
}

/// `POST /v1/nodes/{nodeId}/bindings/{reservationId}`: the node reports on one reservation.
pub async fn report(
    app: &App,
    caller: &Principal,
    node_id: &str,
    reservation_id: &str,
    report: Report,
) -> Result<BindingView> {
    let now = app.now_ms();
    check_reservation_id("reservationId", reservation_id)?;
    let reported = report.validate()?;
    let mut tx = app.store.begin().await?;
    let org = node_as_agent(&mut tx, caller, node_id, now).await?;
    let lock = app.store.for_update();
    let mut r = store::find(&mut tx, reservation_id, lock)
        .await?
        .ok_or_else(|| not_found(reservation_id))?;
    let mut row = match find_row(&mut tx, reservation_id, lock).await? {
        Some(row) if row.node_id == node_id => row,
        _ => return Err(not_found(reservation_id)),
    };
    let mut freed = false;
    match outcome(row.status, reported) {
        Outcome::Refuse => {
            return Err(Error::InvalidState(format!(
                "the binding of reservation {reservation_id} is {}; {:?} does not apply",
                row.status.as_str(),
                report.status
            )));
        }
        Outcome::Unchanged => {}
        Outcome::Activate => {
            if r.state != State::Binding {
                return Err(Error::InvalidState(format!(
                    "reservation {reservation_id} is {}",
                    r.state.as_str()
                )));
            }
            r.state = State::Active;
            r.operate("bind", now);
            if !store::update(&mut tx, &mut r).await? {
                return Err(Error::conflict(
                    "the reservation changed concurrently; retry",
                    None,
                ));
            }
            row.status = BindingStatus::Bound;
            row.bound_at = Some(now);
            row.message = report.message.clone();
            save_row(&mut tx, &row, now).await?;
            emit(
                &mut tx,
                &r,
                "reservation.active",
                json!({ "nodeId": node_id }),
            )
            .await?;
        }
        Outcome::Fail => {
            let message = report
                .message
                .clone()
                .unwrap_or_else(|| "the node could not bind the devices".into());
            r.set_condition("BindingFailed", "NodeReportedFailure", message, now);
            terminate(&mut tx, &mut r, State::Failed, BINDING_FAILED, now).await?;
            row = find_row(&mut tx, reservation_id, "")
                .await?
                .ok_or_else(|| not_found(reservation_id))?;
            row.message = report.message.clone();
            save_row(&mut tx, &row, now).await?;
            freed = true;
        }
        Outcome::FreeDevices => {
            free_devices(&mut tx, &mut r, &mut row, "allocation-released", now).await?;
            row.message = report.message.clone();
            save_row(&mut tx, &row, now).await?;
            freed = true;
        }
    }
    let entry = Entry {
        org_id: &org,
        action: "node.binding-report",
        object_type: "compute-reservation",
        object_id: reservation_id,
        reason: report.message.as_deref(),
        details: Some(json!({ "nodeId": node_id, "status": report.status })),
    };
    audit::record(&mut tx, caller, entry, now).await?;
    let answer = view(&mut tx, &row, &r).await?;
    tx.commit().await?;
    if freed {
        app.capacity.forget(&r.node_ids()).await;
        crate::reconciler::wake_pool(app, &r.pool_id, &r.node_ids()).await?;
    }
    Ok(answer)
}

/// Ends the bookings of devices a node held at `now` and closes the unbind (`reason`:
/// `allocation-released` or `node-lost`).
async fn free_devices(
    conn: &mut AnyConnection,
    r: &mut Reservation,
    row: &mut Row,
    reason: &str,
    now: i64,
) -> Result<()> {
    store::release_bookings(conn, &r.id, now).await?;
    row.status = if reason == NODE_LOST {
        BindingStatus::Lost
    } else {
        BindingStatus::Released
    };
    row.released_at = Some(now);
    save_row(conn, row, now).await?;
    let had = r.conditions.iter().any(|c| c.kind == "DevicesHeld");
    r.clear_condition("DevicesHeld");
    r.operate(reason, now);
    store::update(conn, r).await?;
    if had {
        emit(
            conn,
            r,
            "reservation.allocation-released",
            json!({ "reason": reason, "nodeId": row.node_id }),
        )
        .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;
    const HOUR: i64 = 60 * MIN;

    #[test]
    fn a_booking_that_still_runs_is_kept() {
        assert_eq!(
            carry_step(100 * MIN, 99 * MIN, 100 * MIN, None),
            Carry::Keep
        );
    }

    #[test]
    fn a_booking_at_its_end_is_carried_one_five_minute_step() {
        assert_eq!(
            carry_step(HOUR, HOUR, HOUR, None),
            Carry::Extend(HOUR + 5 * MIN)
        );
        assert_eq!(
            carry_step(HOUR, HOUR + 1, HOUR, None),
            Carry::Extend(HOUR + 5 * MIN)
        );
    }

    #[test]
    fn a_late_pass_carries_to_the_first_step_past_now() {
        assert_eq!(
            carry_step(HOUR, HOUR + 12 * MIN, HOUR, None),
            Carry::Extend(HOUR + 15 * MIN)
        );
        assert_eq!(
            carry_step(HOUR + 5 * MIN, HOUR + 10 * MIN, HOUR, None),
            Carry::Extend(HOUR + 15 * MIN)
        );
    }

    #[test]
    fn the_carry_is_capped_at_24_hours_past_the_original_end() {
        let cap = HOUR + CARRY_MAX_MS;
        assert_eq!(
            carry_step(cap - 2 * MIN, cap - 3 * MIN + 5 * MIN, HOUR, None),
            Carry::Stop(cap)
        );
        assert_eq!(
            carry_step(cap - MIN, cap - MIN, HOUR, None),
            Carry::Extend(cap)
        );
        assert_eq!(carry_step(cap, cap, HOUR, None), Carry::Stop(cap));
        assert_eq!(
            carry_step(HOUR + 5 * MIN, 100 * HOUR, HOUR, None),
            Carry::Stop(cap)
        );
    }

    #[test]
    fn the_carry_yields_to_another_bookings_start() {
        let other = HOUR + 7 * MIN;
        assert_eq!(
            carry_step(HOUR + 5 * MIN, HOUR + 6 * MIN, HOUR, Some(other)),
            Carry::Extend(other)
        );
        assert_eq!(
            carry_step(other, HOUR + 8 * MIN, HOUR, Some(other)),
            Carry::Stop(other)
        );
        assert_eq!(
            carry_step(HOUR, HOUR + 30 * MIN, HOUR, Some(HOUR + 2 * MIN)),
            Carry::Stop(HOUR + 2 * MIN)
        );
        assert_eq!(carry_step(HOUR, HOUR, HOUR, Some(HOUR)), Carry::Stop(HOUR));
    }

    #[test]
    fn the_carry_target_never_passes_the_cap() {
        assert_eq!(carry_target(HOUR, HOUR, HOUR), HOUR + 5 * MIN);
        assert_eq!(carry_target(HOUR, 1000 * HOUR, HOUR), HOUR + CARRY_MAX_MS);
    }

    #[test]
    fn reports_follow_the_binding_state_table() {
        use BindingStatus as S;
        assert_eq!(outcome(S::Binding, Reported::Bound), Outcome::Activate);
        assert_eq!(outcome(S::Bound, Reported::Bound), Outcome::Unchanged);
        assert_eq!(outcome(S::Binding, Reported::Failed), Outcome::Fail);
        assert_eq!(outcome(S::Bound, Reported::Failed), Outcome::Fail);
        assert_eq!(
            outcome(S::Unbinding, Reported::AllocationReleased),
            Outcome::FreeDevices
        );
        assert_eq!(
            outcome(S::Released, Reported::AllocationReleased),
            Outcome::Unchanged
        );
        assert_eq!(
            outcome(S::Binding, Reported::AllocationReleased),
            Outcome::Refuse
        );
        assert_eq!(outcome(S::Unbinding, Reported::Bound), Outcome::Refuse);
        assert_eq!(outcome(S::Lost, Reported::Bound), Outcome::Refuse);
    }

    #[test]
    fn only_a_released_or_ended_bound_kubernetes_binding_keeps_its_devices() {
        let k = Binding::Kubernetes;
        let bound = BindingStatus::Bound;
        assert!(keeps_devices(k, bound, State::Released, "release"));
        assert!(keeps_devices(k, bound, State::Released, "lease-lapsed"));
        assert!(keeps_devices(k, bound, State::Expired, "window-ended"));
        assert!(!keeps_devices(k, bound, State::Failed, NODE_LOST));
        assert!(!keeps_devices(k, bound, State::Released, "preempted"));
        assert!(!keeps_devices(
            k,
            BindingStatus::Binding,
            State::Released,
            "release"
        ));
        assert!(!keeps_devices(
            Binding::Node,
            bound,
            State::Released,
            "release"
        ));
    }

    #[test]
    fn a_report_needs_a_known_status() {
        let report = |status: &str| Report {
            status: status.into(),
            message: None,
        };
        assert_eq!(report("bound").validate().unwrap(), Reported::Bound);
        assert_eq!(
            report("allocation-released").validate().unwrap(),
            Reported::AllocationReleased
        );
        assert!(report("done").validate().is_err());
        let long = Report {
            status: "failed".into(),
            message: Some("x".repeat(1001)),
        };
        assert!(long.validate().is_err());
    }

    #[test]
    fn a_node_is_lost_once_silent_for_the_configured_time() {
        assert!(!is_lost(0, 5 * MIN, 5 * MIN - 1));
        assert!(is_lost(0, 5 * MIN, 5 * MIN));
    }
}
