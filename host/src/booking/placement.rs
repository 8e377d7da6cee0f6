//! Finding units for a reservation: the host computes the feasible candidates (free over
//! the window, allowed to the tenant at the request's tier, of a requested class, on a node
//! with room for the host resources), hands compact records to the pool's placer, and
//! checks the answer before anything is written.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sqlx::AnyConnection;

use super::store::Reservation;
use super::{CreateRequest, DeviceRequest, HostBooking};
use crate::capacity::{Booked, NodeCapacity, Nodes, PoolList};
use crate::inventory::nodes::Node;
use crate::inventory::{Unit, labels_match};
use crate::node_reservations::may_place;
use crate::node_reservations::queries::{Filter, load};
use crate::placer::{
    CandidateUnit, Candidates, DeviceAsk, DomainLoad, NodeFacts, PlacementRequest, SpotCandidate,
    policy_class,
};
use crate::{App, Result};

/// What a placement (or a preemption) decision is given, and how to read its answer.
pub struct Candidacy {
    pub request: PlacementRequest,
    pub candidates: Candidates,
    /// The (node, unit) indices of [`Snapshot::nodes`] behind each candidate unit id.
    pub index: Vec<(usize, usize)>,
    /// With preemption: the spot bookings that could give way, by [`SpotCandidate::id`].
    pub spot: Vec<SpotCandidate>,
    /// The spot reservation behind each entry of `spot`.
    pub spot_reservations: Vec<String>,
    /// Whether the pool was read only in part ([`Snapshot::candidates`] with a limit).
    pub partial: bool,
    /// A read of the whole pool without preemption (one with a limit that found fewer
    /// candidates included): why each node does or does not take the request
    /// ([`Snapshot::census`]), counted on the way.
    pub census: Option<Census>,
}

/// The pool's nodes as the capacity view holds them, read over one window: what a decision
/// is made on. A node's position in it is its id in the candidates of a call; lost nodes
/// are in it but never candidates.
pub struct Snapshot {
    nodes: Nodes,
    /// Where a decision that reads only part of the pool starts ([`PoolList::scan`]).
    scan: Arc<AtomicUsize>,
    /// [`PoolList::smallest_share`].
    smallest_share: Option<crate::pools::PerGpu>,
    /// The reservation deciding, where it holds units anywhere: its own bookings do not
    /// hold anything against it.
    own: Option<Own>,
    start: i64,
    end: i64,
    now: i64,
}

/// What holds one unit over a snapshot's window.
#[derive(Clone, Copy, Default)]
struct Held<'a> {
    /// How many bookings.
    count: u32,
    /// The first of them.
    first: Option<&'a Booked>,
}

/// One node of a snapshot, read over its window: who holds each unit, which units the
/// deciding tenant may use, and the host resources booked.
#[derive(Default)]
struct NodeWindow<'a> {
    held: Vec<Held<'a>>,
    allowed: Vec<bool>,
    host_used: HostBooking,
    /// Host resources booked by work that is not spot (what preemption cannot free).
    host_used_steady: HostBooking,
}

impl NodeWindow<'_> {
    /// Whether a reservation may have all of `node`: nothing holds any of it over the
    /// window, and the node reservations let it place on every sellable unit.
    fn wholly_free(&self, capacity: &NodeCapacity) -> bool {
        self.host_used == HostBooking::default()
            && capacity
                .slots()
                .iter()
                .enumerate()
                .filter(|(_, slot)| slot.sellable)
                .all(|(u, _)| self.held[u].count == 0 && self.allowed[u])
    }
}

/// A reservation deciding, with its [`reservation_hash`].
///
/// [`reservation_hash`]: crate::capacity::reservation_hash
#[derive(Clone)]
struct Own {
    id: String,
    hash: u64,
}

impl Snapshot {
    /// The nodes of pool `pool_id` as the capacity view holds them, read over `r`'s window
    /// for `r` (its own bookings, where it holds any, do not count), with node-reservation
    /// rights as they stand at `now`.
    pub async fn load(app: &App, pool_id: &str, r: &Reservation, now: i64) -> Result<Snapshot> {
        // One that holds no units (a draft, or one still waiting) is told apart from what
        // holds a node without looking at who does.
        let own = (!r.members.is_empty()).then_some(r.id.as_str());
        let nodes = app.capacity.pool(pool_id).await?;
        Ok(Snapshot::of(nodes, own, r.start_ms, r.end_ms, now))
    }

    /// The pool's nodes as the capacity view holds them, without a window: what a request
    /// is checked against before it is decided.
    pub async fn inventory(app: &App, pool_id: &str) -> Result<Snapshot> {
        Ok(Snapshot::of(
            app.capacity.pool(pool_id).await?,
            None,
            0,
            0,
            0,
        ))
    }

