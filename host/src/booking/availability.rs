//! Availability search: when a request could start, and where, read from the capacity view.
//! It writes nothing and decides no IAM (it is a read, `compute:reservations:read`).
//!
//! A request fits on a node at a start `s` when the node, read over `[s, s + duration)`,
//! offers units that the default placer can place it on: the same candidates a create is
//! offered (free units of the class and selector, node-reservation rights for the tenant,
//! released units for spot, host resources, the per-GPU share, lost nodes left out).
//! Between two ends of anything that holds a node (a booking, a host booking, a node
//! reservation's term) what overlaps the window can only grow as `s` moves later, so a node
//! that does not fit at `s` can first fit again at the next such end. The search keeps every
//! node's next start to try in one queue, earliest first: the slots come out in start
//! order, and it stops at the `limit`-th slot. A node whose every unit is held at some time
//! in the window ([`NodeCapacity::full_until`]) is moved on, without a read, to where that
//! ends: a full pool costs a look at each node, not a read of each.
//!
//! Before a node is first tried it is read at a start after everything on it has ended
//! ([`ONCE_FREE`]): what holds it then (node reservations without an end) holds it for good,
//! and a node that does not fit even then is passed over. Nodes without node reservations that offer the same
//! units, labels and host resources answer alike, so that read is made once per such shape
//! ([`NodeCapacity::shape`]). A request that fits nowhere costs a read per shape, not one per booking.
//!
//! A gang needs its members on distinct nodes at one start, so each start tried reads the
//! whole pool: each end of anything in the pool, and the first start a slot's members do
//! not cover. Either way a search stops after a budget of node reads ([`MAX_TRIES`] for
//! the API, [`PENDING_TRIES`] for the note on a pending reservation), and says how far it
//! got (`searchedUntil`): no slot it did not return starts before that.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use futures::FutureExt as _;
use serde::{Deserialize, Serialize};

use super::placement::{ByShape, Census, Snapshot, held_until};
use super::store::{Member, Reservation};
use super::{CreateRequest, DeviceRequest, Duration, Gang, Resources, Topology};
use crate::capacity::{NodeCapacity, Nodes, PoolList};
use crate::placer::NativeDefault;
use crate::{Error, Result};

/// How many node reads one search may make.
pub const MAX_TRIES: usize = 200_000;
/// How many node reads the search for a pending reservation's earliest start may make, on
/// each attempt to place it.
pub const PENDING_TRIES: usize = 1_000;
/// A start after every booking, host booking and node-reservation term that has an end.
const ONCE_FREE: i64 = 2 * super::MAX_INSTANT_MS;
/// The longest window a search covers: 366 days.
pub const MAX_WINDOW_MS: i64 = 366 * 24 * 3_600_000;

/// `POST /api/compute/reservations/availability` input: a create request without its
/// idempotency key, lease or wait, plus the window to search and how many slots to answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AvailabilityRequest {
    pub tenant_id: String,
    pub pool_id: String,
    pub devices: Vec<DeviceRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    pub duration: Duration,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spot: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<Gang>,
    /// Where the reservation may lie: it starts at or after `from` and ends by `to`.
    pub window: Window,
    /// 1-50 slots; 10 unless given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

/// A span of time, epoch milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Window {
    pub from: i64,
    pub to: i64,
}

impl AvailabilityRequest {
    /// The create request the search places (its fields checked as `create` checks them).
    pub fn as_create(&self) -> CreateRequest {
        CreateRequest {
            tenant_id: self.tenant_id.clone(),
            pool_id: self.pool_id.clone(),
            project_id: None,
            devices: self.devices.clone(),
            topology: self.topology,
            start: None,
            duration: self.duration.clone(),
            binding: self.binding.clone(),
            resources: self.resources,
            node: None,
            lease_seconds: None,
            spot: self.spot,
            idempotency_key: "availability".into(),
            wait: None,
            gang: self.gang.clone(),
        }
    }

    /// Checks the window and the limit; the rest is checked by [`CreateRequest::validate`].
    pub fn validate_search(&self) -> Result<()> {
        let Window { from, to } = self.window;
        crate::validation::range("window.from", from, 0, super::MAX_INSTANT_MS)?;
        crate::validation::range("window.to", to, 0, super::MAX_INSTANT_MS)?;
        if to <= from {
            return Err(Error::invalid("window.to", "must be after window.from"));
        }
        if to - from > MAX_WINDOW_MS {
            return Err(Error::invalid(
                "window.to",
                "the window spans at most 366 days",
            ));
        }
        if let Some(limit) = self.limit {
            crate::validation::range("limit", limit, 1, 50)?;
        }
        Ok(())
    }
}

