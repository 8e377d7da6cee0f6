//! A preemptor that terminates the oldest spot bookings first, the opposite of the default
//! policy (which loses the least work). On each node it adds bookings oldest first until the
//! node's free units plus the freed ones reach the number of units the request asks for
//! (classes, models and NVLink domains are not considered: the host places the request
//! itself afterwards and refuses the preemption when it still does not fit), and answers
//! the node that needs the fewest terminations.

use orl_policy_kit::types::{Candidates, Request, SpotBooking};

struct PreemptOldest;

impl orl_policy_kit::Preemptor for PreemptOldest {
    fn choose_victims(
        req: Request,
        candidates: Candidates,
        spot: Vec<SpotBooking>,
    ) -> Result<Vec<u32>, String> {
        let wanted: u32 = req.devices.iter().map(|d| d.count).sum();
        let mut oldest_first: Vec<&SpotBooking> = spot.iter().collect();
        oldest_first.sort_by_key(|b| (b.started_at_ms, b.id));
        let nodes = &candidates.nodes;
        (0..nodes.id.len())
            .filter_map(|j| {
                let mut room = nodes.free_len[j];
                let mut victims = Vec::new();
                for booking in oldest_first.iter().filter(|b| b.node == nodes.id[j]) {
                    if room >= wanted {
                        break;
                    }
                    room += booking.units.len;
                    victims.push(booking.id);
                }
                (room >= wanted).then_some(victims)
            })
            .min_by_key(Vec::len)
            .ok_or_else(|| "no node has room even with all its spot work terminated".into())
    }
}

orl_policy_kit::export_preemptor!(PreemptOldest);
