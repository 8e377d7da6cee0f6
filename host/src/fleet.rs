//! What a capacity dashboard draws: a pool's units over time with the bookings and node
//! reservation terms that hold them ([`timeline`]), and its units counted by model and by
//! what holds them, now, over the coming days and over the last day ([`counts`]).
//!
//! Both read the pools the caller sees ([`crate::pools::store::list`]) and each node from
//! the capacity view, as decisions do; what a caller learns of each booking and term is
//! decided here, once ([`Sight`]), by the rules REST applies to the same objects: a booking's
//! reservation and tenant only for platform operators and the tenant's own members who may
//! read compute reservations, its bare occupancy also for the node's owner; a node
//! reservation term for operators, the node's owner and the orgs in its audience or
//! managing it. Counts are sums over a pool and name no one.

pub mod counts;
pub mod timeline;

use crate::iam::{Permission, Principal};
use crate::node_reservations::queries::Record;

/// What one caller may learn of the bookings and terms on a node.
pub struct Sight<'a> {
    caller: &'a Principal,
}

impl<'a> Sight<'a> {
    pub fn of(caller: &'a Principal) -> Sight<'a> {
        Sight { caller }
    }

    /// Whether the caller sees which reservation (and tenant) holds a booking of `tenant_id`.
    pub fn sees_holder(&self, tenant_id: &str) -> bool {
        self.caller.has(Permission::ComputeRead) && self.caller.acts_for(tenant_id)
    }

    /// Whether the caller sees a booking of `tenant_id` on a node of `node_owner` at all:
    /// its holder, or that the unit is taken (the node's owner reads its own nodes' use).
    pub fn sees_booking(&self, node_owner: &str, tenant_id: &str) -> bool {
        self.sees_holder(tenant_id) || self.caller.acts_for(node_owner)
    }

    /// Whether the caller sees node reservation `claim` on a node of `node_owner`.
    pub fn sees_term(&self, node_owner: &str, claim: &Record) -> bool {
        let org = &self.caller.org_id;
        self.caller.acts_for(node_owner)
            || claim.allowed_org_ids.contains(org)
            || claim.managing_org_ids.contains(org)
    }
}
