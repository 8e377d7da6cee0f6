//! Node reservations, compute reservations and the catalog.

use async_graphql::{Json, SimpleObject};

use super::{api_name, json};
use crate::booking::store as compute;
use crate::booking::{availability as search, extend, plan};
use crate::catalog;
use crate::node_reservations::queries;

/// Exclusive placement rights for a set of orgs over units of one node, for a term.
#[derive(SimpleObject)]
pub struct NodeReservation {
    pub id: String,
    pub node_id: String,
    pub reserved_unit_ids: Vec<String>,
    /// The units currently on the spot market (double sell).
    pub released_unit_ids: Vec<String>,
    pub allowed_org_ids: Vec<String>,
    pub managing_org_ids: Vec<String>,
    pub starts_at: String,
    /// Absent = open-ended until cancelled.
    pub ends_at: Option<String>,
    /// `pending`, `active`, `expired`, `cancelled` or `needs-review`.
    pub status: String,
    pub topology_gen: i64,
    pub contract_ref: Option<String>,
    pub reason: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<queries::NodeReservation> for NodeReservation {
    fn from(r: queries::NodeReservation) -> Self {
        NodeReservation {
            status: api_name(&r.status),
            id: r.id,
            node_id: r.node_id,
            reserved_unit_ids: r.reserved_unit_ids,
            released_unit_ids: r.released_unit_ids,
            allowed_org_ids: r.allowed_org_ids,
            managing_org_ids: r.managing_org_ids,
            starts_at: r.starts_at,
            ends_at: r.ends_at,
            topology_gen: r.topology_gen,
            contract_ref: r.contract_ref,
            reason: r.reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// A tenant's claim on devices of one pool for a window. Instants are epoch ms.
#[derive(SimpleObject)]
pub struct ComputeReservation {
    pub id: String,
    pub tenant_id: String,
    pub pool_id: String,
    pub project_id: Option<String>,
    /// `pending`, `placed`, `active`, `released`, … as in the RPC.
    pub state: String,
    pub spot: bool,
    pub start: i64,
    pub end: i64,
    pub lease_seconds: Option<i64>,
    pub lease_deadline: Option<i64>,
    /// Host resources booked with the devices.
    pub resources: Json<serde_json::Value>,
    pub conditions: Json<serde_json::Value>,
    /// Why it ended.
    pub reason: Option<String>,
    pub placement: Option<Placement>,
    /// The request as created.
    pub request: Json<serde_json::Value>,
    /// The last operation applied to it.
    pub operation: Option<Json<serde_json::Value>>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Where a reservation's devices are.
#[derive(SimpleObject)]
pub struct Placement {
    pub node_id: String,
    pub unit_ids: Vec<String>,
    /// Every node the reservation holds units on, with those units (a gang has one per
    /// node); the first is `nodeId`'s.
    pub members: Vec<PlacementMember>,
    pub placed_by: Option<String>,
}

/// The units a reservation holds on one node.
#[derive(SimpleObject)]
pub struct PlacementMember {
    pub node_id: String,
    pub unit_ids: Vec<String>,
}

impl From<compute::Member> for PlacementMember {
    fn from(m: compute::Member) -> Self {
        PlacementMember {
            node_id: m.node_id,
            unit_ids: m.unit_ids,
        }
    }
}

impl From<compute::ComputeReservation> for ComputeReservation {
    fn from(r: compute::ComputeReservation) -> Self {
        ComputeReservation {
            state: api_name(&r.state),
            resources: json(&r.resources),
            conditions: json(&r.conditions),
            request: json(&r.request),
            operation: r.operation.as_ref().map(json),
            placement: r.placement.map(|p| Placement {
                node_id: p.node_id,
                unit_ids: p.unit_ids,
                members: p.members.into_iter().map(Into::into).collect(),
                placed_by: p.placed_by,
            }),
            id: r.id,
            tenant_id: r.tenant_id,
            pool_id: r.pool_id,
            project_id: r.project_id,
            spot: r.spot,
            start: r.start,
            end: r.end,
            lease_seconds: r.lease_seconds,
            lease_deadline: r.lease_deadline,
            reason: r.reason,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// The answer of `extendComputeReservation`.
#[derive(SimpleObject)]
pub struct Extended {
    pub reservation: ComputeReservation,
    pub extended: bool,
    /// When a later booking blocks: the latest end the bookings can reach.
    pub available_until: Option<i64>,
}

impl From<extend::Extended> for Extended {
    fn from(e: extend::Extended) -> Self {
        Extended {
            reservation: e.reservation.into(),
            extended: e.extended,
            available_until: e.available_until,
        }
    }
}

/// What an org may place on now, node by node.
#[derive(SimpleObject)]
pub struct Catalog {
    pub org_id: String,
    pub at: String,
    pub nodes: Vec<CatalogNode>,
    /// The `after` of the next page, while nodes remain.
    pub cursor: Option<String>,
}

#[derive(SimpleObject)]
pub struct CatalogNode {
    pub node_id: String,
    pub region: Option<String>,
    pub units: Vec<CatalogUnit>,
}

#[derive(SimpleObject)]
pub struct CatalogUnit {
    pub id: String,
    pub class: String,
    pub device_class: String,
    pub model: String,
    #[graphql(name = "memoryGiB")]
    pub memory_gib: i64,
    pub nvlink_domain: Option<String>,
    /// `open`, `reserved`, `spot-only` or `booked` (a compute reservation holds it now).
    pub tier: String,
    pub reservation_id: Option<String>,
    pub available_until: Option<String>,
}

impl From<catalog::Catalog> for Catalog {
    fn from(c: catalog::Catalog) -> Self {
        Catalog {
            org_id: c.org_id,
            at: c.at,
            cursor: c.cursor,
            nodes: c
                .nodes
                .into_iter()
                .map(|n| CatalogNode {
                    node_id: n.node_id,
                    region: n.region,
                    units: n
                        .units
                        .into_iter()
                        .map(|u| CatalogUnit {
                            class: u.class.as_str().to_string(),
                            device_class: api_name(&u.device_class),
                            tier: api_name(&u.tier),
                            id: u.id,
                            model: u.model,
                            memory_gib: u.memory_gib,
                            nvlink_domain: u.nvlink_domain,
                            reservation_id: u.reservation_id,
                            available_until: u.available_until,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// When and where a request fits (`availability`): the RPC's answer.
#[derive(SimpleObject)]
pub struct Availability {
    /// Earliest first; for each node at most one, its earliest.
    pub slots: Vec<AvailabilitySlot>,
    /// No slot missing from `slots` starts before this (epoch milliseconds).
    pub searched_until: i64,
    pub quota: QuotaCheck,
    /// Absent where neither the pool nor the offer asks for a budget check.
    pub budget: Option<BudgetCheck>,
}

/// A start at which a request fits, and the units it would get.
#[derive(SimpleObject)]
pub struct AvailabilitySlot {
    pub start: i64,
    pub end: i64,
    /// The same units take the request at any start up to this one.
    pub latest_start: i64,
    pub members: Vec<PlacementMember>,
}

/// A request's quota charge against what the tenant's offer leaves.
#[derive(SimpleObject)]
pub struct QuotaCheck {
    pub admits: bool,
    pub resources: Vec<QuotaCharge>,
}

/// One resource of a quota charge.
#[derive(SimpleObject)]
pub struct QuotaCharge {
    pub resource: String,
    pub requested: i64,
    pub limit: i64,
    pub used: i64,
}

/// The spend-guard's answer on a request's cost (minor units).
#[derive(SimpleObject)]
pub struct BudgetCheck {
    pub admits: bool,
    pub reason: Option<String>,
    pub charge_minor: i64,
    pub limit_minor: i64,
    pub spent_minor: i64,
    pub committed_minor: i64,
}

impl From<search::Availability> for Availability {
    fn from(a: search::Availability) -> Self {
        Availability {
            slots: (a.slots.into_iter())
                .map(|s| AvailabilitySlot {
                    start: s.start,
                    end: s.end,
                    latest_start: s.latest_start,
                    members: s.members.into_iter().map(Into::into).collect(),
                })
                .collect(),
            searched_until: a.searched_until,
            quota: a.quota.into(),
            budget: a.budget.map(Into::into),
        }
    }
}

impl From<search::QuotaCheck> for QuotaCheck {
    fn from(q: search::QuotaCheck) -> Self {
        QuotaCheck {
            admits: q.admits,
            resources: (q.resources.into_iter())
                .map(|l| QuotaCharge {
                    resource: l.resource,
                    requested: l.requested,
                    limit: l.limit,
                    used: l.used,
                })
                .collect(),
        }
    }
}

impl From<search::BudgetCheck> for BudgetCheck {
    fn from(b: search::BudgetCheck) -> Self {
        BudgetCheck {
            admits: b.admits,
            reason: b.reason,
            charge_minor: b.charge_minor,
            limit_minor: b.limit_minor,
            spent_minor: b.spent_minor,
            committed_minor: b.committed_minor,
        }
    }
}

/// What `create` would do now, step by step (`plan`): the RPC's answer.
#[derive(SimpleObject)]
pub struct Plan {
    /// The id the reservation gets.
    pub reservation_id: String,
    /// `placed`, `pending` or `queued`; `replayed`; or the error code `create` would answer.
    pub outcome: String,
    /// The stored reservation's state, where the key was used before.
    pub replayed: Option<String>,
    /// IAM on the draft: `allow`, `deny` or `needs-confirmation`.
    pub iam: Option<String>,
    pub quota: Option<QuotaCheck>,
    pub budget: Option<BudgetCheck>,
    pub placement: Option<PlacementPlan>,
}

/// Where the pool's placer would put a request.
#[derive(SimpleObject)]
pub struct PlacementPlan {
    /// `placed`, `pending` or `queued`.
    pub state: String,
    pub members: Vec<PlacementMember>,
    pub placed_by: Option<String>,
    /// Spot reservations that would be ended to make room.
    pub preempts: Vec<String>,
    pub preempted_by: Option<String>,
    /// Why it would wait.
    pub reason: Option<String>,
}

impl From<plan::Plan> for Plan {
    fn from(p: plan::Plan) -> Self {
        Plan {
            reservation_id: p.reservation_id,
            outcome: p.outcome,
            replayed: p.replayed.map(|s| s.as_str().to_string()),
            iam: p.iam.map(str::to_string),
            quota: p.quota.map(Into::into),
            budget: p.budget.map(Into::into),
            placement: p.placement.map(|p| PlacementPlan {
                state: p.state.to_string(),
                members: p.members.into_iter().map(Into::into).collect(),
                placed_by: p.placed_by,
                preempts: p.preempts,
                preempted_by: p.preempted_by,
                reason: p.reason,
            }),
        }
    }
}
