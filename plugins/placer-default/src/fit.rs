//! The search for the best placement of a request on one node, and the score that ranks
//! nodes against each other.

use std::cmp::Reverse;

use crate::{DeviceRequest, NodeView, Placement, Request, Unit};

/// The most domain choices tried for the `nvlink_all` entries of one request on one node.
/// Requests with one or two such entries never come near it; beyond it the node counts as
/// not fitting, so a hostile request cannot make a decision run long.
const MAX_DOMAIN_TRIES: u32 = 10_000;

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

/// Buffers a search reuses from node to node, so that ranking many nodes allocates only
/// while the buffers grow.
#[derive(Default)]
pub(crate) struct Scratch<'a> {
    /// The entries of the request in the order they are satisfied.
    order: Vec<usize>,
    /// The node's free units, by ascending id.
    units: Vec<&'a Unit>,
    /// Whether `units[i]` is already taken by an entry.
    taken: Vec<bool>,
    /// Per entry of the request, indices into `units`.
    chosen: Vec<Vec<usize>>,
    /// Open units of the entry being satisfied.
    open: Vec<usize>,
    /// Domain statistics of the entry being satisfied.
    stats: Vec<DomainStat>,
    /// Per `nvlink_all` entry (by depth), the domains still to try.
    domains: Vec<Vec<(u32, u32)>>,
}

impl<'a> Scratch<'a> {
    /// Prepares the buffers for `req`.
    pub(crate) fn new(req: &Request) -> Scratch<'a> {
        Scratch {
            order: entry_order(req),
            chosen: vec![Vec::new(); req.devices.len()],
            ..Scratch::default()
        }
    }
}

/// How well `req` fits on `node`, or `None` when it does not fit there. The units chosen
/// are left in `scratch` for [`placement`].
pub(crate) fn best_on<'a>(
    req: &Request,
    node: &NodeView<'a>,
    scratch: &mut Scratch<'a>,
) -> Option<Score> {
    if could_fit(req, node) {
        search_on(req, node, scratch)
    } else {
        None
    }
}

/// The placement [`best_on`] found last, from `scratch`.
pub(crate) fn placement(node: &NodeView<'_>, scratch: &Scratch<'_>) -> Placement {
    Placement {
        node: node.id,
        units: scratch
            .chosen
            .iter()
            .flat_map(|entry| entry.iter().map(|&i| scratch.units[i].id))
            .collect(),
    }
}