    /// The same nodes as `self`, with `changed` read again on `conn`: a transaction that
    /// changed capacity there (terminated spot work) decides on what it sees, its own
    /// uncommitted changes included.
    pub async fn read_again(
        &self,
        conn: &mut AnyConnection,
        changed: &[String],
    ) -> Result<Snapshot> {
        let mut fresh: std::collections::HashMap<String, NodeCapacity> =
            crate::capacity::load(conn, changed)
                .await?
                .into_iter()
                .map(|c| (c.node.id.clone(), c))
                .collect();
        let nodes = self
            .nodes
            .iter()
            .filter_map(|held| match fresh.remove(&held.node.id) {
                Some(read) => Some(Arc::new(read)),
                None if changed.contains(&held.node.id) => None,
                None => Some(held.clone()),
            })
            .collect();
        let nodes = PoolList {
            nodes,
            scan: self.scan.clone(),
            smallest_share: self.smallest_share,
        };
        let own = self.own.as_ref().map(|o| o.id.as_str());
        Ok(Snapshot::of(nodes, own, self.start, self.end, self.now))
    }

    /// `nodes` read over the window `[start, end)` for the reservation `own` (`None` for
    /// one that holds nothing).
    pub fn of(nodes: PoolList, own: Option<&str>, start: i64, end: i64, now: i64) -> Snapshot {
        Snapshot {
            nodes: nodes.nodes,
            scan: nodes.scan,
            smallest_share: nodes.smallest_share,
            own: own.map(|id| Own {
                id: id.to_string(),
                hash: crate::capacity::reservation_hash(id),
            }),
            start,
            end,
            now,
        }
    }

    /// The names, regions and labels of the nodes of `candidates`, read from this
    /// snapshot, in the order of `candidates.nodes`.
    pub fn facts(&self, candidates: &Candidates) -> NodeFacts {
        let mut facts = NodeFacts::default();
        for &id in &candidates.nodes.id {
            let node = self.node(id as usize);
            let labels = node.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            facts.push(&node.id, node.region.as_deref(), labels);
        }
        facts
    }

    /// How many nodes the snapshot holds.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the snapshot holds no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node at position `n`.
    pub fn node(&self, n: usize) -> &Node {
        &self.nodes[n].node
    }

    /// Whether node `n` holds node reservations (any but cancelled ones).
    pub fn claimed(&self, n: usize) -> bool {
        !self.nodes[n].claims.is_empty()
    }

