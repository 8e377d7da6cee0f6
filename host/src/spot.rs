//! Terminating spot work for capacity: the workloads on a node's units, split into the spot
//! ones (terminable by the capacity owner at any time) and the rest (never touched), and
//! the termination itself, audited, with reason `capacity-reclaim`.
//!
//! The workloads are compute reservations with bookings on the units that have not ended:
//! running now or booked for later.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::{AnyConnection, Row as _};

use crate::audit::{self, Entry};
use crate::booking::State;
use crate::booking::lifecycle::terminate;
use crate::iam::{Permission, Principal};
use crate::inventory::nodes::{self, Node};
use crate::node_reservations::queries::{Filter, load};
use crate::node_reservations::{Reach, spot_reach};
use crate::store::flag;
use crate::validation;
use crate::{App, Error, Result};

/// The reason a workload terminated for capacity records.
pub const CAPACITY_RECLAIM: &str = "capacity-reclaim";

/// The workloads on some units of a node: compute reservation ids, each listed once.
#[derive(Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Workloads {
    /// Spot workloads: terminable for capacity.
    pub spot: Vec<String>,
    /// Everything else: left running.
    pub other: Vec<String>,
}

/// The workloads holding any of `units` of `node_id` (every unit when `None`) whose
/// bookings have not ended at `now`.
pub async fn on_units(
    conn: &mut AnyConnection,
    node_id: &str,
    units: Option<&BTreeSet<String>>,
    now: i64,
) -> Result<Workloads> {
    let rows = sqlx::query(
        "SELECT reservation_id, unit_id, spot FROM bookings
         WHERE node_id = $1 AND active IS TRUE AND end_ms > $2
         ORDER BY reservation_id",
    )
    .bind(node_id)
    .bind(now)
    .fetch_all(&mut *conn)
    .await?;
    let mut spot = BTreeSet::new();
    let mut other = BTreeSet::new();
    for row in &rows {
        let unit: String = row.get("unit_id");
        if units.is_some_and(|u| !u.contains(&unit)) {
            continue;
        }
        let id: String = row.get("reservation_id");
        if flag(row, "spot") {
            spot.insert(id);
        } else {
            other.insert(id);
        }
    }
    Ok(Workloads {
        spot: spot.into_iter().collect(),
        other: other.into_iter().collect(),
    })
}

/// Who is terminating, on whose capacity, and why: what the audit trail records.
pub struct Reclaim<'a> {
    pub caller: &'a Principal,
    /// The org that owns the capacity (the node's owner), whose trail records it.
    pub owner_org_id: &'a str,
    pub node_id: &'a str,
    /// The caller's stated reason.
    pub reason: Option<&'a str>,
    /// How each workload is locked while it ends (the store's `FOR UPDATE` clause), so a
    /// concurrent release cannot end it twice.
    pub lock: &'a str,
}

/// The spot workloads a reclaim terminated, and the pools whose capacity that freed.
#[derive(Debug, Default)]
pub struct Terminated {
    /// Compute reservation ids, in the order they were terminated.
    pub ids: Vec<String>,
    pools: BTreeSet<String>,
}

impl Terminated {
    /// Once the terminations committed: tries the waiting reservations of the pools they
    /// freed capacity in again, at once, as a release does.
    pub async fn wake_pools(&self, app: &App, node_id: &str) -> Result<()> {
        for pool in &self.pools {
            crate::reconciler::wake_pool(app, pool, &[node_id.to_string()]).await?;
        }
        Ok(())
    }
}

/// Ends each of `ids` (spot workloads) as `released` with reason `capacity-reclaim`: its
/// bookings end now, its quota is refunded, its event emitted and the termination audited.
/// Answers what it terminated (one that ended meanwhile is left out).
pub async fn terminate_for_capacity(
    conn: &mut AnyConnection,
    ids: &[String],
    by: &Reclaim<'_>,
    now: i64,
) -> Result<Terminated> {
    let mut terminated = Terminated::default();
    for id in ids {
        let Some(mut r) = crate::booking::store::find(conn, id, by.lock).await? else {
            continue;
        };
        if r.state.is_terminal() || !r.spot {
            continue;
        }
        if !terminate(conn, &mut r, State::Released, CAPACITY_RECLAIM, now).await? {
            continue;
        }
        let entry = Entry {
            org_id: by.owner_org_id,
            action: "compute-reservation.terminate",
            object_type: "compute-reservation",
            object_id: id,
            reason: by.reason,
            details: Some(json!({
                "reason": CAPACITY_RECLAIM,
                "nodeId": by.node_id,
                "tenantId": r.tenant_id,
                "unitIds": r.unit_ids,
            })),
        };
        audit::record(conn, by.caller, entry, now).await?;
        terminated.ids.push(id.clone());
        terminated.pools.insert(r.pool_id);
    }
    Ok(terminated)
}

