//! The search for a request with one entry — nearly every request — on a node with at most
//! 64 free units, on bit masks: one pass over the units, then a few operations per NVLink
//! domain. It makes exactly the choice the general search makes (a test compares them).

use std::cmp::Reverse;

use super::{Score, Scratch};
use crate::{DeviceRequest, NO_DOMAIN, NodeView};

/// Units a node of the straight-line path has at most: their class codes are compared as
/// the bytes of one word, their domain ids as one array.
const WORD: usize = 8;

/// The most free units a node may have for this path: one bit each.
pub(crate) const MAX_UNITS: usize = 64;

/// Domains with ids below this are grouped in a table rather than a list (at most 64: one
/// bit each in a mask of the domains seen).
const TABLE: usize = 64;

/// One NVLink domain of the node: its id, the entry's units in it, and its busy units.
#[derive(Clone, Copy, Default)]
struct Domain {
    id: u32,
    units: u64,
    busy: u32,
}

impl Domain {
    /// Domain `id` of `node` holding `units`, with the load the host reported for it.
    fn of(node: &NodeView<'_>, id: u32, units: u64) -> Domain {
        Domain {
            id,
            units,
            busy: node.domain_busy(id),
        }
    }

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

/// The matching units of one node grouped by NVLink domain; reused from node to node.
pub(crate) struct Groups {
    /// The units of each domain with an id below [`TABLE`]; empty between nodes.
    table: [u64; TABLE],
    /// The units whose domain id is too large for the table, or none.
    large: u64,
    /// The domains with matching units: the first `len` entries. A node has at most
    /// [`MAX_UNITS`] free units, so at most as many domains.
    domains: [Domain; MAX_UNITS],
    len: usize,
}

impl Default for Groups {
    fn default() -> Self {
        Groups {
            table: [0; TABLE],
            large: 0,
            domains: [Domain::default(); MAX_UNITS],
            len: 0,
        }
    }
}

impl Groups {
    /// Groups the units of `matching` by domain into [`domains`](Self::domains), answering
    /// the units outside any domain.
    fn group(&mut self, node: &NodeView<'_>, matching: u64) -> u64 {
        match self.group_reported(node, matching) {
            Some(outside) => outside,
            None => self.group_any(node, matching),
        }
    }

    /// [`group`](Self::group) for a node with at most [`WORD`] free units, each in a
    /// domain the host reported a load for or in none, as the host always describes a
    /// node: one pass over the reported domains, each matched against the node's units at
    /// once, with no loop over the units. `None` when the node is not of that kind.
    #[inline(never)]
    fn group_reported(&mut self, node: &NodeView<'_>, matching: u64) -> Option<u64> {
        if node.free_len() > WORD {
            return None;
        }
        // The node's units and the next ones, which `matching` leaves out; `None` for the
        // columns' last few units.
        let ids: &[u32; WORD] = node.nvlink_domain_to_end.get(..WORD)?.try_into().ok()?;
        self.len = 0;
        let mut rest = matching;
        for (&id, &busy) in node.domain.iter().zip(node.domain_busy) {
            // A domain reported twice finds its units taken by its first report.
            let units = rest & in_domain(ids, id);
            if units != 0 && id != NO_DOMAIN {
                rest &= !units;
                self.push(Domain { id, units, busy });
            }
        }
        (rest & !in_domain(ids, NO_DOMAIN) == 0).then_some(rest)
    }

    /// [`group`](Self::group) for any node. Kept out of line, like [`matching`], and
    /// without a call in its loop, so that the loop keeps its few values in registers.
    #[inline(never)]
    fn group_any(&mut self, node: &NodeView<'_>, matching: u64) -> u64 {
        self.len = 0;
        self.large = 0;
        // Domains with an id below 64 (the usual case) go to the table, with `seen` marking
        // the entries written; units with larger ids or none are set aside.
        let mut seen = 0u64;
        let mut rest = matching;
        while rest != 0 {
            let k = rest.trailing_zeros();
            let bit = 1u64 << k;
            rest &= rest - 1;
            let id = node.nvlink_domain[k as usize];
            if let Some(slot) = self.table.get_mut(id as usize) {
                *slot |= bit;
                seen |= 1 << id;
            } else {
                self.large |= bit;
            }
        }
        while seen != 0 {
            let id = seen.trailing_zeros();
            seen &= seen - 1;
            // Left empty for the next node.
            let units = std::mem::take(&mut self.table[id as usize]);
            self.push(Domain::of(node, id, units));
        }
        if self.large == 0 {
            0
        } else {
            self.group_large(node, self.large)
        }
    }

    /// Groups the units of `large`, whose domain ids are too large for the table or
    /// [`NO_DOMAIN`], answering those outside any domain.
    #[cold]
    fn group_large(&mut self, node: &NodeView<'_>, large: u64) -> u64 {
        let mut outside = 0u64;
        let mut rest = large;
        while rest != 0 {
            let k = rest.trailing_zeros();
            let bit = 1u64 << k;
            rest &= rest - 1;
            let id = node.nvlink_domain[k as usize];
            if id == NO_DOMAIN {
                outside |= bit;
            } else if let Some(domain) = self.domains_mut().iter_mut().find(|d| d.id == id) {
                domain.units |= bit;
            } else {
                self.push(Domain::of(node, id, bit));
            }
        }
        outside
    }

    fn push(&mut self, domain: Domain) {
        self.domains[self.len] = domain;
        self.len += 1;
    }