    /// The nodes, in order, lost ones included.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().map(|c| c.node.as_ref())
    }

    fn overlaps(&self, start: i64, end: i64, reservation_id: &str) -> bool {
        start < self.end
            && end > self.start
            && self.own.as_ref().is_none_or(|own| own.id != reservation_id)
    }

    /// Whether a booking of `reservation_id`, whose hash is `hash`, is the deciding
    /// reservation's (the hash tells most others apart without comparing ids).
    fn is_own(&self, hash: u64, reservation_id: &str) -> bool {
        (self.own.as_ref()).is_some_and(|own| own.hash == hash && own.id == reservation_id)
    }

    /// The host resources booked on `capacity` over the window by others than the deciding
    /// reservation: in all, and by work that is not spot (what preemption cannot free).
    fn host_used(&self, capacity: &NodeCapacity) -> (HostBooking, HostBooking) {
        let (mut all, mut steady) = (HostBooking::default(), HostBooking::default());
        for (h, _) in capacity.host_spans().filter(|(h, hash)| {
            h.start_ms < self.end && h.end_ms > self.start && !self.is_own(*hash, &h.reservation_id)
        }) {
            let booked = HostBooking::from(h.amount);
            if !h.spot {
                steady.add(booked);
            }
            all.add(booked);
        }
        (all, steady)
    }

    /// Reads node `n` over the window for `r` into `out`.
    fn read_window<'a>(&'a self, n: usize, r: &Reservation, out: &mut NodeWindow<'a>) {
        let capacity = &self.nodes[n];
        let units = capacity.node.units.len();
        out.held.clear();
        out.held.resize(units, Held::default());
        for span in capacity.spans() {
            let overlaps = span.start_ms < self.end
                && span.end_ms > self.start
                && !self.is_own(
                    span.reservation,
                    &capacity.bookings[span.booking as usize].reservation_id,
                );
            if overlaps {
                let h = &mut out.held[span.unit as usize];
                h.count += 1;
                h.first
                    .get_or_insert(&capacity.bookings[span.booking as usize]);
            }
        }
        (out.host_used, out.host_used_steady) = self.host_used(capacity);
        out.allowed.clear();
        out.allowed.resize(units, true);
        let term = crate::node_reservations::Term {
            starts_at: self.start,
            ends_at: Some(self.end),
        };
        for (record, claimed) in capacity
            .claims_by_unit()
            .filter(|(c, _)| c.term.ends_at.is_none_or(|e| e > self.now) && c.term.overlaps(&term))
        {
            let rights = [record.rights(self.now)];
            for &u in claimed {
                let unit = &capacity.node.units[u].id;
                out.allowed[u] &= may_place(&r.tenant_id, unit, &rights, r.spot);
            }
        }
    }

    /// When the node reservations on `node_id` first refuse `r` any of `units` over its
    /// window (the later of the window's start and the refusing claim's), or `None` when
    /// they allow it all; read again at write time with `lock` (the store's `FOR SHARE`): a
    /// reclaim or a new reservation that committed after the snapshot was read wins, and a
    /// reclaim that starts after this read waits for the booking and then sees it.
    pub async fn rights_refuse_from(
        conn: &mut AnyConnection,
        lock: &str,
        r: &Reservation,
        node_id: &str,
        units: &[String],
        now: i64,
    ) -> Result<Option<i64>> {
        let window = crate::node_reservations::Term {
            starts_at: r.start_ms.max(now),
            ends_at: Some(r.end_ms),
        };
        let claims = load(conn, Filter::Node(node_id), lock).await?;
        let refusing = (claims.iter())
            .filter(|claim| claim.term.overlaps(&window))
            .filter(|claim| {
                let rights = [claim.rights(now)];
                (units.iter())
                    .filter(|unit| claim.unit_ids.contains(unit))
                    .any(|unit| !may_place(&r.tenant_id, unit, &rights, r.spot))
            });
        Ok(refusing
            .map(|claim| claim.term.starts_at.max(window.starts_at))
            .min())
    }

    /// The nodes where spot work holds units over the window (what preemption could free).
    pub fn nodes_holding_spot(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self
            .nodes
            .iter()
            .filter(|c| !c.is_lost() && c.holds_spot())
            .filter(|c| {
                c.bookings
                    .iter()
                    .any(|b| b.spot && self.overlaps(b.start_ms, b.end_ms, &b.reservation_id))
            })
            .map(|c| c.node.id.clone())
            .collect();
        nodes.sort();
        nodes
    }

    /// The units a placement on `node` books: those the placer chose, or for a node
    /// binding every sellable unit of the node.
    pub fn booked_units(node: &Node, r: &Reservation, chosen: Vec<String>) -> Vec<String> {
        if r.binding == super::Binding::Node {
            node.units
                .iter()
                .filter(|u| u.sellable)
                .map(|u| u.id.clone())
                .collect()
        } else {
            chosen
        }
    }

    /// The per-GPU share of host resources in this pool: the policy's, or the smallest any
    /// of its GPU hosts can give.
    pub fn per_gpu_share(&self, policy: &crate::pools::PoolPolicy) -> Option<crate::pools::PerGpu> {
        crate::pools::per_gpu_share(policy, self.smallest_share)
    }

    /// The feasible candidates for `reservation`: the units it may take that are free over
    /// its window, on nodes with room for its host resources. Only nodes with a usable unit
    /// of a requested class are candidates. Candidate unit ids index `candidates.units`.
    ///
    /// With `preempting`, a unit held by nothing but one spot booking is not free but goes to
    /// that booking's entry in `spot` (its run of units follows its node's free run), and a
    /// node with such units is a candidate even when nothing on it is free.
    ///
    /// With `limit`, a pool of more nodes than that is read only until `limit` candidate
    /// nodes are found, starting where the previous such read of the pool stopped
    /// ([`PoolList::scan`]): a decision then costs the same however large the pool, and the
    /// pool's nodes are offered in turn. [`Candidacy::partial`] says whether nodes were
    /// left unread.
    pub fn candidates(
        &self,
        reservation: &Reservation,
        preempting: bool,
        limit: Option<usize>,
    ) -> Candidacy {
        let request = &reservation.request;
        let mut models: Vec<String> = Vec::new();
        let intern = |model: &str, models: &mut Vec<String>| -> u32 {
            match models.iter().position(|m| m == model) {
                Some(i) => i as u32,
                None => {
                    models.push(model.to_string());
                    (models.len() - 1) as u32
                }
            }
        };
        let devices: Vec<DeviceAsk> = request
            .devices
            .iter()
            .map(|d| DeviceAsk {
                class: policy_class(d.class),
                count: d.count as u32,
                model: d
                    .selector
                    .as_ref()
                    .and_then(|s| s.model.as_deref())
                    .map(|m| intern(m, &mut models)),
                nvlink_all: request.nvlink_all(d),
            })
            .collect();
        let mut out = Candidacy {
            request: PlacementRequest {
                devices,
                spot: reservation.spot,
                duration_seconds: ((reservation.end_ms - reservation.start_ms) / 1000).max(0)
                    as u64,
                models: Vec::new(),
            },
            candidates: Candidates::default(),
            index: Vec::new(),
            spot: Vec::new(),
            spot_reservations: Vec::new(),
            partial: false,
            census: None,
        };
        let len = self.nodes.len();
        let limit = limit.filter(|l| *l < len);
        let first = match limit {
            Some(_) => self.scan.load(Ordering::Relaxed) % len,
            None => 0,
        };
        if let Some(limit) = limit {
            out.candidates.reserve(limit, limit * 8);
        }
        let mut census = (!preempting).then(|| Census {
            nodes: len,
            ..Census::default()
        });
        // Units a placement on one node must have, in all: a node with fewer usable ones
        // cannot take the request and is not offered.
        let wanted: usize = request
            .devices
            .iter()
            .map(|d| d.count.max(0) as usize)
            .sum();
        let mut window = NodeWindow::default();
        let mut usable: Vec<bool> = Vec::new();
        let mut in_domain: Vec<usize> = Vec::new();
        let mut node_models: Vec<u32> = Vec::new();
        let mut loads: Vec<DomainLoad> = Vec::new();
        let mut never = Never::default();
        for n in (first..len).chain(0..first) {
            if limit.is_some_and(|l| out.candidates.nodes.len() >= l) {
                self.scan.store(n, Ordering::Relaxed);
                out.partial = true;
                break;
            }
            let capacity = &self.nodes[n];
            let node = capacity.node.as_ref();
            // A lost node gets no new placements until it reports again.
            if capacity.is_lost() {
                if let Some(census) = &mut census {
                    census.lost += 1;
                }
                continue;
            }
            let glance = || match preempting {
                true => None,
                false => self.at_a_glance(n, reservation),
            };
            if let Some(verdict) = never.fails(self, n, reservation).or_else(glance) {
                if let Some(census) = &mut census {
                    census.count(verdict);
                }
                continue;
            }
            self.read_window(n, reservation, &mut window);
            let host_used = if preempting {
                window.host_used_steady
            } else {
                window.host_used
            };
            // Offered: room for the host resources; for a node binding (which hands the
            // whole node over) a node nothing else holds; enough units that could serve.
            let offered = has_room(&node.host, host_used, reservation.resources)
                && (reservation.binding != super::Binding::Node || window.wholly_free(capacity))
                && usable_units(request, capacity, &window, preempting, &mut usable)
                    >= wanted.max(1)
                && serves_each_device(request, capacity, &usable, &mut in_domain);
            if let Some(census) = &mut census {
                // An offered node takes the request on its own: it fails no constraint.
                census.count(match offered {
                    true => Verdict::Fit,
                    false => self.verdict(n, reservation, &window, &mut in_domain),
                });
            }
            if !offered {
                continue;
            }
            node_models.clear();
            node_models.extend(capacity.models().iter().map(|m| intern(m, &mut models)));
            loads.clear();
            let first_unit = out.candidates.units.len();
            let mut busy_units = 0;
            // Units that a spot booking holds, grouped by booking, in unit order.
            let mut giving_way: BTreeMap<&str, (i64, Vec<CandidateUnit>, Vec<usize>)> =
                BTreeMap::new();
            for (u, slot) in capacity.slots().iter().enumerate() {
                let domain = &slot.domain;
                let held = window.held[u];
                let busy = held.count > 0;
                busy_units += u32::from(busy);
                if let Some(d) = *domain {
                    if loads.len() <= d as usize {
                        loads.resize_with(d as usize + 1, || DomainLoad {
                            domain: 0,
                            busy: 0,
                            total: 0,
                        });
                    }
                    let load = &mut loads[d as usize];
                    load.domain = d;
                    load.total += 1;
                    load.busy += u32::from(busy);
                }
                if !usable[u] {
                    continue;
                }
                let candidate = CandidateUnit {
                    class: policy_class(slot.class),
                    model: node_models[slot.model as usize],
                    nvlink_domain: *domain,
                    memory_gib: slot.memory_gib,
                };
                match held.first {
                    None => {
                        out.candidates.units.push(candidate);
                        out.index.push((n, u));
                    }
                    Some(hold) => {
                        let entry = giving_way.entry(hold.reservation_id.as_str()).or_insert((
                            hold.start_ms,
                            Vec::new(),
                            Vec::new(),
                        ));
                        entry.1.push(candidate);
                        entry.2.push(u);
                    }
                }
            }
            let free = out.candidates.units.len() - first_unit;
            if free == 0 && giving_way.is_empty() {
                continue;
            }
            let node_id = n as u32;
            let domains = out
                .candidates
                .push_domains(loads.iter().filter(|l| l.total > 0).cloned());
            out.candidates.nodes.push(orl_placer_default::Node {
                id: node_id,
                busy_units,
                total_units: node.units.len() as u32,
                domains,
                free: orl_placer_default::Span {
                    start: first_unit as u32,
                    len: free as u32,
                },
            });
            for (reservation_id, (start_ms, units, positions)) in giving_way {
                let span = out.candidates.push_units(units);
                out.index.extend(positions.into_iter().map(|u| (n, u)));
                out.spot.push(SpotCandidate {
                    id: out.spot.len() as u32,
                    node: node_id,
                    units: span,
                    elapsed_seconds: ((self.now - start_ms) / 1000).max(0) as u64,
                    started_at_ms: start_ms,
                });
                out.spot_reservations.push(reservation_id.to_string());
            }
        }
        out.request.models = models;
        out.census = census.filter(|_| !out.partial);
        out
    }
}

