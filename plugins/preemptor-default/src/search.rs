//! The search for the cheapest set of bookings to terminate on one node.

use std::cmp::Reverse;

use crate::room::Room;
use crate::{
    EXHAUSTIVE_BOOKINGS_PER_NODE, MAX_PLACEMENT_CHECKS, MAX_SUBSETS, Node, Request, SpotBooking,
};

/// One node's answer: which bookings to terminate there, and how it ranks. Ordered by the
/// policy's precedence, so the smallest choice wins.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Choice {
    cost: u64,
    /// The bookings, newest first: start time descending, then id ascending. Compared
    /// element by element, a newer booking wins and a prefix wins.
    newest_first: Vec<(Reverse<i64>, u32)>,
    node: u32,
}

impl Choice {
    fn new(node: u32, bookings: &[&SpotBooking]) -> Choice {
        let mut newest_first: Vec<(Reverse<i64>, u32)> = bookings
            .iter()
            .map(|b| (Reverse(b.started_at_ms), b.id))
            .collect();
        newest_first.sort_unstable();
        Choice {
            cost: bookings
                .iter()
                .fold(0, |sum, b| sum.saturating_add(b.cost())),
            newest_first,
            node,
        }
    }

    /// The booking ids, ascending.
    pub(crate) fn into_ids(self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.newest_first.into_iter().map(|(_, id)| id).collect();
        ids.sort_unstable();
        ids
    }
}

/// The bookings on `node` that hold a unit some entry of `req` accepts, newest first (then
/// by id). Terminating any other booking cannot help the request.
pub(crate) fn helpful_bookings<'a>(
    req: &Request,
    node: &Node,
    spot: &'a [SpotBooking],
) -> Vec<&'a SpotBooking> {
    let mut helpful: Vec<&SpotBooking> = spot
        .iter()
        .filter(|b| b.node == node.id)
        .filter(|b| {
            b.units
                .iter()
                .any(|u| req.devices.iter().any(|d| d.count > 0 && u.serves(d)))
        })
        .collect();
    helpful.sort_by_key(|b| (Reverse(b.started_at_ms), b.id));
    helpful
}

/// The state of one call's search: the request, the work left for exhaustive searches and
/// the buffers of the placement checks.
pub(crate) struct Search<'a> {
    req: &'a Request,
    subsets_left: u32,
    checks_left: u32,
    room: Room,
}

impl<'a> Search<'a> {
    pub(crate) fn new(req: &'a Request, room: Room) -> Self {
        Search {
            req,
            subsets_left: MAX_SUBSETS,
            checks_left: MAX_PLACEMENT_CHECKS,
            room,
        }
    }

    /// The cheapest choice of `bookings` (all on `node`) that makes room for the request, or
    /// `None` when none does or none can beat `bound`.
    pub(crate) fn cheapest_on(
        &mut self,
        node: &Node,
        bookings: &[&SpotBooking],
        bound: Option<&Choice>,
    ) -> Option<Choice> {
        if bookings.is_empty() || !self.fits(node, bookings) {
            return None;
        }
        let subsets = (1u32 << bookings.len().min(31)) - 1;
        if bookings.len() <= EXHAUSTIVE_BOOKINGS_PER_NODE
            && subsets <= self.subsets_left
            && self.checks_left > 0
        {
            self.subsets_left -= subsets;
            if let Some(answer) = self.exhaustive(node, bookings, bound) {
                return answer;
            }
        }
        Some(self.greedy(node, bookings))
    }

    /// Every subset of `bookings`, cheapest first; `None` when the check budget ran out
    /// before an answer, `Some(None)` when nothing within `bound` makes room.
    fn exhaustive(
        &mut self,
        node: &Node,
        bookings: &[&SpotBooking],
        bound: Option<&Choice>,
    ) -> Option<Option<Choice>> {
        let counts = UnitCounts::new(self.req, node, bookings);
        // The cost of each subset from that of the subset without its lowest member.
        let mut costs: Vec<u64> = vec![0; 1 << bookings.len()];
        for mask in 1..costs.len() {
            let lowest = mask.trailing_zeros() as usize;
            costs[mask] = costs[mask & (mask - 1)].saturating_add(bookings[lowest].cost());
        }
        let n = bookings.len() as u32;
        let mut subsets: Vec<(u64, u32, u32)> = (1..costs.len() as u32)
            .map(|mask| (costs[mask as usize], newest_first_rank(mask, n), mask))
            .collect();
        subsets.sort_unstable();

        for (cost, _, mask) in subsets {
            if bound.is_some_and(|b| cost > b.cost) {
                return Some(None);
            }
            if !counts.may_fit(mask) {
                continue;
            }
            if self.checks_left == 0 {
                return None;
            }
            let victims: Vec<&SpotBooking> = members(mask).map(|i| bookings[i]).collect();
            if self.fits(node, &victims) && self.all_needed(node, &victims) {
                return Some(Some(Choice::new(node.id, &victims)));
            }
        }
        Some(None)
    }

