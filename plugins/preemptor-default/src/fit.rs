//! Whether a request fits on one node by the rules of the default placer
//! (`orl-placer-default`).
//!
//! The preemptor must agree with the placer exactly: a node it frees must be one the placer
//! then places on, and it must not terminate more than the placer needs. So this follows the
//! placer's search step for step (entry order, domain order, units taken within a domain,
//! the cap on domain choices, the exact search it falls back on when its greedy one finds
//! nothing) and leaves out only what ranks placements against each other. The tests check
//! the two agree on generated inputs.

use std::cmp::Reverse;

use crate::{DeviceRequest, Node, Request, Unit};

/// The placer's cap on domain choices tried per node.
const MAX_DOMAIN_TRIES: u32 = 10_000;

/// Whether the default placer would place `req` on `node` alone.
pub(crate) fn fits(req: &Request, node: &Node) -> bool {
    if req.unit_count() == 0 {
        return false;
    }
    let mut units: Vec<&Unit> = node.free.iter().collect();
    units.sort_by_key(|u| u.id);
    let mut search = Search {
        req,
        node,
        taken: vec![false; units.len()],
        units,
        tries: 0,
    };
    let order = entry_order(req);
    search.solve(&order, 0) || search.solve_exactly(&order)
}

/// What the request asks for, for a reason: `6 free gpu units of model H100 in one NVLink
/// domain and 1 free nic-vf unit`.
pub(crate) fn describe(req: &Request) -> String {
    let parts: Vec<String> = req
        .devices
        .iter()
        .filter(|d| d.count > 0)
        .map(|d| {
            let mut text = format!(
                "{} free {} unit{}",
                d.count,
                d.class.as_str(),
                if d.count == 1 { "" } else { "s" }
            );
            if let Some(model) = d.model {
                match req.models.get(model as usize) {
                    Some(name) => text.push_str(&format!(" of model {name}")),
                    None => text.push_str(&format!(" of model #{model}")),
                }
            }
            if d.nvlink_all {
                text.push_str(" in one NVLink domain");
            }
            text
        })
        .collect();
    match parts.split_last() {
        None => "the requested devices".to_string(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// The placer's entry order: `nvlink_all` entries largest first, then entries pinned to a
/// model, then the rest; entries asking for nothing left out.
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
    node: &'a Node,
    /// The node's free units, by ascending id.
    units: Vec<&'a Unit>,
    taken: Vec<bool>,
    tries: u32,
}

impl Search<'_> {
    fn solve(&mut self, order: &[usize], k: usize) -> bool {
        let Some(&entry_index) = order.get(k) else {
            return true;
        };
        let entry = &self.req.devices[entry_index];
        let open: Vec<usize> = self.open_units(entry).collect();
        if entry.nvlink_all {
            for domain in self.domain_candidates(entry, &open) {
                self.tries += 1;
                if self.tries > MAX_DOMAIN_TRIES {
                    return false;
                }
                let picked: Vec<usize> = open
                    .iter()
                    .copied()
                    .filter(|&i| self.units[i].nvlink_domain == Some(domain))
                    .take(entry.count as usize)
                    .collect();
                self.set(&picked, true);
                if self.solve(order, k + 1) {
                    return true;
                }
                self.set(&picked, false);
            }
            false
        } else {
            // Only `nvlink_all` entries come before this one, and none after it, so which
            // of the accepted units it takes cannot change the outcome; only how many.
            if open.len() < entry.count as usize {
                return false;
            }
            let picked = &open[..entry.count as usize];
            self.set(picked, true);
            let fits = self.solve(order, k + 1);
            self.set(picked, false);
            fits
        }
    }

    /// Untaken units that `entry` accepts, by ascending id.
    fn open_units<'s>(&'s self, entry: &'s DeviceRequest) -> impl Iterator<Item = usize> + 's {
        (0..self.units.len()).filter(move |&i| !self.taken[i] && entry.accepts(self.units[i]))
    }

    /// Domains that still hold `entry` whole, in the placer's order: fewest open units, then
    /// busiest (counting units this request took), then lowest id.
    fn domain_candidates(&self, entry: &DeviceRequest, open: &[usize]) -> Vec<u32> {
        let mut free: Vec<(u32, u32)> = Vec::new();
        for &i in open {
            let Some(domain) = self.units[i].nvlink_domain else {
                continue;
            };
            match free.iter_mut().find(|(d, _)| *d == domain) {
                Some((_, n)) => *n += 1,
                None => free.push((domain, 1)),
            }
        }
        free.retain(|&(_, n)| n >= entry.count);
        let mut ranked: Vec<(u32, Reverse<u32>, u32)> = free
            .into_iter()
            .map(|(domain, n)| (n, Reverse(self.busy(domain)), domain))
            .collect();
        ranked.sort_unstable();
        ranked.into_iter().map(|(_, _, domain)| domain).collect()
    }

    fn busy(&self, domain: u32) -> u32 {
        let taken_here = (0..self.units.len())
            .filter(|&i| self.taken[i] && self.units[i].nvlink_domain == Some(domain))
            .count() as u32;
        self.node.domain_busy(domain).saturating_add(taken_here)
    }

    /// The placer's exact search: the domains of the `nvlink_all` entries in the same order
    /// (nothing taken), each choice counted against the same cap, passed over when no
    /// assignment of entries to units serves every entry under the choices so far.
    fn solve_exactly(&mut self, order: &[usize]) -> bool {
        let mut domains = vec![None; order.len()];
        self.assignable(order, &domains) && self.choose_domains(order, &mut domains, 0)
    }

    fn choose_domains(&mut self, order: &[usize], domains: &mut [Option<u32>], p: usize) -> bool {
        let Some(&entry_index) = order.get(p) else {
            return true;
        };
        let entry = &self.req.devices[entry_index];
        if !entry.nvlink_all {
            return true;
        }
        let open: Vec<usize> = self.open_units(entry).collect();
        for domain in self.domain_candidates(entry, &open) {
            self.tries += 1;
            if self.tries > MAX_DOMAIN_TRIES {
                break;
            }
            domains[p] = Some(domain);
            if self.assignable(order, domains) && self.choose_domains(order, domains, p + 1) {
                return true;
            }
        }
        domains[p] = None;
        false
    }

    /// Whether every entry of `order` gets its count of units, an `nvlink_all` entry in
    /// the domain chosen for it (any domain while none is): a maximum assignment built by
    /// augmenting paths.
    fn assignable(&self, order: &[usize], domains: &[Option<u32>]) -> bool {
        let mut owner = vec![usize::MAX; self.units.len()];
        order.iter().enumerate().all(|(p, &i)| {
            (0..self.req.devices[i].count).all(|_| {
                let mut seen = vec![false; self.units.len()];
                self.augment(order, domains, &mut owner, &mut seen, p)
            })
        })
    }

    fn augment(
        &self,
        order: &[usize],
        domains: &[Option<u32>],
        owner: &mut [usize],
        seen: &mut [bool],
        p: usize,
    ) -> bool {
        let entry = &self.req.devices[order[p]];
        for k in 0..self.units.len() {
            let unit = self.units[k];
            let accepts = entry.accepts(unit)
                && (!entry.nvlink_all
                    || unit.nvlink_domain.is_some()
                        && domains[p].is_none_or(|d| unit.nvlink_domain == Some(d)));
            if seen[k] || !accepts {
                continue;
            }
            seen[k] = true;
            let q = owner[k];
            if q == usize::MAX || self.augment(order, domains, owner, seen, q) {
                owner[k] = p;
                return true;
            }
        }
        false
    }

    fn set(&mut self, picked: &[usize], taken: bool) {
        for &i in picked {
            self.taken[i] = taken;
        }
    }
}
