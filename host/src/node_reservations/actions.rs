//! Changing node reservations: create, release units to spot, end, re-affirm, and the
//! review that a topology change forces. Each runs in one transaction with its audit entry
//! and event.

use serde::Deserialize;
use serde_json::json;
use sqlx::{AnyConnection, Row as _};

use super::queries::{Filter, NodeReservation, Record, load, parse_instant};
use super::{Lifecycle, Status, Term, audience_with_ops, may_manage_capacity};
use crate::audit::{self, Entry};
use crate::events;
use crate::iam::{Permission, Principal};
use crate::ids::new_id;
use crate::inventory::nodes::{self, Node};
use crate::spot;
use crate::store::{Tx, placeholders, to_json, violates};
use crate::validation;
use crate::{App, Error, Result};

/// The database constraint that keeps two claims on one unit from overlapping.
const NO_OVERLAP: &str = "node_reservation_units_no_overlap";

/// `POST /v1/nodes/{nodeId}/reservations` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewNodeReservation {
    /// GPU unit ids to reserve: sellable units of a reservable class (`vfio-group` or
    /// `device-request`) of a single-class node.
    pub unit_ids: Vec<String>,
    /// The audience. The platform ops org is added automatically.
    pub allowed_org_ids: Vec<String>,
    pub managing_org_ids: Option<Vec<String>>,
    /// RFC 3339; defaults to now.
    pub starts_at: Option<String>,
    /// RFC 3339; omit for open-ended.
    pub ends_at: Option<String>,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
}

/// `POST …/release` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseUnits {
    pub unit_ids: Vec<String>,
    /// Recorded in the audit trail.
    pub reason: Option<String>,
}

/// `POST …/reclaim` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReclaimUnits {
    pub unit_ids: Vec<String>,
    /// Recorded in the audit trail.
    pub reason: Option<String>,
    /// Report what would be terminated, and change nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// Body of `…/end` and `…/reaffirm`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Because {
    /// Recorded in the audit trail.
    pub reason: Option<String>,
}

fn validate_orgs(field: &str, orgs: &[String]) -> Result<()> {
    if orgs.len() > 256 {
        return Err(Error::invalid(field, "at most 256 orgs"));
    }
    orgs.iter()
        .enumerate()
        .try_for_each(|(i, org)| validation::id(&format!("{field}[{i}]"), org))
}