/// What a search looks for: `r` (its request, tenant, spot, binding and host resources) for
/// `duration_ms`, starting in `[from, last_start]`, node-reservation rights read at `now`.
pub struct Search<'a> {
    pub r: &'a Reservation,
    pub duration_ms: i64,
    pub from: i64,
    pub last_start: i64,
    pub now: i64,
    pub limit: usize,
    /// How many node reads it may make (a gang's start reads the whole pool).
    pub tries: usize,
}

/// Where and when a request fits: on `members` from `start`, and at any start up to
/// `latest_start` on the same units.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub start: i64,
    pub latest_start: i64,
    pub members: Vec<Member>,
}

/// The slots found, earliest first, and the start up to which the search is complete.
#[derive(Debug, PartialEq, Eq)]
pub struct Found {
    pub slots: Vec<Slot>,
    pub searched_until: i64,
}

/// Searches `nodes` (a pool as the capacity view holds it).
pub fn search(nodes: &PoolList, search: &Search<'_>) -> Found {
    if search.r.request.gang.is_some() {
        search_gang(nodes, search)
    } else {
        search_nodes(&nodes.nodes, search)
    }
}

/// One node at a time: each node's earliest start, in start order.
fn search_nodes(nodes: &Nodes, search: &Search<'_>) -> Found {
    let mut shapes = ByShape::default();
    let mut could_fit = |node: &Arc<NodeCapacity>| {
        let fits = || fits_alone(node, search, ONCE_FREE).is_some();
        match node.shape() {
            Some(key) => shapes.get_or(key, fits),
            None => fits(),
        }
    };
    // Whether a node could ever take the request is answered once per shape, so nodes of a
    // shape that never could are left out at once; a node of its own shape (one with node
    // reservations) is asked when it is first tried, so a search that finds its slots
    // among the first nodes reads no others.
    let mut vetted = vec![false; nodes.len()];
    // A node whose every unit is held at some time in a window is passed over, without a
    // read, to where that ends; a search counts every booking as another's ([`fits_alone`]).
    let held = |node: &NodeCapacity, start: i64| {
        held_until(node, search.r, None, (start, start + search.duration_ms))
    };
    let mut queue: BinaryHeap<Reverse<(i64, usize)>> = (nodes.iter().enumerate())
        .filter(|(_, n)| !n.is_lost())
        .filter(|(i, n)| {
            n.shape().is_none() || {
                vetted[*i] = true;
                could_fit(n)
            }
        })
        .map(|(i, n)| Reverse((held(n, search.from).unwrap_or(search.from), i)))
        .filter(|Reverse((start, _))| *start <= search.last_start)
        .collect();
    let mut slots = Vec::new();
    let mut tries = 0;
    while let Some(Reverse((start, n))) = queue.pop() {
        if slots.len() == search.limit || tries == search.tries {
            return Found {
                slots,
                searched_until: start,
            };
        }
        let node = &nodes[n];
        if !std::mem::replace(&mut vetted[n], true) && !could_fit(node) {
            continue;
        }
        if let Some(free_from) = held(node, start) {
            if free_from <= search.last_start {
                queue.push(Reverse((free_from, n)));
            }
            continue;
        }
        tries += 1;
        match fits_alone(node, search, start) {
            Some(units) => slots.push(Slot {
                start,
                latest_start: latest_start(node, search, start, &units),
                members: vec![Member {
                    node_id: node.node.id.clone(),
                    unit_ids: units,
                }],
            }),
            None => {
                if let Some(next) = next_end(node, start).filter(|s| *s <= search.last_start) {
                    queue.push(Reverse((next, n)));
                }
            }
        }
    }
    Found {
        slots,
        searched_until: search.last_start,
    }
}

/// The units `node` alone would give the request over `[start, start + duration)`.
fn fits_alone(node: &Arc<NodeCapacity>, search: &Search<'_>, start: i64) -> Option<Vec<String>> {
    let list = PoolList {
        nodes: std::iter::once(node.clone()).collect(),
        scan: Default::default(),
        smallest_share: None,
    };
    let snapshot = Snapshot::of(list, None, start, start + search.duration_ms, search.now);
    let offer = snapshot.candidates(search.r, false, None);
    if offer.candidates.nodes.is_empty() {
        return None;
    }
    let (choice, _) = NativeDefault
        .decide(&offer.request, &offer.candidates)
        .ok()?;
    let units = &node.node.units;
    let chosen = (choice.units.iter())
        .map(|u| units[offer.index[*u as usize].1].id.clone())
        .collect();
    Some(Snapshot::booked_units(&node.node, search.r, chosen))
}

/// The earliest end after `start` of anything holding `node`: where what overlaps a window
/// starting there first shrinks.
fn next_end(node: &NodeCapacity, start: i64) -> Option<i64> {
    let bookings = node.bookings.iter().map(|b| b.end_ms);
    let host = node.host.iter().map(|h| h.end_ms);
    let claims = node.claims.iter().filter_map(|c| c.term.ends_at);
    bookings
        .chain(host)
        .chain(claims)
        .filter(|e| *e > start)
        .min()
}

