//! The exact search for a request on one node, run only when the greedy search of
//! [`Search::solve`] finds nothing. The greedy one gives an `nvlink_all` entry the lowest
//! ids of its domain, which may be the units a later entry needed; this one decides.
//!
//! It tries the domains of the `nvlink_all` entries best fit first, as the greedy search
//! does (counting the free units of a domain before any entry takes some), and keeps a maximum assignment of entries to units (each entry wants its count of units,
//! each unit serves one entry) under the domains chosen so far, an entry whose domain is
//! not chosen yet taking units of any domain. When that assignment falls short, no choice
//! for the remaining entries can serve the request and the domain is passed over; when
//! every domain is chosen and it serves every entry, it is a placement. Each choice only
//! changes the units one entry may take, so the assignment is repaired from the last one
//! by augmenting paths rather than rebuilt.

use super::{MAX_DOMAIN_TRIES, Scratch, Search};
use crate::NO_DOMAIN;

/// [`Flow::owner`] of a unit no entry holds.
const FREE: usize = usize::MAX;

/// The assignment of the exact search. Entries are named by their position `p` in the
/// order entries are satisfied in, units by their local index `k`.
#[derive(Default)]
pub(super) struct Flow {
    /// Per unit, the entry holding it, or [`FREE`].
    owner: Vec<usize>,
    /// Per entry, how many units it holds.
    held: Vec<u32>,
    /// Per entry, the domain chosen for it, or [`NO_DOMAIN`]: for an `nvlink_all` entry
    /// not decided yet, any unit in some domain.
    domain: Vec<u32>,
    /// The units and entries an augmenting path has visited.
    unit_seen: Vec<bool>,
    entry_seen: Vec<bool>,
}

impl Search<'_, '_> {
    /// Satisfies every entry of `order`, exactly: `false` only when no placement exists
    /// (or the domain choices ran out). Leaves the units in `s.chosen` and adds the free
    /// matching units of the chosen domains to `nvlink_free`.
    pub(super) fn solve_exactly(&mut self, order: &[usize]) -> bool {
        let units = self.node.free_len();
        let flow = &mut self.s.flow;
        flow.owner.clear();
        flow.owner.resize(units, FREE);
        flow.held.clear();
        flow.held.resize(order.len(), 0);
        flow.domain.clear();
        flow.domain.resize(order.len(), NO_DOMAIN);
        if !(self.fill(order) && self.choose_domains(order, 0)) {
            return false;
        }
        let Scratch { flow, chosen, .. } = &mut *self.s;
        for (k, &p) in flow.owner.iter().enumerate() {
            if p != FREE {
                chosen[order[p]].push(k);
            }
        }
        true
    }

    /// Chooses the domains of the `nvlink_all` entries from `order[p..]` on, given an
    /// assignment that serves every entry under the choices before them.
    fn choose_domains(&mut self, order: &[usize], p: usize) -> bool {
        let Some(&entry_index) = order.get(p) else {
            return true;
        };
        let entry = &self.req.devices[entry_index];
        if !entry.nvlink_all {
            // The other entries come after every `nvlink_all` one.
            return true;
        }
        if self.s.domains.len() <= p {
            self.s.domains.resize_with(p + 1, Vec::new);
        }
        // Nothing is taken: the domains that hold the entry on their own.
        let mut domains = std::mem::take(&mut self.s.domains[p]);
        self.domain_candidates(entry, &mut domains);
        let mut fits = false;
        for &(domain, free) in &domains {
            self.tries += 1;
            if self.tries > MAX_DOMAIN_TRIES {
                break;
            }
            self.fix(p, domain);
            self.nvlink_free += u64::from(free);
            if self.fill(order) && self.choose_domains(order, p + 1) {
                fits = true;
                break;
            }
            self.nvlink_free -= u64::from(free);
        }
        if !fits {
            self.fix(p, NO_DOMAIN);
        }
        self.s.domains[p] = domains;
        fits
    }

    /// Chooses `domain` for entry `p` (or none), giving up the units it held elsewhere.
    fn fix(&mut self, p: usize, domain: u32) {
        let flow = &mut self.s.flow;
        flow.domain[p] = domain;
        if domain == NO_DOMAIN {
            return;
        }
        for (k, owner) in flow.owner.iter_mut().enumerate() {
            if *owner == p && self.node.nvlink_domain[k] != domain {
                *owner = FREE;
                flow.held[p] -= 1;
            }
        }
    }

    /// Gives every entry its count of units, moving units between entries along augmenting
    /// paths; `false` when an entry falls short, and then no assignment serves them all.
    fn fill(&mut self, order: &[usize]) -> bool {
        for p in 0..order.len() {
            while self.s.flow.held[p] < self.req.devices[order[p]].count {
                let flow = &mut self.s.flow;
                flow.unit_seen.clear();
                flow.unit_seen.resize(flow.owner.len(), false);
                flow.entry_seen.clear();
                flow.entry_seen.resize(order.len(), false);
                if !self.augment(order, p) {
                    return false;
                }
                self.s.flow.held[p] += 1;
            }
        }
        true
    }

    /// Finds entry `p` one more unit: a free one, or one held by an entry that can take
    /// another in its place.
    fn augment(&mut self, order: &[usize], p: usize) -> bool {
        self.s.flow.entry_seen[p] = true;
        for k in 0..self.node.free_len() {
            if self.s.flow.unit_seen[k] || !self.accepts(order, p, k) {
                continue;
            }
            self.s.flow.unit_seen[k] = true;
            let q = self.s.flow.owner[k];
            if q == FREE || !self.s.flow.entry_seen[q] && self.augment(order, q) {
                self.s.flow.owner[k] = p;
                return true;
            }
        }
        false
    }

    /// Whether entry `p` may take unit `k` under the domain chosen for it so far.
    fn accepts(&self, order: &[usize], p: usize, k: usize) -> bool {
        let entry = &self.req.devices[order[p]];
        let domain = self.node.nvlink_domain[k];
        let chosen = self.s.flow.domain[p];
        entry.accepts_at(self.node, k)
            && (!entry.nvlink_all
                || domain != NO_DOMAIN && (chosen == NO_DOMAIN || chosen == domain))
    }
}