/// Reserves units of one node for an audience. Overlap with another non-terminal
/// reservation of any of the units is refused atomically, naming the conflicts.
pub async fn create(
    app: &App,
    caller: &Principal,
    node_id: &str,
    new: NewNodeReservation,
) -> Result<NodeReservation> {
    caller.require_ops(
        Permission::ReservationManage,
        format_args!("node {node_id}"),
    )?;
    validation::unit_ids("unitIds", &new.unit_ids)?;
    validate_orgs("allowedOrgIds", &new.allowed_org_ids)?;
    let managing = new.managing_org_ids.unwrap_or_default();
    validate_orgs("managingOrgIds", &managing)?;
    validation::opt_text("contractRef", new.contract_ref.as_deref(), 256)?;
    validation::opt_text("reason", new.reason.as_deref(), 1024)?;
    let now = app.now_ms();
    let starts_at = new
        .starts_at
        .as_deref()
        .map(|s| parse_instant("startsAt", s))
        .transpose()?
        .unwrap_or(now);
    let ends_at = new
        .ends_at
        .as_deref()
        .map(|s| parse_instant("endsAt", s))
        .transpose()?;
    if let Some(end) = ends_at {
        if end <= starts_at {
            return Err(Error::invalid("endsAt", "must be after startsAt"));
        }
        if end <= now {
            return Err(Error::invalid("endsAt", "must be in the future"));
        }
    }
    let term = Term { starts_at, ends_at };
    let allowed = audience_with_ops(&new.allowed_org_ids);
    let mut managing_unique: Vec<String> = Vec::new();
    for org in managing {
        if !managing_unique.contains(&org) {
            managing_unique.push(org);
        }
    }

    let mut tx = app.store.begin().await?;
    // Creates on one node take turns: two transactions inserting conflicting claims at once
    // could otherwise each wait for the other inside the exclusion constraint (a deadlock
    // PostgreSQL resolves by failing one of them).
    sqlx::query(&format!(
        "SELECT id FROM nodes WHERE id = $1{}",
        app.store.for_update()
    ))
    .bind(node_id)
    .fetch_optional(&mut **tx)
    .await?;
    let node = nodes::find(&mut tx, node_id)
        .await?
        .ok_or_else(|| Error::not_found(format_args!("node {node_id}")))?;
    check_reservable(&node, &new.unit_ids)?;
    check_orgs_exist(&mut tx, "allowedOrgIds", &allowed).await?;
    check_orgs_exist(&mut tx, "managingOrgIds", &managing_unique).await?;
    let conflicts = overlapping(&mut tx, node_id, &new.unit_ids, term).await?;
    if !conflicts.is_empty() {
        return Err(overlap_error(conflicts));
    }
    let id = new_id("nrsv", now);
    let record = Record {
        id: id.clone(),
        node_id: node_id.to_string(),
        unit_ids: new.unit_ids.clone(),
        released_unit_ids: Vec::new(),
        allowed_org_ids: allowed,
        managing_org_ids: managing_unique,
        term,
        lifecycle: Lifecycle::Granted,
        topology_gen: node.topology_gen,
        contract_ref: new.contract_ref,
        reason: new.reason,
        created_at: now,
        updated_at: now,
    };
    match insert(&mut tx, &record).await {
        Ok(()) => {}
        Err(err) if violates(&err, NO_OVERLAP) => {
            // Lost a race with a concurrent create: report what won.
            tx.rollback().await?;
            let mut conn = app.store.pool().acquire().await?;
            return Err(overlap_error(
                overlapping(&mut conn, node_id, &new.unit_ids, term).await?,
            ));
        }
        Err(err) => return Err(err.into()),
    }
    let view = record.view(now);
    let details = json!({ "unitIds": record.unit_ids, "allowedOrgIds": record.allowed_org_ids });
    let change = Change {
        action: "node-reservation.create",
        event: "node-reservation.created",
        details,
        reason: record.reason.clone(),
    };
    record_change(&mut tx, caller, &node, &record, change, now).await?;
    commit(app, tx, &node.id).await?;
    Ok(view)
}

/// Commits a change of a reservation on `node_id`, and has this replica's capacity view
/// read the node again, so this replica's next read sees it without waiting for the
/// announcement.
async fn commit(app: &App, tx: Tx, node_id: &str) -> Result<()> {
    tx.commit().await?;
    app.capacity.forget(&[node_id.to_string()]).await;
    Ok(())
}

fn check_reservable(node: &Node, unit_ids: &[String]) -> Result<()> {
    if !node.single_class {
        return Err(Error::invalid(
            "unitIds",
            format!(
                "node {} mixes GPU unit classes; only single-class nodes are reservable",
                node.id
            ),
        ));
    }
    let mut unknown = Vec::new();
    for (i, id) in unit_ids.iter().enumerate() {
        match node.units.iter().find(|u| &u.id == id) {
            None => unknown.push(id.as_str()),
            Some(unit) if !unit.class.is_reservable() => {
                return Err(Error::invalid(
                    format!("unitIds[{i}]"),
                    format!(
                        "unit {id} is a {} unit; only vfio-group and device-request units are reservable",
                        unit.class.as_str()
                    ),
                ));
            }
            Some(unit) if !unit.sellable => {
                return Err(Error::invalid(
                    format!("unitIds[{i}]"),
                    format!("unit {id} is not sellable"),
                ));
            }
            Some(_) => {}
        }
    }
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid(
            "unitIds",
            format!("not units of node {}: {}", node.id, unknown.join(", ")),
        ))
    }
}

