//! Nodes, their units and NVLink domains, their bookings and utilization.

use std::collections::BTreeMap;

use async_graphql::{ComplexObject, Context, Json, Result, SimpleObject};

use super::{api_name, json};
use crate::Error;
use crate::booking::MAX_INSTANT_MS;
use crate::graphql::{app, loaders};
use crate::inventory::{self, nodes};

/// The window `utilization` covers when asked without one: the last day.
const DEFAULT_WINDOW_MS: i64 = 24 * 3_600_000;

/// A provider's machine.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct Node {
    pub id: String,
    pub org_id: String,
    pub region: Option<String>,
    pub vcpu: i64,
    #[graphql(name = "memoryGiB")]
    pub memory_gib: i64,
    #[graphql(name = "hugepages1Gi")]
    pub hugepages_1gi: i64,
    pub units: Vec<Unit>,
    /// The node's labels (key → value).
    pub labels: Json<serde_json::Value>,
    /// `NodeLost`, `KubernetesReleaseStuck`, … as `GET /v1/nodes/{nodeId}` shows them.
    pub conditions: Json<serde_json::Value>,
    /// Increases whenever the reported GPU topology changes.
    pub topology_gen: i64,
    pub single_class: bool,
    pub created_at: String,
    pub updated_at: String,
    pub last_seen_at: String,
}

/// The indivisible allocation primitive on a node.
#[derive(Clone, SimpleObject)]
pub struct Unit {
    pub id: String,
    pub class: String,
    pub device_class: String,
    pub model: String,
    #[graphql(name = "memoryGiB")]
    pub memory_gib: i64,
    pub nvlink_domain: Option<String>,
    pub sellable: bool,
    /// The unit's labels (key → value).
    pub labels: Json<serde_json::Value>,
    #[graphql(skip)]
    pub gpu: bool,
}

/// Units of a node joined by one NVLink fabric.
#[derive(SimpleObject)]
pub struct NvlinkDomain {
    pub id: String,
    pub unit_ids: Vec<String>,
}

/// A compute reservation's claim on one unit for its window. Instants are epoch ms.
#[derive(Clone, SimpleObject)]
pub struct Booking {
    pub reservation_id: String,
    pub unit_id: String,
    pub start: i64,
    pub end: i64,
    /// Booked at spot tier.
    pub spot: bool,
    /// Still claiming the unit (a released booking ends where it was released).
    pub active: bool,
}

/// How much of a node's GPU capacity bookings held over a window. Instants are epoch ms.
#[derive(SimpleObject)]
pub struct Utilization {
    pub from: i64,
    pub to: i64,
    pub gpu_units: i64,
    /// Unit-milliseconds booked inside the window.
    pub booked_unit_ms: i64,
    /// `bookedUnitMs` over the window's unit-milliseconds, 0-1.
    pub ratio: f64,
}

impl From<nodes::Node> for Node {
    fn from(n: nodes::Node) -> Self {
        Node {
            units: n.units.iter().map(Unit::from).collect(),
            labels: json(&n.labels),
            conditions: json(&n.conditions),
            id: n.id,
            org_id: n.org_id,
            region: n.region,
            vcpu: n.host.vcpu,
            memory_gib: n.host.memory_gib,
            hugepages_1gi: n.host.hugepages_1gi,
            topology_gen: n.topology_gen,
            single_class: n.single_class,
            created_at: n.created_at,
            updated_at: n.updated_at,
            last_seen_at: n.last_seen_at,
        }
    }
}

impl From<&inventory::Unit> for Unit {
    fn from(u: &inventory::Unit) -> Self {
        Unit {
            id: u.id.clone(),
            class: u.class.as_str().to_string(),
            device_class: api_name(&u.device_class),
            model: u.model.clone(),
            memory_gib: u.memory_gib,
            nvlink_domain: u.nvlink_domain.clone(),
            sellable: u.sellable,
            labels: json(&u.labels),
            gpu: u.device_class.is_gpu(),
        }
    }
}

#[ComplexObject]
impl Node {
    /// The node's NVLink domains and their units.
    async fn nvlink_domains(&self) -> Vec<NvlinkDomain> {
        let mut domains: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for unit in &self.units {
            if let Some(domain) = &unit.nvlink_domain {
                domains.entry(domain).or_default().push(unit.id.clone());
            }
        }
        domains
            .into_iter()
            .map(|(id, unit_ids)| NvlinkDomain {
                id: id.to_string(),
                unit_ids,
            })
            .collect()
    }

    /// Active bookings that have not ended: running now or upcoming, by start.
    async fn bookings(&self, ctx: &Context<'_>) -> Result<Vec<Booking>> {
        let now = app(ctx).now_ms();
        let bookings = loaders::bookings(ctx, &self.id, now, MAX_INSTANT_MS).await?;
        Ok(bookings.into_iter().filter(|b| b.active).collect())
    }

    /// GPU utilization over `[from, to)`, epoch ms; by default the last 24 hours.
    async fn utilization(
        &self,
        ctx: &Context<'_>,
        from: Option<i64>,
        to: Option<i64>,
    ) -> Result<Utilization> {
        let to = to.unwrap_or_else(|| app(ctx).now_ms());
        let from = from.unwrap_or(to - DEFAULT_WINDOW_MS);
        if !(0 <= from && from < to && to <= MAX_INSTANT_MS) {
            return Err(
                Error::invalid("to", "the window must be from < to, both 0-2^47 ms").into(),
            );
        }
        let gpus: Vec<&str> = self
            .units
            .iter()
            .filter(|u| u.gpu)
            .map(|u| u.id.as_str())
            .collect();
        let booked_unit_ms: i64 = loaders::bookings(ctx, &self.id, from, to)
            .await?
            .iter()
            .filter(|b| gpus.contains(&b.unit_id.as_str()))
            .map(|b| (b.end.min(to) - b.start.max(from)).max(0))
            .sum();
        let capacity = gpus.len() as i64 * (to - from);
        Ok(Utilization {
            from,
            to,
            gpu_units: gpus.len() as i64,
            booked_unit_ms,
            ratio: if capacity == 0 {
                0.0
            } else {
                booked_unit_ms as f64 / capacity as f64
            },
        })
    }
}
