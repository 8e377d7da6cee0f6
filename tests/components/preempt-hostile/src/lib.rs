//! A preemptor whose answer the host must refuse, or act on without terminating anything;
//! `request.duration-seconds` picks it:
//!
//! | duration-seconds | answer |
//! |---|---|
//! | 3600 (1 h) | panics: a trap |
//! | 7200 (2 h) | one booking never offered (the id past the last) |
//! | 10800 (3 h) | the first booking offered, twice |
//! | anything else | nothing to terminate |

use orl_policy_kit::types::{Candidates, Request, SpotBooking};

struct PreemptHostile;

impl orl_policy_kit::Preemptor for PreemptHostile {
    fn choose_victims(
        req: Request,
        _candidates: Candidates,
        spot: Vec<SpotBooking>,
    ) -> Result<Vec<u32>, String> {
        let first = spot.first().map_or(0, |b| b.id);
        match req.duration_seconds {
            3600 => panic!("preempt-hostile: refusing to choose among {} bookings", spot.len()),
            7200 => Ok(vec![spot.len() as u32]),
            10800 => Ok(vec![first, first]),
            _ => Ok(Vec::new()),
        }
    }
}

orl_policy_kit::export_preemptor!(PreemptHostile);
