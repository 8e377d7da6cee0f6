//! The search for a request with one entry — nearly every request — on a node with at most
//! 64 free units, on bit masks: one pass over the units, then a few operations per NVLink
//! domain. It makes exactly the choice the general search makes (a test compares them).

use std::cmp::Reverse;

use super::{Score, Scratch};
use crate::{DeviceRequest, NO_DOMAIN, NodeView};

/// The most free units a node may have for this path: one bit each.
pub(crate) const MAX_UNITS: usize = 64;

/// Domains with ids below this are grouped in a table rather than a list (at most 64: one
/// bit each in a mask of the domains seen).
pub(crate) const TABLE: usize = 64;

/// One NVLink domain of the node: its id, the entry's units in it, and its busy units.
pub(crate) struct Domain {
    id: u32,
    units: u64,
    busy: u32,
}

impl Domain {
    /// Where the domain stands when an open entry packs: busy domains before idle ones, the
    /// fewest matching units first, then the lowest id.
    fn packing_key(&self) -> (bool, u32, u32) {
        (self.busy == 0, self.units.count_ones(), self.id)
    }

    /// Where the domain stands for an `nvlink_all` entry: the fewest matching units (best
    /// fit), then the busiest, then the lowest id.
    fn fit_key(&self) -> (u32, Reverse<u32>, u32) {
        (self.units.count_ones(), Reverse(self.busy), self.id)
    }
}

/// The best placement of `entry` (the request's only entry) on `node`, which has at most
/// [`MAX_UNITS`] free units; the chosen units go to `scratch.single`.
pub(crate) fn best_on(
    entry: &DeviceRequest,
    node: &NodeView<'_>,
    scratch: &mut Scratch,
) -> Option<Score> {
    let count = entry.count;
    let matching = matching(entry, node);
    if matching.count_ones() < count {
        return None;
    }
    let mut outside = 0u64;
    // Domains with an id below 64 (the usual case) are grouped in a table, with `seen`
    // marking the entries written for this node; others in the list.
    let mut seen = 0u64;
    let table = &mut scratch.table;
    let domains = &mut scratch.masks;
    domains.clear();
    let mut rest = matching;
    while rest != 0 {
        let bit = rest & rest.wrapping_neg();
        rest ^= bit;
        let id = node.nvlink_domain[bit.trailing_zeros() as usize];
        if let Some(entry) = table.get_mut(id as usize) {
            // Keep what the entry holds only when it was written for this node.
            let kept = 0u64.wrapping_sub((seen >> id) & 1);
            *entry = (*entry & kept) | bit;
            seen |= 1 << id;
        } else if id == NO_DOMAIN {
            outside |= bit;
        } else if let Some(domain) = domains.iter_mut().find(|d| d.id == id) {
            domain.units |= bit;
        } else {
            domains.push(Domain {
                id,
                units: bit,
                busy: node.domain_busy(id),
            });
        }
    }
    while seen != 0 {
        let id = seen.trailing_zeros();
        seen &= seen - 1;
        domains.push(Domain {
            id,
            units: table[id as usize],
            busy: node.domain_busy(id),
        });
    }
    let (chosen, nvlink_free, idle_domains_touched) = if entry.nvlink_all {
        let best = domains
            .iter()
            .filter(|d| d.units.count_ones() >= count)
            .min_by_key(|d| d.fit_key())?;
        let free = best.units.count_ones();
        (
            lowest(best.units, count),
            u64::from(free),
            u32::from(best.busy == 0),
        )
    } else {
        let mut chosen = lowest(outside, count);
        let mut idle = 0;
        // Domains in packing order, taken one at a time: most requests need one or two.
        while chosen.count_ones() < count {
            let Some(next) = (0..domains.len()).min_by_key(|&i| domains[i].packing_key()) else {
                break;
            };
            let domain = domains.swap_remove(next);
            chosen |= lowest(domain.units, count - chosen.count_ones());
            idle += u32::from(domain.busy == 0);
        }
        (chosen, 0, idle)
    };
    scratch.single = Some(chosen);
    Some(Score {
        nvlink_free,
        idle_domains_touched,
        busy_units: Reverse(node.busy_units),
        node: node.id,
    })
}

/// The free units of `node` that `entry` accepts, as a mask (bit `k` for local unit `k`).
/// One branch-free pass over the class (and model) columns. Kept out of line: compiled to
/// WebAssembly and then by Cranelift, the small loop on its own keeps its values in registers.
#[inline(never)]
fn matching(entry: &DeviceRequest, node: &NodeView<'_>) -> u64 {
    let class = entry.class.code();
    let mut mask = 0u64;
    match entry.model {
        None => {
            for (k, &c) in node.class.iter().enumerate() {
                mask |= u64::from(c == class) << k;
            }
        }
        Some(model) => {
            for (k, (&c, &m)) in node.class.iter().zip(node.model).enumerate() {
                mask |= u64::from((c == class) & (m == model)) << k;
            }
        }
    }
    mask
}

/// The `count` lowest set bits of `mask` (all of them when it has fewer).
fn lowest(mask: u64, count: u32) -> u64 {
    if mask.count_ones() <= count {
        return mask;
    }
    let mut rest = mask;
    let mut taken = 0u64;
    for _ in 0..count {
        if rest == 0 {
            break;
        }
        let bit = rest & rest.wrapping_neg();
        taken |= bit;
        rest ^= bit;
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::lowest;

    #[test]
    fn lowest_takes_the_lowest_set_bits() {
        assert_eq!(lowest(0b1011_0110, 2), 0b0000_0110);
        assert_eq!(lowest(0b1011_0110, 9), 0b1011_0110);
        assert_eq!(lowest(0, 3), 0);
        assert_eq!(lowest(u64::MAX, 0), 0);
        assert_eq!(lowest(1 << 63, 1), 1 << 63);
    }
}
