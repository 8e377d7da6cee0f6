//! The search for the best placement of a request on one node, and the score that ranks
//! nodes against each other.

use std::cell::RefCell;
use std::cmp::Reverse;

use crate::{DeviceRequest, NO_DOMAIN, NodeView, Placement, Request};

mod exact;
mod single;

/// The most domain choices tried for the `nvlink_all` entries of one request on one node,
/// by the greedy search and the exact one together. Requests with one or two such entries
/// never come near it; beyond it the node counts as not fitting, so a hostile request
/// cannot make a decision run long.
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
/// Units are named by their local index `k` on the node (unit id `node.first + k`).
#[derive(Default)]
pub(crate) struct Scratch {
    /// The entries of the request in the order they are satisfied.
    order: Vec<usize>,
    /// Whether free unit `k` is already taken by an entry.
    taken: Vec<bool>,
    /// Per entry of the request, the units chosen for it.
    chosen: Vec<Vec<usize>>,
    /// Open units of the entry being satisfied.
    open: Vec<usize>,
    /// Domain statistics of the entry being satisfied.
    stats: Vec<DomainStat>,
    /// Per `nvlink_all` entry (by depth), the domains still to try.
    domains: Vec<Vec<(u32, u32)>>,
    /// The assignment of the exact search.
    flow: exact::Flow,
    /// The node's domains as bit masks, for a request with one entry.
    groups: single::Groups,
    /// The units the one-entry path chose on the node it looked at last (bit `k` for local
    /// unit `k`); `None` when the general search did.
    single: Option<u64>,
}

impl Scratch {
    /// Buffers prepared for `req`.
    pub(crate) fn new(req: &Request) -> Scratch {
        let mut scratch = Scratch::default();
        scratch.prepare(req);
        scratch
    }

    /// Runs `f` with this thread's buffers prepared for `req`: they keep what they grew to
    /// from one decision to the next.
    pub(crate) fn with<R>(req: &Request, f: impl FnOnce(&mut Scratch) -> R) -> R {
        thread_local! {
            static SCRATCH: RefCell<Scratch> = RefCell::default();
        }
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.prepare(req);
            f(scratch)
        })
    }

    fn prepare(&mut self, req: &Request) {
        entry_order(req, &mut self.order);
        self.chosen.resize_with(req.devices.len(), Vec::new);
        self.chosen.iter_mut().for_each(Vec::clear);
        self.single = None;
    }
}

/// How well `req` fits on `node`, or `None` when it does not fit there. The units chosen
/// are left in `scratch` for [`placement`].
#[inline]
pub(crate) fn best_on(req: &Request, node: &NodeView<'_>, scratch: &mut Scratch) -> Option<Score> {
    if let [entry_index] = scratch.order[..]
        && node.free_len() <= single::MAX_UNITS
    {
        single::best_on(&req.devices[entry_index], node, scratch)
    } else if could_fit(req, node) {
        search_on(req, node, scratch)
    } else {
        None
    }
}

/// The placement [`best_on`] found last, from `scratch`.
pub(crate) fn placement(node: &NodeView<'_>, scratch: &Scratch) -> Placement {
    let units = match scratch.single {
        // Set bits, lowest first: `mask & (mask - 1)` clears the lowest.
        Some(mask) => std::iter::successors(Some(mask), |m| Some(m & m.wrapping_sub(1)))
            .take_while(|m| *m != 0)
            .map(|m| node.first + m.trailing_zeros())
            .collect(),
        None => (scratch.chosen.iter().flatten())
            .map(|&k| node.first + k as u32)
            .collect(),
    };
    Placement {
        node: node.id,
        units,
    }
}