/// `POST /v1/orgs/{orgId}/provider/nodes/{nodeId}/reclaim-spot` body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReclaimSpot {
    /// Limit to these units. Omit to target every spot workload within reach.
    pub unit_ids: Option<Vec<String>>,
    /// Recorded in the audit trail.
    pub reason: Option<String>,
    /// Report what would be terminated, and terminate nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What a provider reclaim did (or, on a dry run, would do).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReclaimOutcome {
    /// Workloads (compute reservation ids) terminated, or on a dry run that would be.
    pub terminated: Vec<String>,
    /// Workloads left alone because they are not spot.
    pub skipped: Vec<String>,
}

/// Terminates the spot workloads on a node for `org_id`: on every unit of a node it owns,
/// or, for an org managing reservations there, only on the released units of those that
/// are active and inside their term. Non-spot workloads are never touched.
pub async fn provider_reclaim(
    app: &App,
    caller: &Principal,
    org_id: &str,
    node_id: &str,
    body: ReclaimSpot,
) -> Result<ReclaimOutcome> {
    let not_found = || Error::not_found(format_args!("node {node_id}"));
    caller.require_for(
        Permission::ProviderWrite,
        org_id,
        format_args!("org {org_id}"),
    )?;
    if let Some(units) = &body.unit_ids {
        validation::unit_ids("unitIds", units)?;
    }
    validation::opt_text("reason", body.reason.as_deref(), 1024)?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let node = nodes::find(&mut tx, node_id).await?.ok_or_else(not_found)?;
    let on_node: Vec<_> = load(&mut tx, Filter::Node(node_id), "")
        .await?
        .iter()
        .map(|r| r.rights(now))
        .collect();
    let reach = spot_reach(org_id, &node.org_id, &on_node).ok_or_else(not_found)?;
    let units = target_units(&node, &reach, body.unit_ids.as_deref())?;
    let workloads = on_units(&mut tx, node_id, units.as_ref(), now).await?;
    if body.dry_run {
        return Ok(ReclaimOutcome {
            terminated: workloads.spot,
            skipped: workloads.other,
        });
    }
    let by = Reclaim {
        caller,
        owner_org_id: &node.org_id,
        node_id,
        reason: body.reason.as_deref(),
        lock: app.store.for_update(),
    };
    let terminated = terminate_for_capacity(&mut tx, &workloads.spot, &by, now).await?;
    tx.commit().await?;
    // Read by this replica's next decision at once, without waiting for the announcement.
    app.capacity.forget(&[node_id.to_string()]).await;
    terminated.wake_pools(app, node_id).await?;
    Ok(ReclaimOutcome {
        terminated: terminated.ids,
        skipped: workloads.other,
    })
}

/// The units a provider reclaim targets (`None`: the whole node), refusing named units that
/// the node lacks or that are out of reach.
fn target_units(
    node: &Node,
    reach: &Reach,
    named: Option<&[String]>,
) -> Result<Option<BTreeSet<String>>> {
    if let Some(named) = named {
        for (i, unit) in named.iter().enumerate() {
            if !node.units.iter().any(|u| &u.id == unit) {
                return Err(Error::invalid(
                    format!("unitIds[{i}]"),
                    format!("node {} has no unit {unit}", node.id),
                ));
            }
            if let Reach::Units(reachable) = reach
                && !reachable.contains(unit)
            {
                return Err(Error::invalid(
                    format!("unitIds[{i}]"),
                    format!(
                        "unit {unit} is not a released unit of an active reservation you manage"
                    ),
                ));
            }
        }
    }
    Ok(match (named, reach) {
        (Some(named), _) => Some(named.iter().cloned().collect()),
        (None, Reach::Node) => None,
        (None, Reach::Units(units)) => Some(units.clone()),
    })
}
