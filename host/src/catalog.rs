//! The catalog: what an org could place on now, node by node, one page at a time.
//!
//! The page of nodes is cut in the database (the nodes of the pools the org may book
//! into, by id, after the cursor); what holds each unit (node reservations and compute
//! bookings) comes from the capacity view, so a page costs the same at 20,000 nodes as at
//! 500.

use serde::Serialize;
use sqlx::AnyConnection;

use crate::capacity::NodeCapacity;
use crate::clock::format_ms;
use crate::iam::{OPS_ORG, Permission, Principal};
use crate::inventory::{DeviceClass, UnitClass};
use crate::node_reservations::{Rights, Tier, access};
use crate::{App, Error, Result};

/// What an org may place on now, node by node.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Catalog {
    pub org_id: String,
    pub at: String,
    pub nodes: Vec<CatalogNode>,
    /// The cursor of the next page, while nodes remain; a page may list fewer nodes than
    /// its limit (nodes with nothing the org may place on are left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogNode {
    pub node_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    pub units: Vec<CatalogUnit>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CatalogUnit {
    pub id: String,
    pub class: UnitClass,
    pub device_class: DeviceClass,
    pub model: String,
    #[serde(rename = "memoryGiB")]
    pub memory_gib: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    /// `open`, `reserved` (to this org's audience), `spot-only` (released to the market) or
    /// `booked` (a compute reservation holds it now).
    pub tier: CatalogTier,
    /// The reservation that reserves or released the unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    /// When a reservation that excludes this org starts on the unit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_until: Option<String>,
}

/// How an org may use one unit now, as the catalog shows it: the unit's rights ([`Tier`]),
/// unless a compute reservation holds it now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
#[schema(as = Tier)]
pub enum CatalogTier {
    /// No reservation holds the unit now: anyone may place.
    Open,
    /// Reserved to the org's audience: only it (and the platform) may place.
    Reserved,
    /// Released from a reservation to the spot market: anyone, at spot tier only.
    SpotOnly,
    /// A compute reservation (placed, binding or active) holds the unit now.
    Booked,
}

impl From<Tier> for CatalogTier {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Open => CatalogTier::Open,
            Tier::Reserved => CatalogTier::Reserved,
            Tier::SpotOnly => CatalogTier::SpotOnly,
        }
    }
}

/// One page of the sellable units `org_id` could place on now, on the nodes of the pools
/// it may book into (every node for the ops org), at most `limit` nodes after the node
/// `after`: reserved units only for their audience, released units to everyone as
/// spot-only, needs-review units to no one; a unit a compute reservation holds now shows
/// as booked.
pub async fn page(
    app: &App,
    caller: &Principal,
    org_id: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Catalog> {
    if !caller.acts_for(org_id)
        || !(caller.has(Permission::ReservationRead) || caller.has(Permission::ComputeRead))
    {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    if crate::iam::orgs::find(app.store.pool(), org_id)
        .await?
        .is_none()
    {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    let now = app.now_ms();
    let mut ids = {
        let mut conn = app.store.pool().acquire().await?;
        node_ids(&mut conn, org_id, after.unwrap_or(""), limit + 1).await?
    };
    let cursor = if crate::store::cut(&mut ids, limit) {
        ids.last().cloned()
    } else {
        None
    };
    let nodes = app
        .capacity
        .nodes(&ids)
        .await?
        .iter()
        .filter_map(|held| node(held, org_id, now))
        .collect();
    Ok(Catalog {
        org_id: org_id.to_string(),
        at: format_ms(now),
        nodes,
        cursor,
    })
}

/// The ids of at most `limit` nodes after `after` that `org_id` could place on: those of
/// the pools it owns or is offered that are not archived; every node for the ops org.
async fn node_ids(
    conn: &mut AnyConnection,
    org_id: &str,
    after: &str,
    limit: usize,
) -> Result<Vec<String>> {
    let limit = limit as i64;
    let ids = if org_id == OPS_ORG {
        sqlx::query_scalar("SELECT id FROM nodes WHERE id > $1 ORDER BY id LIMIT $2")
            .bind(after)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?
    } else {
        sqlx::query_scalar(
            "SELECT n.id FROM nodes n
             WHERE n.id > $1 AND EXISTS (
                 SELECT 1 FROM pool_nodes pn JOIN pools p ON p.id = pn.pool_id
                 WHERE pn.node_id = n.id AND p.archived_at IS NULL
                   AND (p.owner_org_id = $2
                        OR EXISTS (SELECT 1 FROM offers o WHERE o.pool_id = p.id AND o.tenant_id = $2)))
             ORDER BY n.id LIMIT $3",
        )
        .bind(after)
        .bind(org_id)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?
    };
    Ok(ids)
}

/// What `org_id` may place on of one node at `now`, or `None` when nothing.
fn node(held: &NodeCapacity, org_id: &str, now: i64) -> Option<CatalogNode> {
    let rights: Vec<(Rights, &[String])> = held
        .claims
        .iter()
        .map(|c| (c.rights(now), c.unit_ids.as_slice()))
        .collect();
    let units: Vec<CatalogUnit> = held
        .node
        .units
        .iter()
        .filter(|u| u.sellable)
        .filter_map(|unit| {
            let on_unit: Vec<&Rights> = rights
                .iter()
                .filter(|(_, units)| units.contains(&unit.id))
                .map(|(r, _)| r)
                .collect();
            let (tier, reservation_id) = access(org_id, &unit.id, &on_unit, now)?;
            let available_until = on_unit
                .iter()
                .filter(|r| {
                    r.term.starts_at > now && !r.allowed_org_ids.iter().any(|o| o == org_id)
                })
                .map(|r| r.term.starts_at)
                .min()
                .map(format_ms);
            let booked = held
                .bookings
                .iter()
                .any(|b| b.unit_id == unit.id && b.start_ms <= now && now < b.end_ms);
            Some(CatalogUnit {
                id: unit.id.clone(),
                class: unit.class,
                device_class: unit.device_class,
                model: unit.model.clone(),
                memory_gib: unit.memory_gib,
                nvlink_domain: unit.nvlink_domain.clone(),
                tier: if booked {
                    CatalogTier::Booked
                } else {
                    tier.into()
                },
                reservation_id,
                available_until,
            })
        })
        .collect();
    (!units.is_empty()).then(|| CatalogNode {
        node_id: held.node.id.clone(),
        region: held.node.region.clone(),
        units,
    })
}