/// [`best_on`] without the quick test: the full search. The greedy search decides where
/// it finds a placement; only when it finds none does the exact one, so a node is refused
/// only when no placement exists on it (within [`MAX_DOMAIN_TRIES`]).
pub(crate) fn search_on(
    req: &Request,
    node: &NodeView<'_>,
    scratch: &mut Scratch,
) -> Option<Score> {
    scratch.single = None;
    scratch.taken.clear();
    scratch.taken.resize(node.free_len(), false);
    scratch.chosen.iter_mut().for_each(Vec::clear);
    let order = std::mem::take(&mut scratch.order);
    let mut search = Search {
        req,
        node,
        s: scratch,
        nvlink_free: 0,
        tries: 0,
    };
    let fits = search.solve(&order, 0) || search.solve_exactly(&order);
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
            .map(|&k| node.nvlink_domain[k])
    };
    // Distinct domains idle before this request among those of the chosen units.
    let idle_domains_touched = chosen()
        .enumerate()
        .filter(|&(k, domain)| {
            domain != NO_DOMAIN
                && node.domain_busy(domain) == 0
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
    let free = node.free_len();
    let usable = (0..free)
        .filter(|&k| {
            req.devices
                .iter()
                .any(|d| d.count > 0 && d.accepts_at(node, k))
        })
        .count() as u64;
    if usable < req.unit_count() {
        return false;
    }
    req.devices.iter().filter(|d| d.count > 0).all(|entry| {
        let count = entry.count as usize;
        if !entry.nvlink_all {
            return (0..free).filter(|&k| entry.accepts_at(node, k)).count() >= count;
        }
        (0..free).any(|first| {
            let domain = node.nvlink_domain[first];
            // Count each domain once, at its first matching unit.
            domain != NO_DOMAIN
                && entry.accepts_at(node, first)
                && !(0..first).any(|k| node.nvlink_domain[k] == domain && entry.accepts_at(node, k))
                && (first..free)
                    .filter(|&k| node.nvlink_domain[k] == domain && entry.accepts_at(node, k))
                    .count()
                    >= count
        })
    })
}

/// Fills `order` with the order entries are satisfied in: `nvlink_all` entries first, largest first (they are
/// the hardest to fit and the only ones with a choice to revisit), then entries pinned to a
/// model, then the rest, so an entry that accepts any model never takes the units a pinned
/// one needs. Entries asking for nothing are left out.
fn entry_order(req: &Request, order: &mut Vec<usize>) {
    order.clear();
    order.extend((0..req.devices.len()).filter(|&i| req.devices[i].count > 0));
    order.sort_by_key(|&i| {
        let d = &req.devices[i];
        (
            !d.nvlink_all,
            Reverse(if d.nvlink_all { d.count } else { 0 }),
            d.model.is_none(),
            i,
        )
    });
}

struct Search<'s, 'a> {
    req: &'s Request,
    node: &'s NodeView<'a>,
    s: &'s mut Scratch,
    nvlink_free: u64,
    tries: u32,
}

impl Search<'_, '_> {
    /// Satisfies `order[k..]` given what earlier entries took, backtracking over the domain
    /// chosen for each `nvlink_all` entry. Other entries have no choice to revisit: once the
    /// domains are fixed, taking pinned entries before open ones finds units for all of them
    /// whenever any assignment would. An `nvlink_all` entry, though, takes the lowest ids of
    /// its domain, which may be units a later entry needed: when this finds nothing,
    /// [`solve_exactly`](Self::solve_exactly) decides.
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
                picked.retain(|&k| self.node.nvlink_domain[k] == domain);
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
            let node = self.node;
            picked.sort_by_key(|&k| packing_key(stats, node, k));
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
        let Scratch { open, taken, .. } = &mut *self.s;
        open.clear();
        open.extend((0..taken.len()).filter(|&k| !taken[k] && entry.accepts_at(self.node, k)));
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
        let Scratch { taken, stats, .. } = &mut *self.s;
        let node = self.node;
        stats.clear();
        for &k in open {
            let domain = node.nvlink_domain[k];
            if domain == NO_DOMAIN {
                continue;
            }
            match stats.iter_mut().find(|s| s.domain == domain) {
                Some(s) => s.free += 1,
                None => stats.push(DomainStat {
                    domain,
                    free: 1,
                    busy: node.domain_busy(domain),
                }),
            }
        }
        for (k, taken) in taken.iter().enumerate() {
            if !taken {
                continue;
            }
            if let Some(s) = stats.iter_mut().find(|s| s.domain == node.nvlink_domain[k]) {
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
fn packing_key(
    domains: &[DomainStat],
    node: &NodeView<'_>,
    k: usize,
) -> (bool, bool, u32, u32, usize) {
    let domain = node.nvlink_domain[k];
    let stat = (domain != NO_DOMAIN)
        .then(|| domains.iter().find(|s| s.domain == domain))
        .flatten();
    match stat {
        None => (false, false, 0, 0, k),
        Some(s) => (true, s.busy == 0, s.free, s.domain, k),
    }
}