async fn check_orgs_exist(conn: &mut AnyConnection, field: &str, orgs: &[String]) -> Result<()> {
    if orgs.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "SELECT id FROM orgs WHERE id IN ({})",
        placeholders(1, orgs.len())
    );
    let mut query = sqlx::query_scalar::<_, String>(&sql);
    for org in orgs {
        query = query.bind(org);
    }
    let found = query.fetch_all(conn).await?;
    let missing: Vec<&str> = orgs
        .iter()
        .filter(|o| !found.contains(o))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid(
            field,
            format!("unknown orgs: {}", missing.join(", ")),
        ))
    }
}

/// Non-cancelled reservations claiming any of `unit_ids` of the node during `term`, with
/// the units they claim.
async fn overlapping(
    conn: &mut AnyConnection,
    node_id: &str,
    unit_ids: &[String],
    term: Term,
) -> Result<Vec<(String, Vec<String>)>> {
    let sql = format!(
        "SELECT reservation_id, unit_id FROM node_reservation_units
         WHERE claiming AND node_id = $1 AND starts_at < $2 AND (ends_at IS NULL OR ends_at > $3)
           AND unit_id IN ({})
         ORDER BY reservation_id, position",
        placeholders(4, unit_ids.len())
    );
    let mut query = sqlx::query(&sql)
        .bind(node_id)
        .bind(term.ends_at.unwrap_or(i64::MAX))
        .bind(term.starts_at);
    for unit in unit_ids {
        query = query.bind(unit);
    }
    let mut conflicts: Vec<(String, Vec<String>)> = Vec::new();
    for row in query.fetch_all(conn).await? {
        let reservation: String = row.get("reservation_id");
        let unit: String = row.get("unit_id");
        match conflicts.last_mut() {
            Some((id, units)) if *id == reservation => units.push(unit),
            _ => conflicts.push((reservation, vec![unit])),
        }
    }
    Ok(conflicts)
}

fn overlap_error(conflicts: Vec<(String, Vec<String>)>) -> Error {
    let details: Vec<_> = conflicts
        .iter()
        .map(|(id, units)| json!({ "reservationId": id, "unitIds": units }))
        .collect();
    let names: Vec<String> = conflicts
        .iter()
        .map(|(id, units)| format!("{id} ({})", units.join(", ")))
        .collect();
    Error::conflict(
        format!(
            "units are already reserved for an overlapping term by {}",
            names.join("; ")
        ),
        Some(json!({ "conflicts": details })),
    )
}

