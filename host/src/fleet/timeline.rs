//! A pool's units over a window: one row per node (by id), its units with their NVLink
//! domains, the bookings that held or will hold them inside the window, and the node
//! reservation terms behind them. Rows are read from the capacity view and cut into pages
//! by node id; the bookings of one page are read in one query, because the view keeps only
//! bookings that still hold their units and a window reaches into the past.

use std::collections::HashMap;

use sqlx::Row as _;

use super::Sight;
use crate::booking::MAX_INSTANT_MS;
use crate::capacity::NodeCapacity;
use crate::iam::Principal;
use crate::node_reservations::{Lifecycle, Status};
use crate::pools::store;
use crate::store::{flag, placeholders};
use crate::{App, Error, Result};

/// The longest window one page covers: a month.
pub const MAX_WINDOW_MS: i64 = 31 * 24 * 3_600_000;

/// Which rows of which pool, over which window (epoch ms, `[from, to)`).
pub struct Query {
    pub pool_id: String,
    pub from: i64,
    pub to: i64,
    /// Only nodes with a unit of this model, and only those units.
    pub model: Option<String>,
    /// Only nodes whose id contains this text.
    pub node: Option<String>,
    pub first: usize,
    /// The node id the page starts after.
    pub after: Option<String>,
}

/// One page of rows.
pub struct Page {
    pub rows: Vec<Row>,
    /// Rows the filters match, over every page.
    pub total: usize,
    pub has_next: bool,
}

/// One node over the window.
pub struct Row {
    pub node_id: String,
    /// Marked lost and not reported since.
    pub lost: bool,
    /// A node reservation in its term on it needs review: its units are withheld.
    pub needs_review: bool,
    pub units: Vec<RowUnit>,
    /// Bookings the caller sees, by unit then start.
    pub bookings: Vec<Bar>,
    /// Node reservation terms the caller sees that overlap the window.
    pub terms: Vec<Band>,
}

/// A sellable unit of a row.
pub struct RowUnit {
    pub id: String,
    pub model: String,
    pub device_class: crate::inventory::DeviceClass,
    pub nvlink_domain: Option<String>,
}

/// One booking of one unit. `reservation_id`, `tenant_id` and `state` are absent when the
/// caller sees only that the unit is taken.
pub struct Bar {
    pub unit_id: String,
    pub reservation_id: Option<String>,
    pub tenant_id: Option<String>,
    pub state: Option<String>,
    pub start: i64,
    pub end: i64,
    pub spot: bool,
    /// Still holding the unit (a released booking ends where it was released).
    pub active: bool,
    /// Its reservation holds units on more than one node.
    pub gang: bool,
}

/// A node reservation's term over some of a row's units.
pub struct Band {
    pub id: String,
    pub unit_ids: Vec<String>,
    pub released_unit_ids: Vec<String>,
    pub allowed_org_ids: Vec<String>,
    pub starts_at: i64,
    pub ends_at: Option<i64>,
    pub status: Status,
}

/// The page of `query` as the caller sees it; a pool the caller does not see is not found.
pub async fn page(app: &App, caller: &Principal, query: Query) -> Result<Page> {
    if !(0 <= query.from && query.from < query.to && query.to <= MAX_INSTANT_MS) {
        return Err(Error::invalid(
            "to",
            "the window must be from < to, both 0-2^47 ms",
        ));
    }
    if query.to - query.from > MAX_WINDOW_MS {
        return Err(Error::invalid("to", "the window is at most 31 days long"));
    }
    let pool = store::get(app, caller, &query.pool_id).await?;
    let list = app.capacity.pool(&pool.id).await?;
    let matching: Vec<&NodeCapacity> = list
        .nodes
        .iter()
        .map(|n| n.as_ref())
        .filter(|n| matches(n, &query))
        .collect();
    let start = match &query.after {
        None => 0,
        Some(after) => {
            matching
                .iter()
                .position(|n| n.node.id == *after)
                .ok_or_else(|| Error::invalid("after", "not a cursor of this list"))?
                + 1
        }
    };
    let chosen: Vec<&NodeCapacity> = matching
        .iter()
        .skip(start)
        .take(query.first)
        .copied()
        .collect();
    let mut bars = bookings(app, &chosen, query.from, query.to).await?;
    let sight = Sight::of(caller);
    let now = app.now_ms();
    let rows = chosen
        .iter()
        .map(|n| {
            row(
                n,
                &query,
                &sight,
                now,
                bars.remove(&n.node.id).unwrap_or_default(),
            )
        })
        .collect();
    Ok(Page {
        rows,
        total: matching.len(),
        has_next: matching.len() > start + query.first,
    })
}