/// Per node shape ([`NodeCapacity::shape`]), the first constraint a node of that shape fails
/// for one request with nothing holding it, worked out on the first such node: a node that
/// fails a constraint even then (too little host in all, too few matching units, too few in
/// one NVLink domain) fails it whatever holds it, so it is neither read over the window nor
/// offered, and it is counted under that constraint. A pool of one or a few shapes pays
/// a comparison per node for a request no node could ever take.
#[derive(Default)]
struct Never(ByShape<Option<Verdict>>);

impl Never {
    fn fails(&mut self, snapshot: &Snapshot, n: usize, r: &Reservation) -> Option<Verdict> {
        let shape = snapshot.nodes[n].shape()?;
        self.0.get_or(shape, || {
            let units = snapshot.nodes[n].node.units.len();
            let idle = NodeWindow {
                held: vec![Held::default(); units],
                allowed: vec![true; units],
                ..NodeWindow::default()
            };
            let verdict = snapshot.verdict(n, r, &idle, &mut Vec::new());
            (verdict != Verdict::Fit).then_some(verdict)
        })
    }
}

/// Answers worked out once per node shape ([`NodeCapacity::shape`]); the last one asked
/// for is at hand without a lookup, as a pool's nodes mostly come in long runs of one shape.
pub(super) struct ByShape<T> {
    answers: std::collections::HashMap<u64, T, foldhash::fast::FixedState>,
    last: Option<(u64, T)>,
}