    /// Whether every booking of a set that makes room is needed for it. Subsets are tried
    /// cheapest first, so only a booking that lost no work (just started) can be spare; the
    /// start-time order alone would otherwise prefer adding such a booking.
    fn all_needed(&mut self, node: &Node, victims: &[&SpotBooking]) -> bool {
        victims.iter().filter(|b| b.cost() == 0).all(|spare| {
            let without: Vec<&SpotBooking> = victims
                .iter()
                .copied()
                .filter(|b| b.id != spare.id)
                .collect();
            !self.fits(node, &without)
        })
    }

    /// Cheapest bookings first until the request fits, then drops the ones it can spare,
    /// most expensive first.
    fn greedy(&mut self, node: &Node, bookings: &[&SpotBooking]) -> Choice {
        let mut order: Vec<&SpotBooking> = bookings.to_vec();
        order.sort_by_key(|b| (b.cost(), Reverse(b.started_at_ms), b.id));
        let mut chosen: Vec<&SpotBooking> = Vec::new();
        for booking in order {
            chosen.push(booking);
            if self.fits(node, &chosen) {
                break;
            }
        }
        let mut spare_first = chosen.clone();
        spare_first.sort_by_key(|b| (Reverse(b.cost()), b.started_at_ms, b.id));
        for booking in spare_first {
            let without: Vec<&SpotBooking> = chosen
                .iter()
                .copied()
                .filter(|b| b.id != booking.id)
                .collect();
            if !without.is_empty() && self.fits(node, &without) {
                chosen = without;
            }
        }
        Choice::new(node.id, &chosen)
    }

    fn fits(&mut self, node: &Node, victims: &[&SpotBooking]) -> bool {
        self.checks_left = self.checks_left.saturating_sub(1);
        self.room.fits(self.req, node, victims)
    }
}

/// The indices of the set bits of `mask`, ascending.
fn members(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let i = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            i
        })
    })
}

/// A subset's place among all subsets of `n` bookings in [`Choice`]'s newest-first order.
/// Bookings are indexed newest first, so that order is the lexicographic order of the
/// members' indices, a prefix first: the order in which a depth-first walk that adds one
/// later booking at a time meets the subsets. Choosing index `e` right after index `p`
/// skips the walks below `p + 1 ..= e - 1`, which hold `2^(n-p-1) - 2^(n-e)` subsets.
fn newest_first_rank(mask: u32, n: u32) -> u32 {
    let mut rank: u64 = 0;
    let mut previous: i64 = -1;
    for e in members(mask) {
        let e = e as i64;
        let n = i64::from(n);
        rank += 1 + (1u64 << (n - previous - 1)) - (1u64 << (n - e));
        previous = e;
    }
    rank as u32
}

/// Per request entry, how many accepted units the node has free and each booking holds:
/// a cheap necessary condition checked before the full placement rules.
struct UnitCounts {
    free: Vec<u32>,
    /// `held[booking][entry]`.
    held: Vec<Vec<u32>>,
    wanted: Vec<u32>,
}

impl UnitCounts {
    fn new(req: &Request, node: &Node, bookings: &[&SpotBooking]) -> Self {
        let count = |units: &[crate::Unit]| -> Vec<u32> {
            req.devices
                .iter()
                .map(|d| units.iter().filter(|u| u.serves(d)).count() as u32)
                .collect()
        };
        UnitCounts {
            free: count(&node.free),
            held: bookings.iter().map(|b| count(&b.units)).collect(),
            wanted: req.devices.iter().map(|d| d.count).collect(),
        }
    }

    /// False when terminating `mask` leaves some entry with fewer accepted units than it
    /// asks for, so the request cannot fit.
    fn may_fit(&self, mask: u32) -> bool {
        self.wanted.iter().enumerate().all(|(e, &wanted)| {
            let held: u32 = members(mask).map(|b| self.held[b][e]).sum();
            self.free[e] + held >= wanted
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_follow_the_lexicographic_order_of_member_indices() {
        for n in 1..=6 {
            let mut by_rank: Vec<u32> = (1..1u32 << n).collect();
            by_rank.sort_by_key(|&mask| newest_first_rank(mask, n));
            let mut by_members: Vec<u32> = (1..1u32 << n).collect();
            by_members.sort_by_key(|&mask| members(mask).collect::<Vec<usize>>());
            assert_eq!(by_rank, by_members, "n = {n}");
        }
    }
}
