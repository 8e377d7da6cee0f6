//! Registering nodes and replacing their inventory, and reading them back.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::json;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::{
    DeviceClass, HostResources, Labels, NodeInventory, Unit, UnitClass, single_class,
    topology_changed, validate,
};
use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::events;
use crate::iam::{Permission, Principal};
use crate::store::{flag, is_unique_violation, to_json};
use crate::validation;
use crate::{Error, Result};

/// A provider's machine and its units.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub id: String,
    pub org_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The node's labels as last reported (`{}` without any).
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    pub labels: Labels,
    pub host: HostResources,
    pub units: Vec<Unit>,
    /// Increases whenever the reported GPU topology changes (never for labels alone).
    pub topology_gen: i64,
    /// All GPU units share one unit class.
    pub single_class: bool,
    pub created_at: String,
    pub updated_at: String,
    pub last_seen_at: String,
    /// `NodeLost` (its agent stopped reporting; no new placements until it reports again)
    /// and `KubernetesReleaseStuck` (pods hold released devices past their booking's end).
    pub conditions: Vec<crate::condition::Condition>,
}

impl Node {
    /// Marked lost by the reconciler and not reported since.
    pub fn is_lost(&self) -> bool {
        self.conditions.iter().any(|c| c.kind == "NodeLost")
    }

    /// A node of org `acme` with `host` resources and `units`, no region, labels or
    /// conditions: what tests build on.
    #[cfg(test)]
    pub fn sample(id: &str, host: HostResources, units: Vec<Unit>) -> Node {
        Node {
            id: id.into(),
            org_id: "acme".into(),
            region: None,
            labels: Labels::default(),
            host,
            units,
            topology_gen: 1,
            single_class: true,
            created_at: String::new(),
            updated_at: String::new(),
            last_seen_at: String::new(),
            conditions: Vec::new(),
        }
    }
}

/// What an inventory report did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Registered,
    Unchanged,
    Updated { topology_bumped: bool },
}