impl<T> Default for ByShape<T> {
    fn default() -> Self {
        ByShape {
            answers: Default::default(),
            last: None,
        }
    }
}

impl<T: Copy> ByShape<T> {
    /// The answer for `shape`, worked out with `work_out` the first time.
    pub(super) fn get_or(&mut self, shape: u64, work_out: impl FnOnce() -> T) -> T {
        if let Some((last, answer)) = self.last
            && last == shape
        {
            return answer;
        }
        let answer = *self.answers.entry(shape).or_insert_with(work_out);
        self.last = Some((shape, answer));
        answer
    }
}

/// Why the nodes of a snapshot do not take a request, one count per constraint: each node
/// counted once, under the first constraint it fails (one it fails even with nothing
/// holding it first), so the counts add up to the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    pub nodes: usize,
    pub lost: usize,
    /// Too little host CPU, memory or hugepages left over the window.
    pub host: usize,
    /// A node binding takes a whole node, and something holds part of it.
    pub not_whole: usize,
    /// Too few units of the class, model, memory and labels asked for.
    pub unmatched: usize,
    /// Enough such units, but node reservations keep too many for other orgs.
    pub reserved: usize,
    /// Enough such units open to the tenant, but too few free over the window.
    pub busy: usize,
    /// Enough free, but not in one NVLink domain.
    pub split: usize,
    /// Would take the request (a member of it, for a gang) on its own.
    pub fit: usize,
}

/// The first constraint a node fails for a request, in the order [`Snapshot::census`]
/// tries them (after host resources and a node binding, the per-device ones, the worst
/// over the request's devices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Verdict {
    Host,
    NotWhole,
    Unmatched,
    Reserved,
    Busy,
    Split,
    Fit,
}

impl Census {
    fn count(&mut self, verdict: Verdict) {
        *match verdict {
            Verdict::Host => &mut self.host,
            Verdict::NotWhole => &mut self.not_whole,
            Verdict::Unmatched => &mut self.unmatched,
            Verdict::Reserved => &mut self.reserved,
            Verdict::Busy => &mut self.busy,
            Verdict::Split => &mut self.split,
            Verdict::Fit => &mut self.fit,
        } += 1;
    }

    /// The counts in words, for `what` (e.g. "8 gpu units"): "of 5,000 nodes, 4,211 lack …".
    pub fn describe(&self, what: &str) -> String {
        let parts: Vec<String> = [
            (self.busy, format!("lack {what} free over the window")),
            (self.split, format!("lack {what} free in one NVLink domain")),
            (self.reserved, "are reserved to other orgs".to_string()),
            (
                self.unmatched,
                format!("have fewer than {what} matching the request"),
            ),
            (self.host, "lack host CPU, memory or hugepages".to_string()),
            (
                self.not_whole,
                "are not wholly free for a node binding".to_string(),
            ),
            (self.lost, "are lost".to_string()),
            (self.fit, "could take it on their own".to_string()),
        ]
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, words)| format!("{count} {words}"))
        .collect();
        format!("of {} nodes, {}", self.nodes, parts.join(", "))
    }
}