/// The latest start at which `units` of `node` still take the request, given that they do
/// from `start`: before the first booking of one of them, or node reservation on one of
/// them, that begins after the window; and, where the request books host resources, before
/// the first host booking that begins after it (conservatively: any of them).
fn latest_start(node: &NodeCapacity, search: &Search<'_>, start: i64, units: &[String]) -> i64 {
    let after = start + search.duration_ms;
    let on_units = |unit: &String| units.contains(unit);
    let bookings = (node.bookings.iter())
        .filter(|b| on_units(&b.unit_id))
        .map(|b| b.start_ms);
    let claims = (node.claims.iter())
        .filter(|c| c.unit_ids.iter().any(on_units))
        .map(|c| c.term.starts_at);
    let books_host = search.r.resources != super::HostBooking::default()
        || search.r.binding == super::Binding::Node;
    let host = (node.host.iter())
        .filter(|_| books_host)
        .map(|h| h.start_ms);
    bookings
        .chain(claims)
        .chain(host)
        .filter(|s| *s >= after)
        .map(|s| s - search.duration_ms)
        .fold(search.last_start, i64::min)
}

/// A gang: the whole pool read at each start where anything ends, members placed as a
/// create places them, until `limit` slots. The next start tried after a slot is the first
/// one its members do not cover (its latest start, plus one millisecond): other nodes may
/// take the gang there. So every start at which the gang fits lies in a slot's range.
fn search_gang(nodes: &PoolList, search: &Search<'_>) -> Found {
    let complete = Found {
        slots: Vec::new(),
        searched_until: search.last_start,
    };
    if gang_at(nodes, search, ONCE_FREE).is_none() {
        return complete;
    }
    let mut ends: Vec<i64> = (nodes.nodes.iter())
        .filter(|n| !n.is_lost())
        .flat_map(|n| {
            let bookings = n.bookings.iter().map(|b| b.end_ms);
            let host = n.host.iter().map(|h| h.end_ms);
            let claims = n.claims.iter().filter_map(|c| c.term.ends_at);
            bookings.chain(host).chain(claims).collect::<Vec<_>>()
        })
        .filter(|e| *e > search.from && *e <= search.last_start)
        .collect();
    ends.push(search.from);
    ends.sort_unstable();
    ends.dedup();
    let mut ends = ends.into_iter().peekable();
    let by_id: BTreeMap<&str, &Arc<NodeCapacity>> = (nodes.nodes.iter())
        .map(|n| (n.node.id.as_str(), n))
        .collect();
    let mut slots: Vec<Slot> = Vec::new();
    let mut resume = None;
    let mut tries = 0;
    loop {
        let start = match resume.take() {
            Some(start) => {
                ends.next_if_eq(&start);
                start
            }
            None => match ends.next() {
                Some(end) => end,
                None => break,
            },
        };
        if slots.len() == search.limit || (tries > 0 && tries + nodes.nodes.len() > search.tries) {
            return Found {
                slots,
                searched_until: start,
            };
        }
        tries += nodes.nodes.len();
        let Some(chosen) = gang_at(nodes, search, start) else {
            continue;
        };
        let latest = (chosen.members.iter())
            .map(|m| latest_start(by_id[m.node_id.as_str()], search, start, &m.unit_ids))
            .min()
            .unwrap_or(search.last_start);
        slots.push(Slot {
            start,
            latest_start: latest,
            members: chosen.members,
        });
        while ends.next_if(|e| *e <= latest).is_some() {}
        resume = (latest < search.last_start).then_some(latest + 1);
    }
    Found { slots, ..complete }
}

/// The members a gang would get at `start`, placed as a create places them.
fn gang_at(nodes: &PoolList, search: &Search<'_>, start: i64) -> Option<super::place::Chosen> {
    let pool = PoolList {
        nodes: nodes.nodes.clone(),
        scan: Default::default(),
        smallest_share: nodes.smallest_share,
    };
    let snapshot = Snapshot::of(pool, None, start, start + search.duration_ms, search.now);
    // The native default answers at once: the future is ready when first polled.
    super::gang::decide(&NativeDefault, search.r, &snapshot)
        .now_or_never()
        .expect("the native default decides without waiting")
        .ok()?
        .ok()
}