/// Registers `node_id` for `org_id`, or replaces its inventory. The same report twice
/// changes nothing; a topology change bumps `topologyGen`. A change of node or unit labels
/// alone updates the node without bumping it: labels are not topology.
pub async fn register(
    app: &App,
    caller: &Principal,
    org_id: &str,
    node_id: &str,
    inventory: NodeInventory,
) -> Result<(Node, Change)> {
    let what = format!("node {node_id}");
    caller.require_for(Permission::InventoryWrite, org_id, &what)?;
    validation::id("nodeId", node_id)?;
    validate(&inventory)?;
    if crate::iam::orgs::find(app.store.pool(), org_id)
        .await?
        .is_none()
    {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    // Two reports of one node may race (on PostgreSQL, from two replicas): the loser of a
    // first registration, or of a generation bump, sees the winner's row on its next try.
    for _ in 0..5 {
        match try_register(app, caller, org_id, node_id, &inventory).await {
            Err(Error::Internal(err))
                if err
                    .downcast_ref::<sqlx::Error>()
                    .is_some_and(is_unique_violation) => {}
            Err(Error::Conflict { .. }) => {}
            other => return other,
        }
    }
    Err(Error::conflict(
        format!("node {node_id} is being updated concurrently; retry"),
        None,
    ))
}

async fn try_register(
    app: &App,
    caller: &Principal,
    org_id: &str,
    node_id: &str,
    inv: &NodeInventory,
) -> Result<(Node, Change)> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let existing = find(&mut tx, node_id).await?;
    let change = match &existing {
        Some(node) if node.org_id != org_id => {
            return Err(Error::not_found(format_args!("node {node_id}")));
        }
        None => {
            sqlx::query(
                "INSERT INTO nodes (id, org_id, region, host_vcpu, host_memory_gib, host_hugepages_1gi,
                                    topology_gen, created_at, updated_at, last_seen_at, labels)
                 VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $7, $7, $8)",
            )
            .bind(node_id)
            .bind(org_id)
            .bind(&inv.region)
            .bind(inv.host.vcpu)
            .bind(inv.host.memory_gib)
            .bind(inv.host.hugepages_1gi)
            .bind(now)
            .bind(to_json(&inv.labels))
            .execute(&mut **tx)
            .await
            .map_err(|e| Error::Internal(anyhow::Error::new(e)))?;
            insert_units(&mut tx, node_id, &inv.units).await?;
            Change::Registered
        }
        Some(node)
            if node.region == inv.region
                && node.labels == inv.labels
                && node.host == inv.host
                && node.units == inv.units =>
        {
            sqlx::query("UPDATE nodes SET last_seen_at = $1 WHERE id = $2")
                .bind(now)
                .bind(node_id)
                .execute(&mut **tx)
                .await?;
            Change::Unchanged
        }
        Some(node) => {
            let bumped = topology_changed(&node.units, &inv.units);
            let updated = sqlx::query(
                "UPDATE nodes SET region = $1, host_vcpu = $2, host_memory_gib = $3, host_hugepages_1gi = $4,
                                  topology_gen = $5, updated_at = $6, last_seen_at = $6,
                                  labels = $9
                 WHERE id = $7 AND topology_gen = $8",
            )
            .bind(&inv.region)
            .bind(inv.host.vcpu)
            .bind(inv.host.memory_gib)
            .bind(inv.host.hugepages_1gi)
            .bind(node.topology_gen + i64::from(bumped))
            .bind(now)
            .bind(node_id)
            .bind(node.topology_gen)
            .bind(to_json(&inv.labels))
            .execute(&mut **tx)
            .await?;
            if updated.rows_affected() == 0 {
                return Err(Error::conflict("node changed concurrently", None));
            }
            sqlx::query("DELETE FROM units WHERE node_id = $1")
                .bind(node_id)
                .execute(&mut **tx)
                .await?;
            insert_units(&mut tx, node_id, &inv.units).await?;
            Change::Updated {
                topology_bumped: bumped,
            }
        }
    };
    let recovered = existing.is_some() && recover(&mut tx, node_id, org_id, now).await?;
    let node = find(&mut tx, node_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("node {node_id} vanished inside its own transaction"))?;
    if change
        == (Change::Updated {
            topology_bumped: true,
        })
    {
        crate::node_reservations::actions::review_after_topology_change(
            &mut tx, caller, &node, now,
        )
        .await?;
    }
    if change != Change::Unchanged {
        record_change(
            &mut tx,
            caller,
            &node,
            change,
            existing.as_ref().map(|n| n.topology_gen),
            now,
        )
        .await?;
    }
    tx.commit().await?;
    if change != Change::Unchanged || recovered {
        // This replica's next read sees the change without waiting for its announcement.
        app.capacity.forget(std::slice::from_ref(&node.id)).await;
    }
    Ok((node, change))
}

/// Clears the lost mark of a node that reported: the one update that finds it set emits
/// `inventory.node-recovered`. Answers whether the node was lost.
pub async fn recover(
    conn: &mut AnyConnection,
    node_id: &str,
    org_id: &str,
    now: i64,
) -> Result<bool> {
    let recovered =
        sqlx::query("UPDATE nodes SET lost_at = NULL WHERE id = $1 AND lost_at IS NOT NULL")
            .bind(node_id)
            .execute(&mut *conn)
            .await?
            .rows_affected()
            == 1;
    if recovered {
        let payload = json!({ "nodeId": node_id, "orgId": org_id });
        events::emit(
            conn,
            "inventory.node-recovered",
            node_id,
            &[org_id],
            &payload,
            now,
        )
        .await?;
    }
    Ok(recovered)
}