impl Snapshot {
    /// Why each node does or does not take `r` (one member of it, for a gang) over the
    /// window: the first constraint it fails, counted. A full read of the pool for
    /// candidates counts the same on its way ([`Candidacy::census`]).
    pub fn census(&self, r: &Reservation) -> Census {
        let mut census = Census {
            nodes: self.nodes.len(),
            ..Census::default()
        };
        let mut window = NodeWindow::default();
        let mut by_domain: Vec<usize> = Vec::new();
        let mut never = Never::default();
        for n in 0..self.nodes.len() {
            if self.nodes[n].is_lost() {
                census.lost += 1;
                continue;
            }
            if let Some(verdict) = never.fails(self, n, r).or_else(|| self.at_a_glance(n, r)) {
                census.count(verdict);
                continue;
            }
            self.read_window(n, r, &mut window);
            census.count(self.verdict(n, r, &window, &mut by_domain));
        }
        census
    }

    /// The first constraint node `n` (not lost, and not failing one whatever holds it:
    /// [`Never`]) fails for `r`, when that can be told without reading its unit bookings
    /// ([`held_until`]): it lacks host room, or else it is busy (not wholly free, for a node
    /// binding).
    fn at_a_glance(&self, n: usize, r: &Reservation) -> Option<Verdict> {
        let capacity = &self.nodes[n];
        let own_hash = self.own.as_ref().map(|own| own.hash);
        held_until(capacity, r, own_hash, (self.start, self.end))?;
        let host = &capacity.node.host;
        // All the host bookings added up leave room, or those over the window do.
        let at_most = capacity.host_booked_at_most().into();
        let room = has_room(host, at_most, r.resources)
            || has_room(host, self.host_used(capacity).0, r.resources);
        Some(if !room {
            Verdict::Host
        } else if r.binding == super::Binding::Node {
            Verdict::NotWhole
        } else {
            Verdict::Busy
        })
    }

    /// The first constraint node `n`, not lost and read over the window into `window`,
    /// fails for `r`. `by_domain` is scratch space, reused across nodes.
    fn verdict(
        &self,
        n: usize,
        r: &Reservation,
        window: &NodeWindow<'_>,
        by_domain: &mut Vec<usize>,
    ) -> Verdict {
        let capacity = &self.nodes[n];
        let node = capacity.node.as_ref();
        if !has_room(&node.host, window.host_used, r.resources) {
            return Verdict::Host;
        }
        if r.binding == super::Binding::Node && !window.wholly_free(capacity) {
            return Verdict::NotWhole;
        }
        // Per device entry: matching units, those the tenant may use, those free, and the
        // most free in one NVLink domain (domains are numbered from 0).
        let mut worst = Verdict::Fit;
        for d in &r.request.devices {
            let want = d.count.max(0) as usize;
            let (mut matching, mut allowed, mut free) = (0, 0, 0);
            by_domain.clear();
            for (u, slot) in capacity.slots().iter().enumerate() {
                let serves = d.class == slot.class
                    && (d.selector.is_none() || matches(d, &node.units[u], node));
                if !(slot.sellable && serves) {
                    continue;
                }
                matching += 1;
                if !window.allowed[u] {
                    continue;
                }
                allowed += 1;
                if window.held[u].count > 0 {
                    continue;
                }
                free += 1;
                if let Some(domain) = slot.domain.map(|d| d as usize) {
                    if by_domain.len() <= domain {
                        by_domain.resize(domain + 1, 0);
                    }
                    by_domain[domain] += 1;
                }
            }
            let in_domain = by_domain.iter().copied().max().unwrap_or(0);
            let failed = if matching < want {
                Verdict::Unmatched
            } else if allowed < want {
                Verdict::Reserved
            } else if free < want {
                Verdict::Busy
            } else if r.request.nvlink_all(d) && in_domain < want {
                Verdict::Split
            } else {
                Verdict::Fit
            };
            worst = worst.min(failed);
        }
        worst
    }

    /// The same nodes with the bookings of `reservations` taken off: what a placement sees
    /// once they ended.
    pub fn without(&self, reservations: &[String]) -> Snapshot {
        let gone = |id: &String| reservations.contains(id);
        let nodes = (self.nodes.iter())
            .map(|held| {
                let holds = held.bookings.iter().any(|b| gone(&b.reservation_id))
                    || held.host.iter().any(|h| gone(&h.reservation_id));
                if !holds {
                    return held.clone();
                }
                Arc::new(NodeCapacity::new(
                    held.node.clone(),
                    (held.bookings.iter())
                        .filter(|b| !gone(&b.reservation_id))
                        .cloned()
                        .collect(),
                    (held.host.iter())
                        .filter(|h| !gone(&h.reservation_id))
                        .cloned()
                        .collect(),
                    held.claims.clone(),
                ))
            })
            .collect();
        Snapshot {
            nodes,
            scan: self.scan.clone(),
            smallest_share: self.smallest_share,
            own: self.own.clone(),
            start: self.start,
            end: self.end,
            now: self.now,
        }
    }