/// Why `r` waits and until when, for its `Unschedulable` condition: the placer's `reason`,
/// the pool's nodes counted by the constraint each fails ([`Snapshot::census`]), and the
/// earliest start at which it would fit, searched for at most [`PENDING_TRIES`] node reads.
pub fn explain_pending(
    reason: &str,
    census: Option<Census>,
    r: &Reservation,
    snapshot: &Snapshot,
    now: i64,
) -> String {
    let what: Vec<String> = (r.request.devices.iter())
        .map(|d| format!("{} {}", d.count, d.class.as_str()))
        .collect();
    let census = census
        .unwrap_or_else(|| snapshot.census(r))
        .describe(&format!("{} units", what.join(" + ")));
    let from = r.start_ms.max(now);
    let search_for = Search {
        r,
        duration_ms: r.end_ms - r.start_ms,
        from,
        last_start: from + MAX_WINDOW_MS,
        now,
        limit: 1,
        tries: PENDING_TRIES,
    };
    let found = search(&snapshot.pool_list(), &search_for);
    let earliest = match found.slots.first() {
        Some(slot) => format!("earliest fit {}", crate::clock::format_ms(slot.start)),
        None if found.searched_until >= search_for.last_start => {
            "no fit within 366 days".to_string()
        }
        None => format!(
            "no fit found before {}",
            crate::clock::format_ms(found.searched_until)
        ),
    };
    format!("{reason}; {census}; {earliest}")
}

/// What a search answers.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Availability {
    /// Earliest first; for each node at most one, its earliest.
    pub slots: Vec<SlotView>,
    /// No slot missing from `slots` starts before this (epoch milliseconds): the window's
    /// last start, unless the search stopped early.
    pub searched_until: i64,
    /// Whether the tenant's quota would take the request's charge now.
    pub quota: QuotaCheck,
    /// Whether the spend-guard would allow it now; absent where neither the pool nor the
    /// offer asks for a budget check.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetCheck>,
}

/// A start at which the request fits, and where.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlotView {
    /// Epoch milliseconds: pass it as `start` to `create`.
    pub start: i64,
    /// The end of a reservation starting at `start`.
    pub end: i64,
    /// The same units take the request at any start up to this one.
    pub latest_start: i64,
    /// One node, or one per gang member.
    pub members: Vec<Member>,
}

/// The request's quota charge against what the tenant's offer leaves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaCheck {
    pub admits: bool,
    pub resources: Vec<QuotaCharge>,
}

/// One resource of a quota charge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaCharge {
    pub resource: String,
    pub requested: i64,
    /// A resource the offer does not name has a limit of 0.
    pub limit: i64,
    pub used: i64,
}

/// The spend-guard's answer on the request's cost, with the budget's figures (minor units).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetCheck {
    pub admits: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub charge_minor: i64,
    pub limit_minor: i64,
    pub spent_minor: i64,
    pub committed_minor: i64,
}

impl QuotaCheck {
    /// `charge` against `limits` (the offer's) with `used` taken already.
    pub fn of(
        charge: &BTreeMap<String, i64>,
        limits: &BTreeMap<String, i64>,
        used: &BTreeMap<String, i64>,
    ) -> QuotaCheck {
        let resources: Vec<QuotaCharge> = (charge.iter())
            .filter(|(_, amount)| **amount != 0)
            .map(|(resource, amount)| QuotaCharge {
                resource: resource.clone(),
                requested: *amount,
                limit: limits.get(resource).copied().unwrap_or(0),
                used: used.get(resource).copied().unwrap_or(0),
            })
            .collect();
        QuotaCheck {
            admits: resources.iter().all(|l| l.used + l.requested <= l.limit),
            resources,
        }
    }
}

