//! Whether a request fits on a node once some spot bookings are terminated, answered by the
//! default placer itself: the node as it would be is written in the placer's columns and
//! [`orl_placer_default::fits_on`] decides, so that the preemptor frees exactly what the
//! placer then needs.

use orl_placer_default as placer;

use crate::{DomainLoad, Node, Request, SpotBooking, Unit};

/// The buffers of the checks of one call, kept from check to check so that a check
/// allocates only while they grow.
#[derive(Default)]
pub(crate) struct Room {
    candidates: placer::Candidates,
    units: Vec<Unit>,
    domains: Vec<DomainLoad>,
}

impl Room {
    /// Whether the default placer places `req` on `node` alone once `victims` (bookings on
    /// `node`) are terminated: their units free, and no longer busy on the node or in
    /// their domains. A unit listed twice counts once.
    pub(crate) fn fits(&mut self, req: &Request, node: &Node, victims: &[&SpotBooking]) -> bool {
        let Room {
            candidates,
            units,
            domains,
        } = self;
        units.clear();
        units.extend_from_slice(&node.free);
        domains.clear();
        domains.extend_from_slice(&node.domains);
        let mut busy_units = node.busy_units;
        for unit in victims.iter().flat_map(|b| &b.units) {
            if units.iter().any(|u| u.id == unit.id) {
                continue;
            }
            units.push(*unit);
            busy_units = busy_units.saturating_sub(1);
            if let Some(domain) = unit.nvlink_domain
                && let Some(load) = domains.iter_mut().find(|d| d.domain == domain)
            {
                load.busy = load.busy.saturating_sub(1);
            }
        }
        // The placer breaks ties by position in its columns: keep the order of the call's
        // unit ids, so it chooses as it would among the host's candidates.
        units.sort_by_key(|u| u.id);
        candidates.clear();
        candidates.push_node(
            node.id,
            busy_units,
            node.total_units,
            domains.iter().copied(),
            units.iter().map(Unit::placer_unit),
        );
        candidates
            .view(0)
            .is_some_and(|view| placer::fits_on(req, &view))
    }
}