/// [`best_on`] without the quick test: the full search.
pub(crate) fn search_on<'a>(
    req: &Request,
    node: &NodeView<'a>,
    scratch: &mut Scratch<'a>,
) -> Option<Score> {
    scratch.units.clear();
    scratch.units.extend(node.free.iter());
    if !scratch.units.is_sorted_by_key(|u| u.id) {
        scratch.units.sort_by_key(|u| u.id);
    }
    scratch.taken.clear();
    scratch.taken.resize(scratch.units.len(), false);
    scratch.chosen.iter_mut().for_each(Vec::clear);
    let order = std::mem::take(&mut scratch.order);
    let mut search = Search {
        req,
        node,
        s: scratch,
        nvlink_free: 0,
        tries: 0,
    };
    let fits = search.solve(&order, 0);
    let nvlink_free = search.nvlink_free;
    scratch.order = order;
    if !fits {
        return None;
    }
    let chosen = || {
        scratch
            .chosen
            .iter()
            .flatten()
            .map(|&i| scratch.units[i].nvlink_domain)
    };
    // Distinct domains idle before this request among those of the chosen units.
    let idle_domains_touched = chosen()
        .enumerate()
        .filter(|&(k, domain)| {
            domain.is_some_and(|d| node.domain_busy(d) == 0)
                && !chosen().take(k).any(|earlier| earlier == domain)
        })
        .count() as u32;
    Some(Score {
        nvlink_free,
        idle_domains_touched,
        busy_units: Reverse(node.busy_units),
        node: node.id,
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

struct Search<'s, 'a> {
    req: &'s Request,
    node: &'s NodeView<'a>,
    s: &'s mut Scratch<'a>,
    nvlink_free: u64,
    tries: u32,
}

impl Search<'_, '_> {
    /// Satisfies `order[k..]` given what earlier entries took, backtracking over the domain
    /// chosen for each `nvlink_all` entry. Other entries have no choice to revisit: once the
    /// domains are fixed, taking pinned entries before open ones finds units for all of them
    /// whenever any assignment would.
    fn solve(&mut self, order: &[usize], k: usize) -> bool {
        let Some(&entry_index) = order.get(k) else {
            return true;
        };
        let entry = &self.req.devices[entry_index];
        let count = entry.count as usize;
        if entry.nvlink_all {
            if self.s.domains.len() <= k {
                self.s.domains.resize_with(k + 1, Vec::new);
            }
            let mut domains = std::mem::take(&mut self.s.domains[k]);
            self.domain_candidates(entry, &mut domains);
            let mut fits = false;
            for &(domain, free) in &domains {
                self.tries += 1;
                if self.tries > MAX_DOMAIN_TRIES {
                    break;
                }
                self.open_units(entry);
                let mut picked = std::mem::take(&mut self.s.open);
                picked.retain(|&i| self.s.units[i].nvlink_domain == Some(domain));
                picked.truncate(count);
                self.take(entry_index, &picked);
                self.s.open = picked;
                self.nvlink_free += u64::from(free);
                if self.solve(order, k + 1) {
                    fits = true;
                    break;
                }
                self.nvlink_free -= u64::from(free);
                self.release(entry_index);
            }
            self.s.domains[k] = domains;
            fits
        } else {
            self.open_units(entry);
            if self.s.open.len() < count {
                return false;
            }
            let mut picked = std::mem::take(&mut self.s.open);
            self.domain_stats(&picked);
            let stats = &self.s.stats;
            let units = &self.s.units;
            picked.sort_by_key(|&i| packing_key(stats, units[i]));
            picked.truncate(count);
            picked.sort_unstable();
            self.take(entry_index, &picked);
            self.s.open = picked;
            if self.solve(order, k + 1) {
                return true;
            }
            self.release(entry_index);
            false
        }
    }

    /// Fills `s.open` with the untaken units that `entry` accepts, by ascending id.
    fn open_units(&mut self, entry: &DeviceRequest) {
        let Scratch {
            open, units, taken, ..
        } = &mut *self.s;
        open.clear();
        open.extend((0..units.len()).filter(|&i| !taken[i] && entry.accepts(units[i])));
    }

    /// Fills `domains` with the domains that still hold `entry` whole, with their free
    /// matching units, best fit first: fewest free matching units, then busiest, then
    /// lowest id.
    fn domain_candidates(&mut self, entry: &DeviceRequest, domains: &mut Vec<(u32, u32)>) {
        self.open_units(entry);
        let open = std::mem::take(&mut self.s.open);
        self.domain_stats(&open);
        self.s.open = open;
        let stats = &mut self.s.stats;
        stats.retain(|s| s.free >= entry.count);
        stats.sort_by_key(|s| (s.free, Reverse(s.busy), s.domain));
        domains.clear();
        domains.extend(stats.iter().map(|s| (s.domain, s.free)));
    }

    /// Fills `s.stats` with the domains of the `open` units, each with how many of them it
    /// holds and how busy it is, counting the units this request already took in it as
    /// busy.
    fn domain_stats(&mut self, open: &[usize]) {
        let Scratch {
            units,
            taken,
            stats,
            ..
        } = &mut *self.s;
        stats.clear();
        for &i in open {
            let Some(domain) = units[i].nvlink_domain else {
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
        for (i, unit) in units.iter().enumerate() {
            if !taken[i] {
                continue;
            }
            if let Some(s) = stats
                .iter_mut()
                .find(|s| Some(s.domain) == unit.nvlink_domain)
            {
                s.busy = s.busy.saturating_add(1);
            }
        }
    }

    fn take(&mut self, entry_index: usize, picked: &[usize]) {
        for &i in picked {
            self.s.taken[i] = true;
        }
        let chosen = &mut self.s.chosen[entry_index];
        chosen.clear();
        chosen.extend_from_slice(picked);
    }

    fn release(&mut self, entry_index: usize) {
        let Scratch { chosen, taken, .. } = &mut *self.s;
        for &i in &chosen[entry_index] {
            taken[i] = false;
        }
        chosen[entry_index].clear();
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