/// `availability`: the earliest starts in the window at which the request fits the pool as
/// the capacity view holds it, with the nodes and units it would get, and whether quota
/// and budget would take it now.
pub async fn availability(
    app: &crate::App,
    caller: &crate::iam::Principal,
    input: AvailabilityRequest,
) -> Result<Availability> {
    let request = input.as_create();
    request.validate()?;
    input.validate_search()?;
    let binding = request.binding()?;
    if !(caller.has(crate::iam::Permission::ComputeRead) && caller.acts_for(&request.tenant_id)) {
        return Err(Error::not_found(format_args!("pool {}", request.pool_id)));
    }
    let duration_ms = request.duration.to_ms("duration")?;
    if input.window.to - input.window.from < duration_ms {
        return Err(Error::invalid(
            "window.to",
            "the window is shorter than the duration",
        ));
    }
    let now = app.now_ms();
    let mut conn = app.store.pool().acquire().await?;
    let at = app.settings.version(&mut conn).await?;
    let (pool, offer) =
        super::engine::bookable_pool(app, &mut conn, at, &request.pool_id, &request.tenant_id)
            .await?;
    let nodes = app.capacity.pool(&pool.id).await?;
    let inventory = Snapshot::of(
        PoolList {
            nodes: nodes.nodes.clone(),
            scan: nodes.scan.clone(),
            smallest_share: nodes.smallest_share,
        },
        None,
        0,
        0,
        0,
    );
    super::create::check_against_pool(&request, binding, &pool, &inventory)?;
    let share = inventory.per_gpu_share(&pool.policy);
    let r = super::create::new_draft(caller, "", &request, binding, share, now)?;
    let from = input.window.from.max(now);
    let search_for = Search {
        r: &r,
        duration_ms,
        from,
        last_start: input.window.to - duration_ms,
        now,
        limit: input.limit.unwrap_or(10) as usize,
        tries: MAX_TRIES,
    };
    let found = if search_for.last_start < from {
        Found {
            slots: Vec::new(),
            searched_until: search_for.last_start,
        }
    } else {
        tokio::task::block_in_place(|| search(&nodes, &search_for))
    };
    let (_, excess) = super::host_resources(request.gpu_count(), share, request.resources);
    let charge = super::quota_charge(&request, excess);
    let limits = offer.as_ref().map(|o| o.quota.clone()).unwrap_or_default();
    let used = crate::pools::store::quota_used(&mut conn, &pool.id, &request.tenant_id).await?;
    let budget =
        super::create::budget_check(app, &mut conn, (&pool, at), offer.as_ref(), &r).await?;
    Ok(Availability {
        slots: (found.slots.into_iter())
            .map(|s| SlotView {
                start: s.start,
                end: s.start + duration_ms,
                latest_start: s.latest_start,
                members: s.members,
            })
            .collect(),
        searched_until: found.searched_until,
        quota: QuotaCheck::of(&charge, &limits, &used),
        budget,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::capacity::Booked;
    use crate::inventory::nodes::Node;
    use crate::inventory::{DeviceClass, HostResources, Unit, UnitClass};

    const HOUR: i64 = 3_600_000;

    /// A node of 8 GPUs in two NVLink domains of 4 (units `<id>-g0` … `<id>-g7`).
    pub(in crate::booking) fn node(id: &str, bookings: Vec<Booked>) -> Arc<NodeCapacity> {
        node_in_domains(id, 4, bookings)
    }

    /// A node of 8 GPUs in NVLink domains of `per_domain`.
    fn node_in_domains(id: &str, per_domain: usize, bookings: Vec<Booked>) -> Arc<NodeCapacity> {
        let units = (0..8)
            .map(|i| Unit {
                id: format!("{id}-g{i}"),
                class: UnitClass::VfioGroup,
                device_class: DeviceClass::Gpu,
                model: "H100".into(),
                memory_gib: 80,
                nvlink_domain: Some(format!("{id}-d{}", i / per_domain)),
                sellable: true,
                labels: Default::default(),
            })
            .collect();
        let host = HostResources {
            vcpu: 0,
            memory_gib: 0,
            hugepages_1gi: 0,
        };
        let node = Arc::new(Node::sample(id, host, units));
        Arc::new(NodeCapacity::new(node, bookings, Vec::new(), Vec::new()))
    }

    fn booking(node: &str, unit: usize, start_h: i64, end_h: i64) -> Booked {
        Booked {
            unit_id: format!("{node}-g{unit}"),
            reservation_id: format!("rsv-{node}-{unit}-{start_h}"),
            spot: false,
            start_ms: start_h * HOUR,
            end_ms: end_h * HOUR,
        }
    }

    pub(in crate::booking) fn reservation(gpus: i64, nvlink_all: bool) -> Reservation {
        let request: CreateRequest = serde_json::from_value(serde_json::json!({
            "tenantId": "tenant-a",
            "poolId": "pool_01jd0000000000000000000000",
            "devices": [{ "class": "gpu", "count": gpus,
                          "topology": if nvlink_all { "nvlink-all" } else { "any" } }],
            "duration": "1h",
            "idempotencyKey": "availability",
        }))
        .unwrap();
        let caller = crate::iam::Principal::system();
        super::super::create::new_draft(&caller, "", &request, super::super::Binding::Hold, None, 0)
            .unwrap()
    }

    fn pool(nodes: Vec<Arc<NodeCapacity>>) -> PoolList {
        PoolList {
            nodes: nodes.into_iter().collect(),
            scan: Default::default(),
            smallest_share: None,
        }
    }

    /// Whether `unit` of `node` is free over `[start, start + duration)`, from the bookings.
    fn free(node: &NodeCapacity, unit: &str, start: i64, duration: i64) -> bool {
        !node
            .bookings
            .iter()
            .any(|b| b.unit_id == unit && b.start_ms < start + duration && b.end_ms > start)
    }

    /// The brute-force model: a node takes `gpus` at `start` when that many of its units are
    /// free (all in one domain for `nvlink_all`).
    fn fits(node: &NodeCapacity, gpus: usize, nvlink_all: bool, start: i64, duration: i64) -> bool {
        let free_in = |domain: Option<usize>| {
            (0..8)
                .filter(|u| domain.is_none_or(|d| u / 4 == d))
                .filter(|u| free(node, &format!("{}-g{u}", node.node.id), start, duration))
                .count()
        };
        match nvlink_all {
            true => free_in(Some(0)) >= gpus || free_in(Some(1)) >= gpus,
            false => free_in(None) >= gpus,
        }
    }

    /// `count` nodes (`n0`, …) whose units are each booked from a random hour in the first
    /// six, then again after a gap with probability `busy`, until 48 h.
    fn random_nodes(rng: &mut StdRng, count: usize, busy: f64) -> Vec<Arc<NodeCapacity>> {
        (0..count)
            .map(|n| {
                let id = format!("n{n}");
                let mut bookings = Vec::new();
                for unit in 0..8 {
                    let mut at = rng.random_range(0..6);
                    while at < 48 && rng.random_bool(busy) {
                        let end = at + rng.random_range(1..12);
                        bookings.push(booking(&id, unit, at, end));
                        at = end + rng.random_range(0..6);
                    }
                }
                node(&id, bookings)
            })
            .collect()
    }

    #[test]
    fn every_nodes_earliest_start_matches_a_brute_force_search() {
        let mut rng = StdRng::seed_from_u64(17);
        // Half the cases on nodes so busy that all their units are often held at once, so
        // that the search passes nodes over at a glance.
        let mut held_at_the_start = 0;
        for case in 0..400 {
            let count = rng.random_range(1..6);
            let nodes = random_nodes(&mut rng, count, [0.7, 0.97][case % 2]);
            let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
            let nvlink_all = gpus <= 4 && rng.random_bool(0.5);
            let duration = rng.random_range(1..10) * HOUR;
            let (from, last_start) = (rng.random_range(0..10) * HOUR, 60 * HOUR);
            held_at_the_start += (nodes.iter())
                .filter(|n| n.full_until(from, from + duration).is_some())
                .count();
            let r = reservation(gpus as i64, nvlink_all);
            let search_for = Search {
                r: &r,
                duration_ms: duration,
                from,
                last_start,
                now: 0,
                limit: 50,
                tries: MAX_TRIES,
            };
            let found = search(&pool(nodes.clone()), &search_for);
            assert_eq!(found.searched_until, last_start, "case {case}: complete");
            // Each node's earliest start on the hour grid every booking is on.
            let mut expected: Vec<(i64, String)> = nodes
                .iter()
                .filter_map(|n| {
                    (from..=last_start)
                        .step_by(HOUR as usize)
                        .find(|s| fits(n, gpus, nvlink_all, *s, duration))
                        .map(|s| (s, n.node.id.clone()))
                })
                .collect();
            expected.sort();
            let got: Vec<(i64, String)> = (found.slots.iter())
                .map(|s| (s.start, s.members[0].node_id.clone()))
                .collect();
            assert_eq!(
                got, expected,
                "case {case}: {gpus} GPUs, nvlink {nvlink_all}"
            );
            for slot in &found.slots {
                let n = nodes
                    .iter()
                    .find(|n| n.node.id == slot.members[0].node_id)
                    .unwrap();
                let units = &slot.members[0].unit_ids;
                assert_eq!(units.len(), gpus);
                if nvlink_all {
                    let domains: std::collections::BTreeSet<_> = units
                        .iter()
                        .map(|u| {
                            n.node
                                .units
                                .iter()
                                .find(|x| &x.id == u)
                                .unwrap()
                                .nvlink_domain
                                .clone()
                        })
                        .collect();
                    assert_eq!(domains.len(), 1, "case {case}: one domain");
                }
                // Free from the start to the latest start, and not one step later.
                for t in [slot.start, slot.latest_start] {
                    assert!(
                        units.iter().all(|u| free(n, u, t, duration)),
                        "case {case}: free at {t}"
                    );
                }
                if slot.latest_start < last_start {
                    let later = slot.latest_start + 1;
                    assert!(
                        !units.iter().all(|u| free(n, u, later, duration)),
                        "case {case}: latest"
                    );
                }
            }
        }
        assert!(held_at_the_start > 50, "{held_at_the_start} nodes held");
    }

    #[test]
    fn every_start_a_gang_fits_at_is_a_slot_or_inside_the_slot_before_it() {
        let mut rng = StdRng::seed_from_u64(23);
        for case in 0..100 {
            let count = rng.random_range(2..6);
            let nodes = random_nodes(&mut rng, count, 0.6);
            let size = rng.random_range(2..=3);
            let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
            let nvlink_all = gpus <= 4 && rng.random_bool(0.5);
            let duration = rng.random_range(1..8) * HOUR;
            let last_start = 60 * HOUR;
            let mut r = reservation(gpus as i64, nvlink_all);
            r.request.gang = Some(Gang {
                size,
                topology_key: None,
            });
            let search_for = Search {
                r: &r,
                duration_ms: duration,
                from: 0,
                last_start,
                now: 0,
                limit: 50,
                tries: MAX_TRIES,
            };
            let found = search(&pool(nodes.clone()), &search_for);
            assert_eq!(found.searched_until, last_start, "case {case}: complete");
            let by_id = |id: &str| nodes.iter().find(|n| n.node.id == id).unwrap();
            for slot in &found.slots {
                let ids: std::collections::BTreeSet<&str> =
                    slot.members.iter().map(|m| m.node_id.as_str()).collect();
                assert_eq!(ids.len(), size as usize, "case {case}: distinct nodes");
                for m in &slot.members {
                    for t in [slot.start, slot.latest_start] {
                        assert!(
                            m.unit_ids
                                .iter()
                                .all(|u| free(by_id(&m.node_id), u, t, duration)),
                            "case {case}: {} free at {t}",
                            m.node_id
                        );
                    }
                }
            }
            // The gang fits at `s` when `size` nodes each take a member.
            let gang_fits = |s: i64| {
                nodes
                    .iter()
                    .filter(|n| fits(n, gpus, nvlink_all, s, duration))
                    .count()
                    >= size as usize
            };
            for s in (0..=last_start).step_by(HOUR as usize) {
                let before = found.slots.iter().rev().find(|slot| slot.start <= s);
                let covered = before.is_some_and(|slot| s <= slot.latest_start);
                assert_eq!(
                    gang_fits(s),
                    covered,
                    "case {case}: {size} × {gpus} GPUs (nvlink {nvlink_all}) at {} h: {:?}",
                    s / HOUR,
                    found.slots
                );
            }
        }
    }

    #[test]
    fn a_search_answers_at_most_limit_slots_earliest_first_and_says_how_far_it_searched() {
        let nodes: Vec<_> = (0..6)
            .map(|n| {
                let id = format!("n{n}");
                let bookings = (0..8).map(|u| booking(&id, u, 0, n + 1)).collect();
                node(&id, bookings)
            })
            .collect();
        let r = reservation(8, false);
        let search_for = Search {
            r: &r,
            duration_ms: HOUR,
            from: 0,
            last_start: 100 * HOUR,
            now: 0,
            limit: 3,
            tries: MAX_TRIES,
        };
        let found = search(&pool(nodes), &search_for);
        let starts: Vec<i64> = found.slots.iter().map(|s| s.start / HOUR).collect();
        assert_eq!(starts, [1, 2, 3]);
        assert_eq!(found.searched_until, 4 * HOUR);
        assert!(found.slots.iter().all(|s| s.latest_start == 100 * HOUR));
    }

    #[test]
    fn a_gang_gets_distinct_nodes_at_one_start() {
        let nodes = vec![
            node("a", (0..8).map(|u| booking("a", u, 0, 2)).collect()),
            node("b", (0..8).map(|u| booking("b", u, 0, 5)).collect()),
            node("c", (0..8).map(|u| booking("c", u, 3, 6)).collect()),
        ];
        let mut r = reservation(8, false);
        r.request.gang = Some(Gang {
            size: 2,
            topology_key: None,
        });
        let search_for = Search {
            r: &r,
            duration_ms: HOUR,
            from: 0,
            last_start: 20 * HOUR,
            now: 0,
            limit: 2,
            tries: MAX_TRIES,
        };
        let found = search(&pool(nodes), &search_for);
        let slots: Vec<(i64, i64, Vec<&str>)> = (found.slots.iter())
            .map(|s| {
                let mut nodes: Vec<&str> = s.members.iter().map(|m| m.node_id.as_str()).collect();
                nodes.sort();
                (s.start / HOUR, s.latest_start / HOUR, nodes)
            })
            .collect();
        // a and c from 2 h until c's booking at 3 h ends the room for a 1 h window at 2 h;
        // then a and b (or c) from 5 h.
        assert_eq!(slots[0], (2, 2, vec!["a", "c"]));
        assert_eq!(slots[1].0, 5);
        assert_eq!(slots.len(), 2);
    }

    #[test]
    fn a_full_read_for_candidates_counts_the_same_census_as_a_count_of_its_own() {
        let mut rng = StdRng::seed_from_u64(23);
        for _ in 0..200 {
            let count = rng.random_range(1..12);
            let nodes = random_nodes(&mut rng, count, 0.6);
            let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
            let r = reservation(gpus, gpus <= 4 && rng.random_bool(0.5));
            let start = rng.random_range(0..40) * HOUR;
            let snapshot = Snapshot::of(pool(nodes), None, start, start + 4 * HOUR, 0);
            let census = snapshot.census(&r);
            assert_eq!(census.nodes, count);
            assert_eq!(snapshot.candidates(&r, false, None).census, Some(census));
        }
        let snapshot = Snapshot::of(pool(random_nodes(&mut rng, 4, 0.5)), None, 0, HOUR, 0);
        // A partial read, or one for preemption, counts nothing.
        assert_eq!(
            snapshot
                .candidates(&reservation(1, false), false, Some(2))
                .census,
            None
        );
        assert_eq!(
            snapshot
                .candidates(&reservation(1, false), true, None)
                .census,
            None
        );
    }

    #[test]
    fn a_pending_request_counts_every_node_under_the_constraint_it_fails_and_says_when_it_fits() {
        let nodes = vec![
            node("busy", (0..8).map(|u| booking("busy", u, 0, 5)).collect()),
            // Three free in each domain: six free, but not four in one domain.
            node(
                "split",
                vec![booking("split", 0, 0, 3), booking("split", 4, 0, 3)],
            ),
            node("free", Vec::new()),
        ];
        let r = reservation(4, true);
        let snapshot = Snapshot::of(pool(nodes), None, 0, HOUR, 0);
        let census = snapshot.census(&r);
        assert_eq!(
            (
                census.nodes,
                census.busy,
                census.split,
                census.fit,
                census.lost
            ),
            (3, 1, 1, 1, 0)
        );
        assert_eq!(
            census.describe("4 gpu units"),
            "of 3 nodes, 1 lack 4 gpu units free over the window, \
             1 lack 4 gpu units free in one NVLink domain, 1 could take it on their own"
        );
        let mut later = reservation(8, false);
        later.start_ms = 0;
        later.end_ms = HOUR;
        let busy_only = Snapshot::of(
            pool(vec![node(
                "busy",
                (0..8).map(|u| booking("busy", u, 0, 5)).collect(),
            )]),
            None,
            0,
            HOUR,
            0,
        );
        let note = explain_pending("no room", None, &later, &busy_only, 0);
        assert!(
            note.starts_with("no room; of 1 nodes, 1 lack 8 gpu units free"),
            "{note}"
        );
        assert!(
            note.ends_with(&format!(
                "earliest fit {}",
                crate::clock::format_ms(5 * HOUR)
            )),
            "{note}"
        );
    }

    #[test]
    fn a_node_that_could_never_take_a_request_counts_under_that_constraint_whatever_holds_it() {
        // Eight GPUs in one NVLink domain: no node of domains of four could ever take them,
        // booked or not; a node of one domain of eight could, once free.
        let nodes = vec![
            node("busy", (0..8).map(|u| booking("busy", u, 0, 5)).collect()),
            node("free", Vec::new()),
            node_in_domains("whole", 8, vec![booking("whole", 0, 0, 5)]),
        ];
        let r = reservation(8, true);
        let snapshot = Snapshot::of(pool(nodes), None, 0, HOUR, 0);
        let census = snapshot.census(&r);
        assert_eq!((census.split, census.busy, census.fit), (2, 1, 0));
        let offer = snapshot.candidates(&r, false, None);
        assert!(offer.candidates.nodes.is_empty());
        assert_eq!(offer.census, Some(census));
    }

    #[test]
    fn a_node_without_enough_free_units_in_one_nvlink_domain_is_not_offered_to_the_placer() {
        let nodes = pool(vec![
            // Three free in each domain.
            node(
                "split",
                vec![booking("split", 0, 0, 2), booking("split", 7, 0, 2)],
            ),
            node_in_domains("whole", 8, Vec::new()),
            node("free", Vec::new()),
        ]);
        let snapshot = Snapshot::of(nodes, None, 0, HOUR, 0);
        let offered = |gpus: i64, nvlink_all: bool| -> Vec<u32> {
            let offer = snapshot.candidates(&reservation(gpus, nvlink_all), false, None);
            offer.candidates.nodes.iter().map(|n| n.id).collect()
        };
        assert_eq!(offered(8, true), [1], "only one domain of 8");
        assert_eq!(
            offered(4, true),
            [1, 2],
            "split has three free in each domain"
        );
        assert_eq!(offered(4, false), [0, 1, 2]);
        assert_eq!(offered(8, false), [1, 2], "split has six free");
    }

    #[test]
    fn nodes_of_another_shape_are_read_apart_from_those_that_never_fit() {
        let nodes = vec![
            node("a", Vec::new()),
            node_in_domains("b", 8, (0..8).map(|u| booking("b", u, 0, 3)).collect()),
            node("c", Vec::new()),
            node_in_domains("d", 8, Vec::new()),
        ];
        let r = reservation(8, true);
        let search_for = Search {
            r: &r,
            duration_ms: HOUR,
            from: 0,
            last_start: 10 * HOUR,
            now: 0,
            limit: 10,
            tries: MAX_TRIES,
        };
        let found = search(&pool(nodes), &search_for);
        let slots: Vec<(i64, &str)> = (found.slots.iter())
            .map(|s| (s.start / HOUR, s.members[0].node_id.as_str()))
            .collect();
        assert_eq!(slots, [(0, "d"), (3, "b")]);
        assert_eq!(found.searched_until, 10 * HOUR);
    }
}
