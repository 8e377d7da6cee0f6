//! The search for the best placement of a request on one node, and the score that ranks
//! nodes against each other.

use std::cmp::Reverse;

use crate::{DeviceRequest, NodeView, Placement, Request, Unit};

/// The most domain choices tried for the `nvlink_all` entries of one request on one node.
/// Requests with one or two such entries never come near it; beyond it the node counts as
/// not fitting, so a hostile request cannot make a decision run long.
const MAX_DOMAIN_TRIES: u32 = 10_000;

/// The best placement of a request on one node and how good it is.
pub(crate) struct Fit {
    pub placement: Placement,
    pub score: Score,
}

/// How good a node's placement is; lower is better. Field order is precedence.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Score {
    /// Free matching units of the domains chosen for `nvlink_all` entries, summed: the
    /// tightest fit wins.
    nvlink_free: u64,
    /// Domains idle before this request that it takes units from.
    idle_domains_touched: u32,
    /// More busy units first: pack.
    busy_units: Reverse<u32>,
    /// Lowest node id on ties.
    node: u32,
}

/// The best placement of `req` on `node`, or `None` when it does not fit there.
pub(crate) fn best_on(req: &Request, node: &NodeView<'_>) -> Option<Fit> {
    if could_fit(req, node) {
        search_on(req, node)
    } else {
        None
    }
}

/// [`best_on`] without the quick test: the full search.
pub(crate) fn search_on(req: &Request, node: &NodeView<'_>) -> Option<Fit> {
    let mut units: Vec<&Unit> = node.free.iter().collect();
    units.sort_by_key(|u| u.id);
    let mut search = Search {
        req,
        node,
        taken: vec![false; units.len()],
        units,
        chosen: vec![Vec::new(); req.devices.len()],
        nvlink_free: 0,
        tries: 0,
    };
    if !search.solve(&entry_order(req), 0) {
        return None;
    }

    let mut touched: Vec<u32> = search
        .chosen
        .iter()
        .flatten()
        .filter_map(|&i| search.units[i].nvlink_domain)
        .filter(|&d| node.domain_busy(d) == 0)
        .collect();
    touched.sort_unstable();
    touched.dedup();

    let units = search
        .chosen
        .iter()
        .flat_map(|entry| entry.iter().map(|&i| search.units[i].id))
        .collect();
    Some(Fit {
        placement: Placement {
            node: node.id,
            units,
        },
        score: Score {
            nvlink_free: search.nvlink_free,
            idle_domains_touched: touched.len() as u32,
            busy_units: Reverse(node.busy_units),
            node: node.id,
        },
    })
}

/// A quick test, without allocating, of what any placement of `req` on `node` needs: each
/// entry finds enough units of its class and model (in one NVLink domain for `nvlink_all`),
/// and the node has enough such units for all entries together. `false` means the request
/// cannot fit; `true` means the search must decide.
pub(crate) fn could_fit(req: &Request, node: &NodeView<'_>) -> bool {
    let usable = node
        .free
        .iter()
        .filter(|u| req.devices.iter().any(|d| d.count > 0 && d.accepts(u)))
        .count() as u64;
    if usable < req.unit_count() {
        return false;
    }
    req.devices.iter().filter(|d| d.count > 0).all(|entry| {
        let matching = || node.free.iter().filter(|u| entry.accepts(u));
        if !entry.nvlink_all {
            return matching().count() >= entry.count as usize;
        }
        matching().enumerate().any(|(i, first)| {
            let Some(domain) = first.nvlink_domain else {
                return false;
            };
            // Count each domain once, at its first unit.
            let seen_before = matching().take(i).any(|u| u.nvlink_domain == Some(domain));
            !seen_before
                && matching()
                    .filter(|u| u.nvlink_domain == Some(domain))
                    .count()
                    >= entry.count as usize
        })
    })
}

/// The order entries are satisfied in: `nvlink_all` entries first, largest first (they are
/// the hardest to fit and the only ones with a choice to revisit), then entries pinned to a
/// model, then the rest, so an entry that accepts any model never takes the units a pinned
/// one needs. Entries asking for nothing are left out.
fn entry_order(req: &Request) -> Vec<usize> {
    let mut order: Vec<usize> = (0..req.devices.len())
        .filter(|&i| req.devices[i].count > 0)
        .collect();
    order.sort_by_key(|&i| {
        let d = &req.devices[i];
        (
            !d.nvlink_all,
            Reverse(if d.nvlink_all { d.count } else { 0 }),
            d.model.is_none(),
            i,
        )
    });
    order
}