    /// The nodes as a pool list, for a search over them.
    pub fn pool_list(&self) -> PoolList {
        PoolList {
            nodes: self.nodes.clone(),
            scan: self.scan.clone(),
            smallest_share: self.smallest_share,
        }
    }
}

/// Where no unit of `capacity` could take `r` over `[start, end)`, as told without reading
/// its unit bookings: it has no node reservations, `r` (with [`reservation_hash`]
/// `own_hash`, `None` where it holds nothing anywhere) holds nothing there and asks for
/// devices, and every sellable unit is held at some time in the window. Answers until when
/// all of them are ([`NodeCapacity::full_until`]).
///
/// [`reservation_hash`]: crate::capacity::reservation_hash
pub(super) fn held_until(
    capacity: &NodeCapacity,
    r: &Reservation,
    own_hash: Option<u64>,
    (start, end): (i64, i64),
) -> Option<i64> {
    let glance = capacity.claims.is_empty()
        && own_hash.is_none_or(|hash| !capacity.may_hold(hash))
        && r.request.devices.iter().any(|d| d.count > 0);
    glance.then(|| capacity.full_until(start, end)).flatten()
}

/// Whether `unit` of `node` satisfies a device entry: its class, and the selector's model,
/// memory and labels (each pair the unit's label, or the node's when the unit lacks the key).
fn matches(device: &DeviceRequest, unit: &Unit, node: &Node) -> bool {
    device.class == unit.device_class
        && device.selector.as_ref().is_none_or(|s| {
            s.model.as_ref().is_none_or(|m| *m == unit.model)
                && s.memory_gib.is_none_or(|min| unit.memory_gib >= min)
                && s.labels
                    .as_ref()
                    .is_none_or(|wanted| labels_match(wanted, &unit.labels, &node.labels))
        })
}

/// Marks in `usable` the units of a node, read over the window into `window`, that a
/// placement could take: sellable, open to the tenant, free (or, when `preempting`, held
/// by one spot booking alone) and asked for by some device entry. Answers how many.
fn usable_units(
    request: &CreateRequest,
    capacity: &NodeCapacity,
    window: &NodeWindow<'_>,
    preempting: bool,
    usable: &mut Vec<bool>,
) -> usize {
    let node = capacity.node.as_ref();
    usable.clear();
    for (u, slot) in capacity.slots().iter().enumerate() {
        let held = window.held[u];
        usable.push(
            slot.sellable
                && window.allowed[u]
                && (held.count == 0
                    || (preempting && held.count == 1 && held.first.is_some_and(|b| b.spot)))
                && request.devices.iter().any(|d| {
                    d.class == slot.class
                        && (d.selector.is_none() || matches(d, &node.units[u], node))
                }),
        );
    }
    usable.iter().filter(|ok| **ok).count()
}

/// Whether the `usable` units of a node could serve each device entry of `request` on
/// their own: enough of them match it and, for an entry that wants one NVLink domain, enough
/// in one domain. A node that cannot is not offered: no choice on it passes [`check_choice`].
/// `in_domain` is scratch space, reused across nodes.
fn serves_each_device(
    request: &CreateRequest,
    capacity: &NodeCapacity,
    usable: &[bool],
    in_domain: &mut Vec<usize>,
) -> bool {
    let node = capacity.node.as_ref();
    request.devices.iter().all(|d| {
        let want = d.count.max(0) as usize;
        let serving = (capacity.slots().iter().enumerate()).filter(|(u, slot)| {
            usable[*u]
                && d.class == slot.class
                && (d.selector.is_none() || matches(d, &node.units[*u], node))
        });
        if !request.nvlink_all(d) {
            return serving.count() >= want;
        }
        in_domain.clear();
        for (_, slot) in serving {
            if let Some(domain) = slot.domain.map(|d| d as usize) {
                if in_domain.len() <= domain {
                    in_domain.resize(domain + 1, 0);
                }
                in_domain[domain] += 1;
            }
        }
        in_domain.iter().any(|n| *n >= want)
    })
}