    fn domains_mut(&mut self) -> &mut [Domain] {
        &mut self.domains[..self.len]
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
    let groups = &mut scratch.groups;
    let outside = groups.group(node, matching);
    let mut domains = groups.domains_mut();
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
            // Set the domain taken aside at the end, out of the slice.
            let last = domains.len() - 1;
            domains.swap(next, last);
            let (rest, taken) = domains.split_at_mut(last);
            domains = rest;
            chosen |= lowest(taken[0].units, count - chosen.count_ones());
            idle += u32::from(taken[0].busy == 0);
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
/// The class codes are compared eight at a time, as the bytes of one word; the model, when
/// the entry names one, is then checked on the units that remain. A node with at most eight
/// free units, nearly every node, takes one word and no loop: compiled to WebAssembly and
/// then by Cranelift, every loop header holds a deadline check, and the values that live
/// across it leave their registers.
#[inline(never)]
fn matching(entry: &DeviceRequest, node: &NodeView<'_>) -> u64 {
    let len = node.free_len();
    let class = entry.class.code();
    let mut mask = u64::from(equal_bytes(word_at(node.class_to_end, 0), class));
    if len > WORD {
        mask |= matching_words(node.class_to_end, len, class);
    }
    if len < 64 {
        // The words run past the node's units.
        mask &= (1 << len) - 1;
    }
    match entry.model {
        Some(model) => of_model(node, mask, model),
        None => mask,
    }
}

/// The bits of [`matching`] for units [`WORD`] and above, before the model check.
#[inline(never)]
fn matching_words(class_to_end: &[u8], len: usize, class: u8) -> u64 {
    let mut mask = 0u64;
    let mut k = WORD;
    while k < len {
        mask |= u64::from(equal_bytes(word_at(class_to_end, k), class)) << k;
        k += WORD;
    }
    mask
}

/// The units of `mask` whose model is `model`.
#[inline(never)]
fn of_model(node: &NodeView<'_>, mask: u64, model: u32) -> u64 {
    let mut kept = mask;
    let mut rest = mask;
    while rest != 0 {
        let k = rest.trailing_zeros();
        rest &= rest - 1;
        if node.model[k as usize] != model {
            kept &= !(1 << k);
        }
    }
    kept
}

/// The eight bytes of `bytes` from `k` as a little-endian word, zero past the end.
#[inline(always)]
fn word_at(bytes: &[u8], k: usize) -> u64 {
    match bytes.get(k..k + WORD) {
        Some(word) => u64::from_le_bytes(word.try_into().expect("eight bytes")),
        None => word_at_end(bytes, k),
    }
}

/// [`word_at`] for the last bytes of a column, fewer than eight.
#[cold]
#[inline(never)]
fn word_at_end(bytes: &[u8], k: usize) -> u64 {
    let mut word = [0u8; WORD];
    let tail = bytes.get(k..).unwrap_or_default();
    word[..tail.len()].copy_from_slice(tail);
    u64::from_le_bytes(word)
}

/// Bit `i` set where byte `i` of `word` equals `byte`.
fn equal_bytes(word: u64, byte: u8) -> u8 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let diff = word ^ (u64::from(byte) * 0x0101_0101_0101_0101);
    // The high bit of each byte: set where the byte of `diff` is zero. Adding 0x7f to the
    // low seven bits carries into the high bit exactly when they are not all zero, and never
    // into the next byte.
    let zero = !(((diff & LOW7) + LOW7) | diff) & HIGH;
    // Gather the eight high bits, bit 8i + 7 to bit 56 + i, and keep the top byte.
    ((zero >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// Bit `k` set where unit `k` of `ids` is in `domain`: eight comparisons, no loop.
#[inline(always)]
fn in_domain(ids: &[u32; WORD], domain: u32) -> u64 {
    (0..WORD).fold(0, |mask, k| mask | u64::from(ids[k] == domain) << k)
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
    use super::{equal_bytes, lowest, word_at};

    #[test]
    fn equal_bytes_marks_each_byte_equal_to_the_one_asked_for() {
        for byte in [0u8, 1, 2, 5, 0x7f, 0x80, 0xff] {
            for word in [0u64, u64::MAX, 0x0001_0200_05ff_7f80, 0x8000_0000_0000_0001] {
                let expected = (0..8)
                    .filter(|i| (word >> (8 * i)) as u8 == byte)
                    .fold(0u8, |mask, i| mask | 1 << i);
                assert_eq!(equal_bytes(word, byte), expected, "{word:#x} {byte}");
            }
        }
    }

    #[test]
    fn word_at_reads_eight_bytes_and_zeroes_past_the_end() {
        let bytes = [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10];
        assert_eq!(word_at(&bytes, 0), 0x0807_0605_0403_0201);
        assert_eq!(word_at(&bytes, 2), 0x0a09_0807_0605_0403);
        assert_eq!(word_at(&bytes, 8), 0x0a09);
        assert_eq!(word_at(&bytes, 10), 0);
        assert_eq!(word_at(&bytes, 12), 0);
    }

    #[test]
    fn lowest_takes_the_lowest_set_bits() {
        assert_eq!(lowest(0b1011_0110, 2), 0b0000_0110);
        assert_eq!(lowest(0b1011_0110, 9), 0b1011_0110);
        assert_eq!(lowest(0, 3), 0);
        assert_eq!(lowest(u64::MAX, 0), 0);
        assert_eq!(lowest(1 << 63, 1), 1 << 63);
    }
}