fn matches(node: &NodeCapacity, query: &Query) -> bool {
    query
        .node
        .as_ref()
        .is_none_or(|text| node.node.id.contains(text.as_str()))
        && query
            .model
            .as_ref()
            .is_none_or(|model| node.models().contains(model))
}

/// A booking as read, before the caller's sight is applied.
struct Stored {
    bar: Bar,
    tenant_id: String,
}

fn row(node: &NodeCapacity, query: &Query, sight: &Sight, now: i64, stored: Vec<Stored>) -> Row {
    let owner = &node.node.org_id;
    let units: Vec<RowUnit> = node
        .node
        .units
        .iter()
        .filter(|u| u.sellable && query.model.as_ref().is_none_or(|m| *m == u.model))
        .map(|u| RowUnit {
            id: u.id.clone(),
            model: u.model.clone(),
            device_class: u.device_class,
            nvlink_domain: u.nvlink_domain.clone(),
        })
        .collect();
    let shown = |id: &str| units.iter().any(|u| u.id == id);
    let bookings = stored
        .into_iter()
        .filter(|s| shown(&s.bar.unit_id) && sight.sees_booking(owner, &s.tenant_id))
        .map(|s| {
            if sight.sees_holder(&s.tenant_id) {
                Bar {
                    tenant_id: Some(s.tenant_id),
                    ..s.bar
                }
            } else {
                Bar {
                    reservation_id: None,
                    state: None,
                    gang: false,
                    ..s.bar
                }
            }
        })
        .collect();
    let window = crate::node_reservations::Term {
        starts_at: query.from,
        ends_at: Some(query.to),
    };
    let terms = node
        .claims
        .iter()
        .filter(|c| c.lifecycle != Lifecycle::Cancelled && c.term.overlaps(&window))
        .filter(|c| sight.sees_term(owner, c))
        .map(|c| Band {
            id: c.id.clone(),
            unit_ids: c.unit_ids.iter().filter(|u| shown(u)).cloned().collect(),
            released_unit_ids: c.released_unit_ids.clone(),
            allowed_org_ids: c.allowed_org_ids.clone(),
            starts_at: c.term.starts_at,
            ends_at: c.term.ends_at,
            status: c.status(now),
        })
        .filter(|b| !b.unit_ids.is_empty())
        .collect();
    Row {
        node_id: node.node.id.clone(),
        lost: node.is_lost(),
        needs_review: node
            .claims
            .iter()
            .any(|c| c.term.contains(now) && c.status(now) == Status::NeedsReview),
        units,
        bookings,
        terms,
    }
}

/// Every booking of `nodes` that holds its unit for some time inside `[from, to)`, by node,
/// in one query.
async fn bookings(
    app: &App,
    nodes: &[&NodeCapacity],
    from: i64,
    to: i64,
) -> Result<HashMap<String, Vec<Stored>>> {
    let mut by_node: HashMap<String, Vec<Stored>> = HashMap::new();
    if nodes.is_empty() {
        return Ok(by_node);
    }
    let sql = format!(
        "SELECT b.node_id, b.unit_id, b.reservation_id, b.start_ms, b.end_ms, b.spot, b.active,
                r.tenant_id, r.state,
                (SELECT COUNT(DISTINCT g.node_id) FROM bookings g
                 WHERE g.reservation_id = b.reservation_id) AS nodes
         FROM bookings b JOIN compute_reservations r ON r.id = b.reservation_id
         WHERE b.end_ms > $1 AND b.start_ms < $2 AND b.end_ms > b.start_ms
           AND b.node_id IN ({})
         ORDER BY b.node_id, b.unit_id, b.start_ms",
        placeholders(3, nodes.len())
    );
    let mut rows = sqlx::query(&sql).bind(from).bind(to);
    for node in nodes {
        rows = rows.bind(&node.node.id);
    }
    for r in rows.fetch_all(app.store.pool()).await? {
        let spanned: i64 = r.try_get("nodes")?;
        by_node
            .entry(r.try_get("node_id")?)
            .or_default()
            .push(Stored {
                tenant_id: r.try_get("tenant_id")?,
                bar: Bar {
                    unit_id: r.try_get("unit_id")?,
                    reservation_id: Some(r.try_get("reservation_id")?),
                    tenant_id: None,
                    state: Some(r.try_get("state")?),
                    start: r.try_get("start_ms")?,
                    end: r.try_get("end_ms")?,
                    spot: flag(&r, "spot"),
                    active: flag(&r, "active"),
                    gang: spanned > 1,
                },
            });
    }
    Ok(by_node)
}