fn has_room(host: &crate::inventory::HostResources, used: HostBooking, want: HostBooking) -> bool {
    used.vcpu + want.vcpu <= host.vcpu
        && used.memory_gib + want.memory_gib <= host.memory_gib
        && used.hugepages_1gi + want.hugepages_1gi <= host.hugepages_1gi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::DeviceClass;

    #[test]
    fn selector_labels_match_the_units_label_or_else_its_nodes() {
        let labels = |pairs: &[(&str, &str)]| -> crate::inventory::Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let gpu = |unit_labels: &[(&str, &str)]| Unit {
            id: "g0".into(),
            class: crate::inventory::UnitClass::VfioGroup,
            device_class: DeviceClass::Gpu,
            model: "H100".into(),
            memory_gib: 80,
            nvlink_domain: None,
            sellable: true,
            labels: labels(unit_labels),
        };
        let host = crate::inventory::HostResources {
            vcpu: 8,
            memory_gib: 64,
            hugepages_1gi: 0,
        };
        let node = Node {
            labels: labels(&[("rack", "r1"), ("tier", "gold")]),
            ..Node::sample("n1", host, Vec::new())
        };
        let ask = |pairs: &[(&str, &str)]| DeviceRequest {
            class: DeviceClass::Gpu,
            count: 1,
            selector: Some(super::super::Selector {
                model: Some("H100".into()),
                memory_gib: None,
                labels: Some(labels(pairs)),
            }),
            topology: None,
            sharing: None,
        };
        let plain = gpu(&[]);
        let silver = gpu(&[("tier", "silver")]);
        assert!(matches(&ask(&[]), &plain, &node));
        assert!(
            matches(&ask(&[("tier", "gold")]), &plain, &node),
            "node fallback"
        );
        assert!(
            !matches(&ask(&[("tier", "gold")]), &silver, &node),
            "unit wins"
        );
        assert!(matches(
            &ask(&[("tier", "silver"), ("rack", "r1")]),
            &silver,
            &node
        ));
        assert!(!matches(&ask(&[("rack", "r2")]), &plain, &node));
        assert!(!matches(&ask(&[("zone", "a")]), &plain, &node));
        let mut other_model = ask(&[("tier", "gold")]);
        other_model.selector.as_mut().unwrap().model = Some("L4".into());
        assert!(
            !matches(&other_model, &plain, &node),
            "every criterion holds"
        );
    }

    #[test]
    fn what_a_glance_tells_of_a_node_is_what_reading_its_bookings_finds() {
        use super::super::availability::tests;
        use crate::capacity::{HostAmount, HostBooked};
        use crate::inventory::HostResources;
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        const HOUR: i64 = 3_600_000;
        let mut rng = StdRng::seed_from_u64(29);
        let holders = ["a", "b", "c"];
        let (mut glanced, mut read) = (0, 0);
        for case in 0..2_000 {
            let mut bookings = Vec::new();
            for unit in 0..8 {
                let mut at = rng.random_range(0..4);
                while at < 24 && rng.random_bool(0.9) {
                    let end = at + rng.random_range(1..12);
                    bookings.push(Booked {
                        unit_id: format!("n-g{unit}"),
                        reservation_id: holders[rng.random_range(0..3)].into(),
                        spot: false,
                        start_ms: at * HOUR,
                        end_ms: end * HOUR,
                    });
                    at = end + rng.random_range(0..2);
                }
            }
            let host = (0..rng.random_range(0..3))
                .map(|_| {
                    let start_ms = rng.random_range(0..24) * HOUR;
                    HostBooked {
                        reservation_id: holders[rng.random_range(0..3)].into(),
                        spot: false,
                        amount: HostAmount {
                            vcpu: rng.random_range(0..9),
                            memory_gib: 0,
                            hugepages_1gi: 0,
                        },
                        start_ms,
                        end_ms: start_ms + rng.random_range(1..6) * HOUR,
                    }
                })
                .collect();
            // The availability tests' node of 8 GPUs in two NVLink domains, with a host.
            let units = (tests::node("n", Vec::new()).node.units).clone();
            let resources = HostResources {
                vcpu: 16,
                memory_gib: 0,
                hugepages_1gi: 0,
            };
            let node = Arc::new(Node::sample("n", resources, units));
            let nodes = PoolList {
                nodes: std::iter::once(Arc::new(NodeCapacity::new(
                    node,
                    bookings,
                    host,
                    Vec::new(),
                )))
                .collect(),
                scan: Default::default(),
                smallest_share: None,
            };
            let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
            let mut r = tests::reservation(gpus, gpus <= 4);
            r.resources.vcpu = rng.random_range(0..9);
            if rng.random_bool(0.2) {
                r.binding = super::super::Binding::Node;
            }
            // The deciding reservation holds nothing, or some of what is booked.
            let own = [None, Some("a"), Some("z")][rng.random_range(0..3)];
            let start = rng.random_range(0..24) * HOUR;
            let snapshot =
                Snapshot::of(nodes, own, start, start + rng.random_range(1..6) * HOUR, 0);
            let mut window = NodeWindow::default();
            snapshot.read_window(0, &r, &mut window);
            let reading = snapshot.verdict(0, &r, &window, &mut Vec::new());
            match snapshot.at_a_glance(0, &r) {
                Some(verdict) => {
                    glanced += 1;
                    assert_eq!(verdict, reading, "case {case}");
                }
                None => read += 1,
            }
        }
        assert!(
            glanced > 100 && read > 1_000,
            "{glanced} at a glance, {read} read"
        );
    }
}