async fn insert(conn: &mut AnyConnection, r: &Record) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO node_reservations (id, node_id, allowed_org_ids, managing_org_ids, starts_at, ends_at, lifecycle,
                                        topology_gen, contract_ref, reason, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)",
    )
    .bind(&r.id)
    .bind(&r.node_id)
    .bind(to_json(&r.allowed_org_ids))
    .bind(to_json(&r.managing_org_ids))
    .bind(r.term.starts_at)
    .bind(r.term.ends_at)
    .bind(r.lifecycle.as_str())
    .bind(r.topology_gen)
    .bind(&r.contract_ref)
    .bind(&r.reason)
    .bind(r.created_at)
    .execute(&mut *conn)
    .await?;
    for (position, unit) in r.unit_ids.iter().enumerate() {
        sqlx::query(
            "INSERT INTO node_reservation_units (reservation_id, node_id, unit_id, position, starts_at, ends_at, released, claiming)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&r.id)
        .bind(&r.node_id)
        .bind(unit)
        .bind(position as i64)
        .bind(r.term.starts_at)
        .bind(r.term.ends_at)
        .bind(false)
        .bind(true)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Loads one reservation of a node for a change, locking it on PostgreSQL.
async fn load_for_change(
    app: &App,
    tx: &mut Tx,
    node_id: &str,
    id: &str,
) -> Result<Option<(Node, Record)>> {
    let Some(node) = nodes::find(tx, node_id).await? else {
        return Ok(None);
    };
    let record = load(tx, Filter::Id(id), app.store.for_update())
        .await?
        .into_iter()
        .next();
    Ok(record.filter(|r| r.node_id == node_id).map(|r| (node, r)))
}

/// Loads an active reservation whose capacity `caller` manages and checks that it reserves
/// every one of `unit_ids`: what release and reclaim both start with.
async fn load_for_capacity(
    app: &App,
    tx: &mut Tx,
    caller: &Principal,
    node_id: &str,
    id: &str,
    unit_ids: &[String],
    now: i64,
) -> Result<(Node, Record)> {
    let not_found = || Error::not_found(format_args!("reservation {id} on node {node_id}"));
    let (node, record) = load_for_change(app, tx, node_id, id)
        .await?
        .ok_or_else(not_found)?;
    if !may_manage_capacity(caller, &node.org_id, &record.rights(now)) {
        return Err(not_found());
    }
    let status = record.status(now);
    if status != Status::Active {
        return Err(Error::InvalidState(format!(
            "reservation {id} is {}; only an active reservation inside its term releases or reclaims units",
            status.as_str()
        )));
    }
    let not_reserved: Vec<&str> = unit_ids
        .iter()
        .filter(|u| !record.unit_ids.contains(u))
        .map(String::as_str)
        .collect();
    if !not_reserved.is_empty() {
        return Err(Error::invalid(
            "unitIds",
            format!("not reserved by {id}: {}", not_reserved.join(", ")),
        ));
    }
    Ok((node, record))
}

/// Marks `unit_ids` of reservation `id` as released to spot or back in exclusive use.
async fn mark_released(
    tx: &mut Tx,
    record: &mut Record,
    unit_ids: &[String],
    released: bool,
    now: i64,
) -> Result<()> {
    let sql = format!(
        "UPDATE node_reservation_units SET released = $1 WHERE reservation_id = $2 AND unit_id IN ({})",
        placeholders(3, unit_ids.len())
    );
    let mut query = sqlx::query(&sql).bind(released).bind(&record.id);
    for unit in unit_ids {
        query = query.bind(unit);
    }
    query.execute(&mut ***tx).await?;
    touch(tx, &record.id, now).await?;
    let was_released = std::mem::take(&mut record.released_unit_ids);
    record.released_unit_ids = record
        .unit_ids
        .iter()
        .filter(|u| {
            if unit_ids.contains(u) {
                released
            } else {
                was_released.contains(u)
            }
        })
        .cloned()
        .collect();
    record.updated_at = now;
    Ok(())
}

/// Puts reserved units on the spot market (double sell). Callable by a platform operator,
/// the node's owner, or a managing org while the reservation is active.
pub async fn release(
    app: &App,
    caller: &Principal,
    node_id: &str,
    id: &str,
    body: ReleaseUnits,
) -> Result<NodeReservation> {
    validation::unit_ids("unitIds", &body.unit_ids)?;
    validation::opt_text("reason", body.reason.as_deref(), 1024)?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let (node, mut record) =
        load_for_capacity(app, &mut tx, caller, node_id, id, &body.unit_ids, now).await?;
    if body
        .unit_ids
        .iter()
        .all(|u| record.released_unit_ids.contains(u))
    {
        // Already released: a retry changes nothing, and records nothing.
        tx.rollback().await?;
        return Ok(record.view(now));
    }
    mark_released(&mut tx, &mut record, &body.unit_ids, true, now).await?;
    let details = json!({ "unitIds": body.unit_ids, "reason": body.reason });
    let change = Change {
        action: "node-reservation.release-units",
        event: "node-reservation.units-released",
        details,
        reason: body.reason,
    };
    record_change(&mut tx, caller, &node, &record, change, now).await?;
    commit(app, tx, &node.id).await?;
    Ok(record.view(now))
}

/// Returns units to the reservation's exclusive use and terminates the spot workloads on
/// them, in one transaction; workloads that are not spot keep running and are listed as
/// skipped. A dry run reports what would happen and changes nothing. Callable by the same
/// orgs as [`release`], while the reservation is active.
pub async fn reclaim(
    app: &App,
    caller: &Principal,
    node_id: &str,
    id: &str,
    body: ReclaimUnits,
) -> Result<NodeReservation> {
    validation::unit_ids("unitIds", &body.unit_ids)?;
    validation::opt_text("reason", body.reason.as_deref(), 1024)?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let (node, mut record) =
        load_for_capacity(app, &mut tx, caller, node_id, id, &body.unit_ids, now).await?;
    let units = body.unit_ids.iter().cloned().collect();
    let workloads = spot::on_units(&mut tx, node_id, Some(&units), now).await?;
    if body.dry_run {
        let mut view = record.view(now);
        view.would_terminate = Some(workloads.spot);
        view.would_skip = Some(workloads.other);
        return Ok(view);
    }
    mark_released(&mut tx, &mut record, &body.unit_ids, false, now).await?;
    let by = spot::Reclaim {
        caller,
        owner_org_id: &node.org_id,
        node_id,
        reason: body.reason.as_deref(),
        lock: app.store.for_update(),
    };
    let terminated = spot::terminate_for_capacity(&mut tx, &workloads.spot, &by, now).await?;
    let details = json!({
        "unitIds": body.unit_ids,
        "terminated": terminated.ids,
        "skipped": workloads.other,
    });
    let change = Change {
        action: "node-reservation.reclaim-units",
        event: "node-reservation.units-reclaimed",
        details,
        reason: body.reason,
    };
    record_change(&mut tx, caller, &node, &record, change, now).await?;
    commit(app, tx, &node.id).await?;
    terminated.wake_pools(app, &node.id).await?;
    let mut view = record.view(now);
    view.terminated = Some(terminated.ids);
    view.skipped = Some(workloads.other);
    Ok(view)
}

/// Ends a reservation now (platform admins): it becomes `cancelled` and its units return
/// to the public pool at once; running workloads keep running. Ending a cancelled
/// reservation changes nothing; an expired one cannot be ended.
pub async fn end(
    app: &App,
    caller: &Principal,
    node_id: &str,
    id: &str,
    body: Because,
) -> Result<NodeReservation> {
    caller.require_ops(
        Permission::ReservationManage,
        format_args!("reservation {id} on node {node_id}"),
    )?;
    validation::opt_text("reason", body.reason.as_deref(), 1024)?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let (node, mut record) = load_for_change(app, &mut tx, node_id, id)
        .await?
        .ok_or_else(|| Error::not_found(format_args!("reservation {id} on node {node_id}")))?;
    match record.status(now) {
        Status::Cancelled => return Ok(record.view(now)),
        Status::Expired => {
            return Err(Error::InvalidState(format!(
                "reservation {id} has already expired"
            )));
        }
        _ => {}
    }
    sqlx::query("UPDATE node_reservations SET lifecycle = $1, updated_at = $2 WHERE id = $3")
        .bind(Lifecycle::Cancelled.as_str())
        .bind(now)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    sqlx::query("UPDATE node_reservation_units SET claiming = $1 WHERE reservation_id = $2")
        .bind(false)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    record.lifecycle = Lifecycle::Cancelled;
    record.updated_at = now;
    let change = Change {
        action: "node-reservation.end",
        event: "node-reservation.cancelled",
        details: json!({}),
        reason: body.reason,
    };
    record_change(&mut tx, caller, &node, &record, change, now).await?;
    commit(app, tx, &node.id).await?;
    Ok(record.view(now))
}

/// Re-affirms a `needs-review` reservation against the node's current topology (platform
/// admins). Refused when any of its units no longer exists or is no longer reservable.
pub async fn reaffirm(
    app: &App,
    caller: &Principal,
    node_id: &str,
    id: &str,
    body: Because,
) -> Result<NodeReservation> {
    caller.require_ops(
        Permission::ReservationManage,
        format_args!("reservation {id} on node {node_id}"),
    )?;
    validation::opt_text("reason", body.reason.as_deref(), 1024)?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let (node, mut record) = load_for_change(app, &mut tx, node_id, id)
        .await?
        .ok_or_else(|| Error::not_found(format_args!("reservation {id} on node {node_id}")))?;
    let status = record.status(now);
    if status != Status::NeedsReview {
        return Err(Error::InvalidState(format!(
            "reservation {id} is {}; only needs-review is re-affirmed",
            status.as_str()
        )));
    }
    let missing: Vec<&str> = record
        .unit_ids
        .iter()
        .filter(|u| {
            !node
                .units
                .iter()
                .any(|n| &n.id == *u && n.class.is_reservable() && n.sellable)
        })
        .map(String::as_str)
        .collect();
    if !missing.is_empty() || !node.single_class {
        return Err(Error::conflict(
            format!(
                "reservation {id} cannot be re-affirmed against topology generation {}: {}",
                node.topology_gen,
                if missing.is_empty() {
                    "the node is no longer single-class".to_string()
                } else {
                    format!("units gone or no longer reservable: {}", missing.join(", "))
                }
            ),
            Some(json!({ "missingUnitIds": missing, "topologyGen": node.topology_gen })),
        ));
    }
    sqlx::query("UPDATE node_reservations SET lifecycle = $1, topology_gen = $2, updated_at = $3 WHERE id = $4")
        .bind(Lifecycle::Granted.as_str())
        .bind(node.topology_gen)
        .bind(now)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    record.lifecycle = Lifecycle::Granted;
    record.topology_gen = node.topology_gen;
    record.updated_at = now;
    let details = json!({ "topologyGen": node.topology_gen });
    let change = Change {
        action: "node-reservation.reaffirm",
        event: "node-reservation.reaffirmed",
        details,
        reason: body.reason,
    };
    record_change(&mut tx, caller, &node, &record, change, now).await?;
    commit(app, tx, &node.id).await?;
    Ok(record.view(now))
}

/// After `node`'s topology changed: every reservation on it written against an older
/// generation, and not yet over, goes to `needs-review`. Runs inside the inventory change's
/// transaction.
pub async fn review_after_topology_change(
    conn: &mut AnyConnection,
    caller: &Principal,
    node: &Node,
    now: i64,
) -> Result<()> {
    let stale: Vec<Record> = load(conn, Filter::Node(&node.id), "")
        .await?
        .into_iter()
        .filter(|r| {
            r.lifecycle == Lifecycle::Granted
                && r.topology_gen < node.topology_gen
                && !r.term.has_ended(now)
        })
        .collect();
    for mut record in stale {
        sqlx::query("UPDATE node_reservations SET lifecycle = $1, updated_at = $2 WHERE id = $3")
            .bind(Lifecycle::NeedsReview.as_str())
            .bind(now)
            .bind(&record.id)
            .execute(&mut *conn)
            .await?;
        record.lifecycle = Lifecycle::NeedsReview;
        record.updated_at = now;
        let details = json!({ "reservationTopologyGen": record.topology_gen, "nodeTopologyGen": node.topology_gen });
        let change = Change {
            action: "node-reservation.needs-review",
            event: "node-reservation.needs-review",
            details,
            reason: Some("node topology changed".into()),
        };
        record_change(conn, caller, node, &record, change, now).await?;
    }
    Ok(())
}

async fn touch(conn: &mut AnyConnection, id: &str, now: i64) -> Result<()> {
    sqlx::query("UPDATE node_reservations SET updated_at = $1 WHERE id = $2")
        .bind(now)
        .bind(id)
        .execute(conn)
        .await?;
    Ok(())
}

/// One change to a reservation, as audited and announced.
struct Change {
    action: &'static str,
    event: &'static str,
    details: serde_json::Value,
    reason: Option<String>,
}

/// Audits a change (against the node owner's org) and emits its event to every org that
/// has a stake in the reservation.
async fn record_change(
    conn: &mut AnyConnection,
    caller: &Principal,
    node: &Node,
    record: &Record,
    change: Change,
    now: i64,
) -> Result<()> {
    let entry = Entry {
        org_id: &node.org_id,
        action: change.action,
        object_type: "node-reservation",
        object_id: &record.id,
        reason: change.reason.as_deref(),
        details: Some(change.details),
    };
    audit::record(conn, caller, entry, now).await?;
    let payload = json!({ "reservation": record.view(now) });
    events::emit(
        conn,
        change.event,
        &record.id,
        &record.interested_orgs(&node.org_id),
        &payload,
        now,
    )
    .await
}