async fn record_change(
    conn: &mut AnyConnection,
    caller: &Principal,
    node: &Node,
    change: Change,
    previous_gen: Option<i64>,
    now: i64,
) -> Result<()> {
    let (action, event) = match change {
        Change::Registered => ("node.register", "inventory.node-registered"),
        Change::Updated {
            topology_bumped: true,
        } => ("node.update-inventory", "inventory.topology-changed"),
        _ => ("node.update-inventory", "inventory.node-updated"),
    };
    let details = json!({
        "topologyGen": node.topology_gen,
        "previousTopologyGen": previous_gen,
        "units": node.units.len(),
    });
    let entry = Entry {
        org_id: &node.org_id,
        action,
        object_type: "node",
        object_id: &node.id,
        reason: None,
        details: Some(details.clone()),
    };
    audit::record(conn, caller, entry, now).await?;
    let payload =
        json!({ "nodeId": node.id, "orgId": node.org_id, "topologyGen": node.topology_gen });
    events::emit(conn, event, &node.id, &[&node.org_id], &payload, now).await
}

async fn insert_units(conn: &mut AnyConnection, node_id: &str, units: &[Unit]) -> Result<()> {
    for (position, u) in units.iter().enumerate() {
        sqlx::query(
            "INSERT INTO units (node_id, id, position, class, device_class, model, memory_gib, nvlink_domain, sellable, labels)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(node_id)
        .bind(&u.id)
        .bind(position as i64)
        .bind(u.class.as_str())
        .bind(u.device_class.as_str())
        .bind(&u.model)
        .bind(u.memory_gib)
        .bind(&u.nvlink_domain)
        .bind(u.sellable)
        .bind(to_json(&u.labels))
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// One node readable by the caller: ops and the owning org.
pub async fn get(app: &App, caller: &Principal, node_id: &str) -> Result<Node> {
    let mut conn = app.store.pool().acquire().await?;
    match find(&mut conn, node_id).await? {
        Some(node) if caller.has(Permission::ProviderRead) && caller.acts_for(&node.org_id) => {
            Ok(node)
        }
        _ => Err(Error::not_found(format_args!("node {node_id}"))),
    }
}

/// At most `limit` of the nodes an org owns, by id, after the node `after`.
pub async fn list(
    app: &App,
    caller: &Principal,
    org_id: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<Node>> {
    crate::iam::orgs::require(app, caller, Permission::ProviderRead, org_id).await?;
    let mut conn = app.store.pool().acquire().await?;
    let page = "SELECT id FROM nodes WHERE org_id = $1 AND id > $2 ORDER BY id LIMIT $3";
    let rows = sqlx::query(&format!(
        "SELECT {NODE_COLUMNS} FROM nodes WHERE id IN ({page}) ORDER BY id"
    ))
    .bind(org_id)
    .bind(after.unwrap_or(""))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    let unit_rows = sqlx::query(&format!(
        "SELECT node_id, {UNIT_COLUMNS} FROM units WHERE node_id IN ({page}) ORDER BY node_id, position"
    ))
    .bind(org_id)
    .bind(after.unwrap_or(""))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    assemble(&rows, &unit_rows)
}

/// Node rows with their unit rows (by node, in position order) as nodes.
fn assemble(rows: &[AnyRow], unit_rows: &[AnyRow]) -> Result<Vec<Node>> {
    let mut units: HashMap<String, Vec<Unit>> = HashMap::new();
    for r in unit_rows {
        units
            .entry(r.get("node_id"))
            .or_default()
            .push(unit_from_row(r)?);
    }
    rows.iter()
        .map(|r| {
            node_from_row(
                r,
                units.remove(&r.get::<String, _>("id")).unwrap_or_default(),
            )
        })
        .collect()
}

/// The nodes with `ids` that exist, with their units, in two queries (any order).
pub async fn find_many(conn: &mut AnyConnection, ids: &[String]) -> Result<Vec<Node>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = crate::store::placeholders(1, ids.len());
    let sql = format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id IN ({list})");
    let mut rows = sqlx::query(&sql);
    for id in ids {
        rows = rows.bind(id);
    }
    let rows = rows.fetch_all(&mut *conn).await?;
    let sql = format!(
        "SELECT node_id, {UNIT_COLUMNS} FROM units WHERE node_id IN ({list}) ORDER BY node_id, position"
    );
    let mut unit_rows = sqlx::query(&sql);
    for id in ids {
        unit_rows = unit_rows.bind(id);
    }
    let unit_rows = unit_rows.fetch_all(&mut *conn).await?;
    assemble(&rows, &unit_rows)
}

const NODE_COLUMNS: &str = "id, org_id, region, labels, host_vcpu, host_memory_gib, host_hugepages_1gi, \
                            topology_gen, created_at, updated_at, last_seen_at, lost_at, \
                            (SELECT CAST(MIN(rb.stuck_since) AS BIGINT) FROM reservation_bindings rb \
                             WHERE rb.node_id = nodes.id AND rb.status = 'unbinding') AS stuck_since";
const UNIT_COLUMNS: &str =
    "id, class, device_class, model, memory_gib, nvlink_domain, sellable, labels";

/// The node with `id` and its units, whoever asks (callers check visibility).
pub async fn find(conn: &mut AnyConnection, node_id: &str) -> Result<Option<Node>> {
    let Some(row) = sqlx::query(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1"))
        .bind(node_id)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let units = sqlx::query(&format!(
        "SELECT {UNIT_COLUMNS} FROM units WHERE node_id = $1 ORDER BY position"
    ))
    .bind(node_id)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(unit_from_row)
    .collect::<Result<Vec<_>>>()?;
    node_from_row(&row, units).map(Some)
}

/// Labels stored as a JSON object in a TEXT column.
fn labels_from_row(r: &AnyRow, what: &str) -> Result<Labels> {
    let text: String = r.get("labels");
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("stored labels of {what}: {e}").into())
}

fn node_from_row(r: &AnyRow, units: Vec<Unit>) -> Result<Node> {
    let id: String = r.get("id");
    Ok(Node {
        labels: labels_from_row(r, &format!("node {id}"))?,
        id,
        org_id: r.get("org_id"),
        region: r.get("region"),
        host: HostResources {
            vcpu: r.get("host_vcpu"),
            memory_gib: r.get("host_memory_gib"),
            hugepages_1gi: r.get("host_hugepages_1gi"),
        },
        single_class: single_class(&units),
        units,
        topology_gen: r.get("topology_gen"),
        created_at: format_ms(r.get("created_at")),
        updated_at: format_ms(r.get("updated_at")),
        last_seen_at: format_ms(r.get("last_seen_at")),
        conditions: node_conditions(r.get("lost_at"), r.get("stuck_since")),
    })
}

fn node_conditions(
    lost_at: Option<i64>,
    stuck_since: Option<i64>,
) -> Vec<crate::condition::Condition> {
    let mut conditions = Vec::new();
    if let Some(since) = lost_at {
        conditions.push(crate::condition::Condition {
            kind: "NodeLost".into(),
            reason: "NodeStoppedReporting".into(),
            message: "the node's agent stopped reporting; it gets no new placements until it reports again".into(),
            since,
        });
    }
    if let Some(since) = stuck_since {
        conditions.push(crate::condition::Condition {
            kind: "KubernetesReleaseStuck".into(),
            reason: "DevicesHeldPastBooking".into(),
            message: "pods still hold released devices past their booking's end (NoSchedule)"
                .into(),
            since,
        });
    }
    conditions
}

fn unit_from_row(r: &AnyRow) -> Result<Unit> {
    let class: String = r.get("class");
    let device_class: String = r.get("device_class");
    let id: String = r.get("id");
    Ok(Unit {
        labels: labels_from_row(r, &format!("unit {id}"))?,
        id,
        class: UnitClass::parse(&class)
            .ok_or_else(|| anyhow::anyhow!("stored unit class {class:?}"))?,
        device_class: DeviceClass::parse(&device_class)
            .ok_or_else(|| anyhow::anyhow!("stored device class {device_class:?}"))?,
        model: r.get("model"),
        memory_gib: r.get("memory_gib"),
        nvlink_domain: r.get("nvlink_domain"),
        sellable: flag(r, "sellable"),
    })
}