struct Search<'a> {
    req: &'a Request,
    node: &'a NodeView<'a>,
    /// The node's free units, by ascending id.
    units: Vec<&'a Unit>,
    /// Whether `units[i]` is already taken by an entry.
    taken: Vec<bool>,
    /// Per entry of the request, indices into `units`.
    chosen: Vec<Vec<usize>>,
    nvlink_free: u64,
    tries: u32,
}

impl Search<'_> {
    /// Satisfies `order[k..]` given what earlier entries took, backtracking over the domain
    /// chosen for each `nvlink_all` entry. Other entries have no choice to revisit: once the
    /// domains are fixed, taking pinned entries before open ones finds units for all of them
    /// whenever any assignment would.
    fn solve(&mut self, order: &[usize], k: usize) -> bool {
        let Some(&entry_index) = order.get(k) else {
            return true;
        };
        let entry = &self.req.devices[entry_index];
        if entry.nvlink_all {
            for (domain, free) in self.domain_candidates(entry) {
                self.tries += 1;
                if self.tries > MAX_DOMAIN_TRIES {
                    return false;
                }
                let picked: Vec<usize> = self
                    .open_units(entry)
                    .filter(|&i| self.units[i].nvlink_domain == Some(domain))
                    .take(entry.count as usize)
                    .collect();
                self.take(entry_index, picked);
                self.nvlink_free += u64::from(free);
                if self.solve(order, k + 1) {
                    return true;
                }
                self.nvlink_free -= u64::from(free);
                self.release(entry_index);
            }
            false
        } else {
            let open: Vec<usize> = self.open_units(entry).collect();
            if open.len() < entry.count as usize {
                return false;
            }
            let domains = self.domain_stats(&open);
            let mut picked = open;
            picked.sort_by_key(|&i| packing_key(&domains, self.units[i]));
            picked.truncate(entry.count as usize);
            picked.sort_unstable();
            self.take(entry_index, picked);
            if self.solve(order, k + 1) {
                return true;
            }
            self.release(entry_index);
            false
        }
    }

    /// Untaken units that `entry` accepts, by ascending id.
    fn open_units<'s>(&'s self, entry: &'s DeviceRequest) -> impl Iterator<Item = usize> + 's {
        (0..self.units.len()).filter(move |&i| !self.taken[i] && entry.accepts(self.units[i]))
    }

    /// Domains that still hold `entry` whole, with their free matching units, best fit
    /// first: fewest free matching units, then busiest, then lowest id.
    fn domain_candidates(&self, entry: &DeviceRequest) -> Vec<(u32, u32)> {
        let open: Vec<usize> = self.open_units(entry).collect();
        let mut stats = self.domain_stats(&open);
        stats.retain(|s| s.free >= entry.count);
        stats.sort_by_key(|s| (s.free, Reverse(s.busy), s.domain));
        stats.into_iter().map(|s| (s.domain, s.free)).collect()
    }

    /// The domains of the `open` units, each with how many of them it holds and how busy
    /// it is, counting the units this request already took in it as busy.
    fn domain_stats(&self, open: &[usize]) -> Vec<DomainStat> {
        let mut stats: Vec<DomainStat> = Vec::new();
        for &i in open {
            let Some(domain) = self.units[i].nvlink_domain else {
                continue;
            };
            match stats.iter_mut().find(|s| s.domain == domain) {
                Some(s) => s.free += 1,
                None => stats.push(DomainStat {
                    domain,
                    free: 1,
                    busy: self.node.domain_busy(domain),
                }),
            }
        }
        for (i, unit) in self.units.iter().enumerate() {
            if !self.taken[i] {
                continue;
            }
            if let Some(s) = stats
                .iter_mut()
                .find(|s| Some(s.domain) == unit.nvlink_domain)
            {
                s.busy = s.busy.saturating_add(1);
            }
        }
        stats
    }

    fn take(&mut self, entry_index: usize, picked: Vec<usize>) {
        for &i in &picked {
            self.taken[i] = true;
        }
        self.chosen[entry_index] = picked;
    }

    fn release(&mut self, entry_index: usize) {
        for i in std::mem::take(&mut self.chosen[entry_index]) {
            self.taken[i] = false;
        }
    }
}

struct DomainStat {
    domain: u32,
    /// Open units of the entry in this domain.
    free: u32,
    busy: u32,
}

/// Where a unit stands in the packing order of an entry without `nvlink_all`: units outside
/// any domain, then busy domains, then idle ones; within those, the domain with the fewest
/// free matching units, then the lowest domain id and unit id.
fn packing_key(domains: &[DomainStat], unit: &Unit) -> (bool, bool, u32, u32, u32) {
    let stat = unit
        .nvlink_domain
        .and_then(|d| domains.iter().find(|s| s.domain == d));
    match stat {
        None => (false, false, 0, 0, unit.id),
        Some(s) => (true, s.busy == 0, s.free, s.domain, unit.id),
    }
}
