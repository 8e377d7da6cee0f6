//! What a capacity dashboard draws: timeline rows and unit counts ([`crate::fleet`]).
//! Instants are epoch ms.

use async_graphql::SimpleObject;

use super::api_name;
use crate::fleet::{counts, timeline};

/// One node of a pool over a window.
#[derive(SimpleObject)]
pub struct TimelineRow {
    pub node_id: String,
    /// Marked lost and not reported since.
    pub lost: bool,
    /// A node reservation in its term on it needs review: its units are withheld.
    pub needs_review: bool,
    pub units: Vec<TimelineUnit>,
    /// Bookings the caller sees, by unit then start.
    pub bookings: Vec<TimelineBooking>,
    /// Node reservation terms the caller sees that overlap the window.
    pub terms: Vec<TimelineTerm>,
}

/// A sellable unit of a row.
#[derive(SimpleObject)]
pub struct TimelineUnit {
    pub id: String,
    pub model: String,
    pub device_class: String,
    pub nvlink_domain: Option<String>,
}

/// One booking of one unit. `reservationId`, `tenantId` and `state` are null when the
/// caller may see only that the unit is taken (a node's owner, of other orgs' work).
#[derive(SimpleObject)]
pub struct TimelineBooking {
    pub unit_id: String,
    pub reservation_id: Option<String>,
    pub tenant_id: Option<String>,
    pub state: Option<String>,
    pub start: i64,
    pub end: i64,
    pub spot: bool,
    /// Still holding the unit (a released booking ends where it was released).
    pub active: bool,
    /// Its reservation holds units on more than one node (a gang).
    pub gang: bool,
}

/// A node reservation's term over units of a row; `endsAt` null is open-ended.
#[derive(SimpleObject)]
pub struct TimelineTerm {
    pub id: String,
    pub unit_ids: Vec<String>,
    pub released_unit_ids: Vec<String>,
    pub allowed_org_ids: Vec<String>,
    pub starts_at: i64,
    pub ends_at: Option<i64>,
    /// `pending`, `active`, `expired` or `needs-review`.
    pub status: String,
}

impl From<timeline::Row> for TimelineRow {
    fn from(r: timeline::Row) -> Self {
        TimelineRow {
            node_id: r.node_id,
            lost: r.lost,
            needs_review: r.needs_review,
            units: r
                .units
                .into_iter()
                .map(|u| TimelineUnit {
                    device_class: api_name(&u.device_class),
                    id: u.id,
                    model: u.model,
                    nvlink_domain: u.nvlink_domain,
                })
                .collect(),
            bookings: r
                .bookings
                .into_iter()
                .map(|b| TimelineBooking {
                    unit_id: b.unit_id,
                    reservation_id: b.reservation_id,
                    tenant_id: b.tenant_id,
                    state: b.state,
                    start: b.start,
                    end: b.end,
                    spot: b.spot,
                    active: b.active,
                    gang: b.gang,
                })
                .collect(),
            terms: r
                .terms
                .into_iter()
                .map(|t| TimelineTerm {
                    status: t.status.as_str().to_string(),
                    id: t.id,
                    unit_ids: t.unit_ids,
                    released_unit_ids: t.released_unit_ids,
                    allowed_org_ids: t.allowed_org_ids,
                    starts_at: t.starts_at,
                    ends_at: t.ends_at,
                })
                .collect(),
        }
    }
}

/// A pool's sellable units by model.
#[derive(SimpleObject)]
pub struct PoolCapacity {
    pub pool_id: String,
    pub pool_name: String,
    pub models: Vec<ModelCapacity>,
}

/// The sellable units of one model in one pool.
#[derive(SimpleObject)]
pub struct ModelCapacity {
    pub model: String,
    /// Now.
    pub now: UnitCounts,
    /// Now, then every 6 hours for the next 7 days: what is booked and reserved so far.
    pub ahead: Vec<UnitCounts>,
    /// Each of the last 24 hours, oldest first.
    pub hourly: Vec<UtilizationPoint>,
    /// Booked unit time over unit time in the last 24 hours, 0-1.
    pub utilization: f64,
}

/// Units by what holds them at `at`; each unit counts in exactly one of `lost`, `booked`,
/// `reserved` (a node reservation holds it, or needs review), `released` (to spot) and
/// `free`.
#[derive(SimpleObject)]
pub struct UnitCounts {
    pub at: i64,
    pub total: i64,
    pub booked: i64,
    pub released: i64,
    pub reserved: i64,
    pub free: i64,
    pub lost: i64,
}

/// The share of a model's units bookings held in the hour starting at `at`, 0-1.
#[derive(SimpleObject)]
pub struct UtilizationPoint {
    pub at: i64,
    pub ratio: f64,
}

fn unit_counts(at: i64, t: &counts::Tally) -> UnitCounts {
    UnitCounts {
        at,
        total: t.total(),
        booked: t.booked,
        released: t.released,
        reserved: t.reserved,
        free: t.free,
        lost: t.lost,
    }
}

impl From<counts::PoolCounts> for PoolCapacity {
    fn from(p: counts::PoolCounts) -> Self {
        PoolCapacity {
            pool_id: p.pool_id,
            pool_name: p.pool_name,
            models: p
                .models
                .into_iter()
                .map(|m| ModelCapacity {
                    now: unit_counts(m.ahead.first().map_or(0, |(at, _)| *at), &m.now),
                    ahead: m.ahead.iter().map(|(at, t)| unit_counts(*at, t)).collect(),
                    hourly: m
                        .hourly
                        .into_iter()
                        .map(|(at, ratio)| UtilizationPoint { at, ratio })
                        .collect(),
                    utilization: m.utilization,
                    model: m.model,
                })
                .collect(),
        }
    }
}

/// What a timeline page adds to its connection: how many rows match, and the window it
/// covers by the server's clock (a browser's clock may differ).
#[derive(SimpleObject)]
pub struct TimelineWindow {
    /// Rows the filters match, over every page.
    pub total_count: i64,
    pub from: i64,
    pub to: i64,
    /// The server's clock when the page was read.
    pub now: i64,
}
