//! The default preemption policy of orl: the spot bookings whose termination makes a
//! request placeable at the least cost.
//!
//! The request must fit on one node, by the rules of the default placer
//! (`orl-placer-default`, which this crate asks), once the chosen bookings' units are free.
//! Among all such choices the policy takes, in order of precedence:
//!
//! 1. the least work lost, counted in unit-seconds: for each terminated booking, its number
//!    of units times its elapsed seconds;
//! 2. the bookings that started most recently: the bookings of two choices are compared
//!    newest first (start time descending, then booking id ascending), the first newer
//!    booking winning, and a choice that is a prefix of the other wins.
//!
//! Each node is considered on its own. Only bookings holding a unit that some entry of the
//! request accepts (class and model) can help, so the others are never terminated, and no
//! booking is terminated that the request could fit without. On a node
//! with at most [`EXHAUSTIVE_BOOKINGS_PER_NODE`] such bookings every subset is considered,
//! cheapest first, and the first one that makes room is the node's answer. Beyond that, or
//! once a call has enumerated [`MAX_SUBSETS`] subsets or run [`MAX_PLACEMENT_CHECKS`]
//! placement checks, the node is decided
//! greedily: bookings are added cheapest first (newest first on equal cost) until the
//! request fits, then any whose removal keeps it fitting are dropped, most expensive first.
//! Greedy answers make room but may cost more than the optimum.
//!
//! Bookings on nodes that are not among the candidates are ignored.
//!
//! Plain Rust, tested natively; its WebAssembly component is
//! `orl-preemptor-default-component`.

mod room;
mod search;

use std::fmt;

pub use orl_placer_default::{DeviceClass, DeviceRequest, DomainLoad, Request};

/// A unit: free on a node, or held by a spot booking (WIT `units`, one entry with its id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The host's index for the unit, unique across one call.
    pub id: u32,
    /// The device class the unit provides.
    pub class: DeviceClass,
    /// Index into [`Request::models`].
    pub model: u32,
    /// The NVLink domain, unique within the unit's node; `None` outside any domain.
    pub nvlink_domain: Option<u32>,
    /// Device memory in GiB.
    pub memory_gib: u32,
}

impl Unit {
    /// The unit without its id, as the placer reads it.
    pub fn placer_unit(&self) -> orl_placer_default::Unit {
        orl_placer_default::Unit {
            class: self.class,
            model: self.model,
            nvlink_domain: self.nvlink_domain,
            memory_gib: self.memory_gib,
        }
    }

    /// Whether `entry` accepts this unit: same class and, when the entry names a model,
    /// same model.
    pub fn serves(&self, entry: &DeviceRequest) -> bool {
        entry.accepts(&self.placer_unit())
    }
}

/// A candidate node with the units free on it without any termination (WIT `nodes`, one
/// entry with its runs resolved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The host's index for the node, unique within one call.
    pub id: u32,
    /// Units of the node booked at some point of the window, spot bookings included.
    pub busy_units: u32,
    /// All units of the node.
    pub total_units: u32,
    /// The load of each NVLink domain; a domain missing here counts as idle.
    pub domains: Vec<DomainLoad>,
    /// The units the request may take without any termination.
    pub free: Vec<Unit>,
}

/// Nodes with at most this many bookings that could help are searched exhaustively
/// (2^16 subsets at most); nodes with more are decided greedily.
pub const EXHAUSTIVE_BOOKINGS_PER_NODE: usize = 16;

/// The most subsets one call enumerates, over all its exhaustive searches (two nodes with
/// 16 bookings each); nodes beyond it are decided greedily.
pub const MAX_SUBSETS: u32 = 1 << 17;

/// The most placement checks one call runs before it stops searching exhaustively; the
/// node being searched and every remaining one are then decided greedily. Together with [`MAX_SUBSETS`] it
/// keeps a call to tens of milliseconds in WebAssembly whatever it is given.
pub const MAX_PLACEMENT_CHECKS: u32 = 2_000;

/// A running spot workload that could be terminated to make room (WIT `spot-booking`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpotBooking {
    /// The host's index for the booking, unique within one call.
    pub id: u32,
    /// The node it runs on.
    pub node: u32,
    /// The units it holds; all become free when it is terminated.
    pub units: Vec<Unit>,
    /// How long it has been running, in seconds.
    pub elapsed_seconds: u64,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_at_ms: i64,
}

impl SpotBooking {
    /// The work lost by terminating it, in unit-seconds: units held times elapsed seconds,
    /// saturating at `u64::MAX` (more than 10^11 years of one unit).
    pub fn cost(&self) -> u64 {
        (self.units.len() as u64).saturating_mul(self.elapsed_seconds)
    }
}

/// Why no choice of terminations makes a request placeable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsatisfiable {
    reason: String,
}

impl Unsatisfiable {
    /// An unsatisfiable verdict with `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Unsatisfiable {
            reason: reason.into(),
        }
    }

    /// The reason, for the person who made the request.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The reason, as the WIT `err` payload.
    pub fn into_reason(self) -> String {
        self.reason
    }
}

impl fmt::Display for Unsatisfiable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unsatisfiable {}

/// The ids of the bookings in `spot` to terminate so that `req` fits on one of `nodes`, by
/// the rules in the crate documentation, in ascending order and each once.
///
/// An empty list means the request fits without terminating anything. All returned
/// bookings run on one node. `Err` means that not even terminating every booking on a node
/// makes room on it, for any node.
pub fn choose_victims(
    req: &Request,
    nodes: &[Node],
    spot: &[SpotBooking],
) -> Result<Vec<u32>, Unsatisfiable> {
    if req.unit_count() == 0 {
        return Err(Unsatisfiable::new("the request asks for no devices"));
    }
    let mut room = room::Room::default();
    if nodes.iter().any(|n| room.fits(req, n, &[])) {
        return Ok(Vec::new());
    }

    let mut search = search::Search::new(req, room);
    let mut best: Option<search::Choice> = None;
    for node in nodes {
        let bookings = search::helpful_bookings(req, node, spot);
        if let Some(choice) = search.cheapest_on(node, &bookings, best.as_ref())
            && best.as_ref().is_none_or(|b| choice < *b)
        {
            best = Some(choice);
        }
    }
    match best {
        Some(choice) => Ok(choice.into_ids()),
        None => Err(Unsatisfiable::new(format!(
            "no node has {}, even with every spot booking on it terminated",
            req.describe()
        ))),
    }
}

#[cfg(test)]
mod tests;
