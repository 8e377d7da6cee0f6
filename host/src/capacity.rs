//! The capacity view: what each node offers and what holds it, in memory, per replica.
//!
//! A decision (placement, preemption, a gang, a pending retry) reads its pool's nodes from
//! here instead of the database: each pool's member list, and each node's inventory (units
//! with class, model, memory, NVLink domain, labels; host resources; lost or not), every
//! active booking of its units (with spot or not and the reservation), its active host
//! bookings, and the node reservations that claim its units. A pool's nodes are assembled
//! into one shared list once and patched where a node changes ([`View::pool`]), so reading
//! an unchanged pool costs nothing per node; the pool's per-GPU share of host resources is
//! kept with it and worked out again only when a node's share changes. The catalog reads a
//! page of nodes from here ([`View::nodes`]).
//!
//! # How it stays current
//!
//! Triggers in the database record every change to those rows by node, and every change
//! of a pool's member list by pool (migrations `0011_capacity_changes` and
//! `0012_reservation_position`), in the writing transaction, so a change that rolls back is
//! never announced:
//!
//! - On **SQLite** (one process, one writer) they append the node's id (or the pool's) to
//!   `capacity_changes`; before each read the view takes the rows past its cursor, in
//!   commit order, and loads those nodes (or member lists) again. As every write
//!   transaction is this process's ([`crate::store::Store::begin`]), the rows are read only
//!   when it has committed one since the last read ([`crate::store::Commits`]): a decision
//!   made right after another's commit was laid on reads no table at all.
//! - On **PostgreSQL** they `NOTIFY orl_capacity` with the node's id (`orl_pools` with the
//!   pool's), delivered at commit to every replica's listener (this one's own commits
//!   included), which marks the node stale; the next read loads it again. While the listener is down (at start, after a
//!   dropped connection) every node is treated as stale, so a missed notification can never
//!   leave the view behind for good.
//!
//! This replica's own placements and releases are laid onto the view as they commit
//! ([`View::apply`]): the bookings written (or ended) are added to (or taken off) the node as
//! held, so the next decision need not load it again. An edit is laid only onto the node as
//! it was before the transaction committed (its generation, [`View::generations`]); a node
//! loaded or changed meanwhile is loaded again instead. On SQLite the transaction's own
//! `capacity_changes` rows are then passed over for the nodes edited (they follow the
//! position read in the transaction, [`View::since`], and nothing else writes until the
//! edit is laid on); on PostgreSQL announcements carry the writing transaction's id
//! (migration `0013_capacity_writer`), and those of a transaction laid on are passed over
//! for the nodes edited, whether they arrive before the edit or after it.
//!
//! A node reservation's change and an inventory change have this replica forget the node
//! as they commit ([`View::forget`]), so the replica that wrote reads its own write at
//! once, without waiting for the announcement.
//!
//! Nodes are loaded on first use and then kept. Nothing about correctness depends on the
//! view being fresh: the database still refuses every overlapping booking, placements
//! re-read node-reservation rights under a lock before they write, and a decision that
//! lost to a commit the view had not seen yet marks the nodes it chose stale and decides
//! again.
//!
//! This module imports nothing from the booking engine, the reconciler or the surfaces.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use smallvec::SmallVec;
use sqlx::{AnyConnection, AnyPool, Row as _};

use crate::Result;
use crate::inventory::nodes::{self, Node};
use crate::node_reservations::queries::{self, Record};
use crate::pools::{self, PerGpu};
use crate::store::{Backend, Commits, Store, flag, placeholders};

/// The channel PostgreSQL announces capacity changes on, by node.
const CHANNEL: &str = "orl_capacity";
/// The channel PostgreSQL announces changes of pools' member lists on, by pool.
const POOLS_CHANNEL: &str = "orl_pools";

/// How many nodes one load asks the database for at once (bind parameters per query).
const LOAD_BATCH: usize = 500;

/// One node as the view holds it, with the positions a decision looks things up by
/// worked out once, when it is loaded. Laid out in the order written, what a pass over a
/// pool's nodes reads of each first, so that it touches few cache lines a node.
#[derive(Debug, Clone)]
#[repr(C)]
pub struct NodeCapacity {
    /// What a decision can tell at a glance, without reading the bookings.
    glance: Glance,
    /// Marked lost and not reported since: it takes no placements.
    lost: bool,
    /// [`NodeCapacity::shape`], worked out when first asked.
    shape: std::sync::OnceLock<Option<u64>>,
    /// Node reservations on it that are not cancelled.
    pub claims: Vec<Record>,
    /// Active host bookings (CPU, memory, hugepages) on it.
    pub host: Vec<HostBooked>,
    /// [`reservation_hash`] of each host booking's reservation, in the order of `host`.
    host_reservations: Vec<u64>,
    pub node: Arc<Node>,
    /// Active bookings of its units, by unit then start.
    pub bookings: Vec<Booked>,
    /// Each booking of a unit the node still reports, as a decision reads it.
    spans: Vec<Span>,
    /// Each unit as a decision reads it, in the order of `node.units`.
    slots: Vec<Slot>,
    /// The positions in `node.units` of the units each claim holds.
    claim_units: Vec<Vec<usize>>,
    /// The node's distinct unit models, in order of first appearance.
    models: Vec<String>,
    /// How many whole GPUs the node has.
    gpus: i64,
}

/// What a decision can tell about a node without reading its unit bookings: when it is
/// full, who may hold it and whether spot work holds any of it. Worked
/// out when the node is loaded (or changed), kept inline so that a pass over a pool whose
/// nodes are full touches one record a node.
#[derive(Debug, Clone)]
#[repr(C)]
struct Glance {
    /// The intervals (start, end) over which every sellable unit is held, sorted and
    /// disjoint; empty for a node without a sellable unit. The first is kept inline, so
    /// that a pass over a pool of full nodes reads no other allocation.
    full: SmallVec<[(i64, i64); 1]>,
    /// A 128-bit filter of the [`reservation_hash`]es of the reservations holding units or
    /// host resources: a reservation whose bit is not set holds nothing here.
    holders: [u64; 2],
    /// Whether any spot booking holds a unit.
    spot: bool,
    /// Every host booking added up: no window has more booked.
    host_booked: HostAmount,
}

impl Glance {
    fn of(
        slots: &[Slot],
        spans: &[Span],
        host: &[HostBooked],
        hashes: &[u64],
        spot: bool,
    ) -> Glance {
        let mut holders = [0u64; 2];
        for hash in spans
            .iter()
            .map(|s| s.reservation)
            .chain(hashes.iter().copied())
        {
            let (word, bit) = Glance::holder_bit(hash);
            holders[word] |= bit;
        }
        let host_booked = host.iter().map(|h| h.amount).sum();
        Glance {
            full: full_intervals(slots, spans).into(),
            holders,
            spot,
            host_booked,
        }
    }

    /// Where [`Glance::holders`] keeps the reservation with hash `hash`: a word and a bit.
    fn holder_bit(hash: u64) -> (usize, u64) {
        ((hash >> 6 & 1) as usize, 1 << (hash & 63))
    }
}

/// The intervals over which every sellable unit of `slots` is held by one of `spans`:
/// each unit's bookings merged, then intersected across the units.
fn full_intervals(slots: &[Slot], spans: &[Span]) -> Vec<(i64, i64)> {
    let mut by_unit: Vec<Vec<(i64, i64)>> = vec![Vec::new(); slots.len()];
    for span in spans {
        by_unit[span.unit as usize].push((span.start_ms, span.end_ms));
    }
    let mut full: Option<Vec<(i64, i64)>> = None;
    for (held, _) in by_unit.iter_mut().zip(slots).filter(|(_, s)| s.sellable) {
        held.sort_unstable();
        let mut covered: Vec<(i64, i64)> = Vec::with_capacity(held.len());
        for &(start, end) in held.iter().filter(|(s, e)| s < e) {
            match covered.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => covered.push((start, end)),
            }
        }
        let both = match full.take() {
            None => covered,
            Some(so_far) => intersect(&so_far, &covered),
        };
        if both.is_empty() {
            return both;
        }
        full = Some(both);
    }
    full.unwrap_or_default()
}

/// The intervals in both of two sorted lists of disjoint intervals.
fn intersect(a: &[(i64, i64)], b: &[(i64, i64)]) -> Vec<(i64, i64)> {
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() && j < b.len() {
        let (start, end) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if start < end {
            out.push((start, end));
        }
        if a[i].1 < b[j].1 { i += 1 } else { j += 1 }
    }
    out
}

impl NodeCapacity {
    pub fn new(
        node: Arc<Node>,
        bookings: Vec<Booked>,
        host: Vec<HostBooked>,
        claims: Vec<Record>,
    ) -> NodeCapacity {
        let position: HashMap<&str, usize, foldhash::fast::FixedState> = node
            .units
            .iter()
            .enumerate()
            .map(|(i, u)| (u.id.as_str(), i))
            .collect();
        let spans: Vec<Span> = bookings
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                Some(Span {
                    unit: *position.get(b.unit_id.as_str())? as u32,
                    booking: i as u32,
                    reservation: reservation_hash(&b.reservation_id),
                    start_ms: b.start_ms,
                    end_ms: b.end_ms,
                })
            })
            .collect();
        let host_reservations: Vec<u64> = (host.iter())
            .map(|h| reservation_hash(&h.reservation_id))
            .collect();
        let claim_units = claims
            .iter()
            .map(|c| {
                c.unit_ids
                    .iter()
                    .filter_map(|id| position.get(id.as_str()).copied())
                    .collect()
            })
            .collect();
        let mut domains: Vec<&str> = Vec::new();
        let mut models: Vec<String> = Vec::new();
        let slots: Vec<Slot> = node
            .units
            .iter()
            .map(|u| Slot {
                sellable: u.sellable,
                class: u.device_class,
                model: match models.iter().position(|m| *m == u.model) {
                    Some(i) => i as u32,
                    None => {
                        models.push(u.model.clone());
                        (models.len() - 1) as u32
                    }
                },
                domain: u.nvlink_domain.as_deref().map(|d| {
                    match domains.iter().position(|n| *n == d) {
                        Some(i) => i as u32,
                        None => {
                            domains.push(d);
                            (domains.len() - 1) as u32
                        }
                    }
                }),
                memory_gib: u.memory_gib.clamp(0, i64::from(u32::MAX)) as u32,
            })
            .collect();
        let gpus = node
            .units
            .iter()
            .filter(|u| u.device_class == crate::inventory::DeviceClass::Gpu)
            .count() as i64;
        drop(position);
        NodeCapacity {
            glance: Glance::of(
                &slots,
                &spans,
                &host,
                &host_reservations,
                bookings.iter().any(|b| b.spot),
            ),
            bookings,
            host,
            claims,
            spans,
            host_reservations,
            slots,
            claim_units,
            models,
            gpus,
            lost: node.is_lost(),
            shape: std::sync::OnceLock::new(),
            node,
        }
    }

    /// What decides whether the node could take a request once nothing holds it, hashed:
    /// its units as a placement reads them (class, model, memory, NVLink grouping, sellable,
    /// labels; not their ids), its labels and its host resources. Nodes of one shape answer
    /// alike. `None` for a node with node reservations, whose rights are its own.
    pub fn shape(&self) -> Option<u64> {
        *self.shape.get_or_init(|| {
            use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
            if !self.claims.is_empty() {
                return None;
            }
            let mut hasher = foldhash::fast::FixedState::with_seed(0).build_hasher();
            let n = &self.node;
            (n.host.vcpu, n.host.memory_gib, n.host.hugepages_1gi).hash(&mut hasher);
            n.labels.hash(&mut hasher);
            self.models.hash(&mut hasher);
            for (slot, unit) in self.slots.iter().zip(&n.units) {
                let place = (slot.sellable, slot.class, slot.model, slot.domain);
                (place, slot.memory_gib, &unit.labels).hash(&mut hasher);
            }
            Some(hasher.finish())
        })
    }

    /// Marked lost and not reported since: it takes no placements.
    pub fn is_lost(&self) -> bool {
        self.lost
    }

    /// Where every sellable unit of the node is held at some time in `[start, end)` (so no
    /// unit is free over that window): until when all of them are, from the first such
    /// time in it. No window overlapping `[start, end)` that starts before then is free on
    /// any unit either. Counts the bookings of every reservation [`NodeCapacity::may_hold`]
    /// names.
    pub fn full_until(&self, start: i64, end: i64) -> Option<i64> {
        (self.glance.full.iter())
            .find(|(s, e)| *s < end && *e > start)
            .map(|(_, e)| *e)
    }

    /// Whether the reservation with [`reservation_hash`] `hash` may hold units or host
    /// resources here; `false` only when it holds none.
    pub fn may_hold(&self, hash: u64) -> bool {
        let (word, bit) = Glance::holder_bit(hash);
        self.glance.holders[word] & bit != 0
    }

    /// Every host booking on the node added up: no window has more booked.
    pub fn host_booked_at_most(&self) -> HostAmount {
        self.glance.host_booked
    }

    /// Whether any spot booking holds a unit of the node.
    pub fn holds_spot(&self) -> bool {
        self.glance.spot
    }

    /// The node's distinct unit models, in order of first appearance.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// Each booking of a unit the node still reports, as a decision reads it.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Each host booking with [`reservation_hash`] of its reservation.
    pub fn host_spans(&self) -> impl Iterator<Item = (&HostBooked, u64)> {
        self.host.iter().zip(self.host_reservations.iter().copied())
    }

    /// Each unit as a decision reads it, in the order of `node.units`.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Each claim with the positions of the units it holds.
    pub fn claims_by_unit(&self) -> impl Iterator<Item = (&Record, &[usize])> {
        self.claims
            .iter()
            .zip(&self.claim_units)
            .map(|(c, u)| (c, u.as_slice()))
    }

    /// The per-GPU share of host resources the node gives, `None` while it is lost
    /// ([`pools::host_share`]).
    pub fn share(&self) -> Option<PerGpu> {
        if self.lost {
            return None;
        }
        let host = &self.node.host;
        pools::host_share(host.vcpu, host.memory_gib, self.gpus)
    }

    /// How many whole GPUs the node has.
    pub fn gpus(&self) -> i64 {
        self.gpus
    }

    /// Whether `other` offers and holds the same: everything but the node's report times,
    /// which change without changing capacity.
    fn same_capacity(&self, other: &NodeCapacity) -> bool {
        let timeless = |n: &Node| Node {
            last_seen_at: String::new(),
            updated_at: String::new(),
            ..n.clone()
        };
        fn sorted<T: Clone + Ord>(items: &[T]) -> Vec<T> {
            let mut items = items.to_vec();
            items.sort();
            items
        }
        timeless(&self.node) == timeless(&other.node)
            && sorted(&self.bookings) == sorted(&other.bookings)
            && sorted(&self.host) == sorted(&other.host)
            && self.claims == other.claims
    }

    /// This node with `change` laid on: what the database holds once the transaction that
    /// made it committed.
    fn with_change(&self, change: &Change) -> NodeCapacity {
        let mut bookings = self.bookings.clone();
        let mut host = self.host.clone();
        match change {
            Change::Booked { .. } => change.lay_on(&mut bookings, &mut host),
            Change::Ended { reservation_id } => {
                bookings.retain(|b| b.reservation_id != *reservation_id);
                host.retain(|h| h.reservation_id != *reservation_id);
            }
        }
        bookings.sort_by(|a, b| {
            (&a.unit_id, a.start_ms, &a.reservation_id).cmp(&(
                &b.unit_id,
                b.start_ms,
                &b.reservation_id,
            ))
        });
        host.sort_by(|a, b| (a.start_ms, &a.reservation_id).cmp(&(b.start_ms, &b.reservation_id)));
        NodeCapacity::new(self.node.clone(), bookings, host, self.claims.clone())
    }

    /// How many sellable units no active booking holds at any time in `[start, end)`: an
    /// upper bound of what a request over that window could get here.
    pub fn free_units(&self, start: i64, end: i64) -> usize {
        let mut busy = vec![false; self.node.units.len()];
        for b in &self.spans {
            busy[b.unit as usize] |= b.start_ms < end && b.end_ms > start;
        }
        self.node
            .units
            .iter()
            .zip(busy)
            .filter(|(u, busy)| u.sellable && !busy)
            .count()
    }
}

/// What holds a unit now, as the `orl_units` gauge counts it
/// ([`NodeCapacity::unit_states`]). A unit takes the first of these that applies, so it
/// counts in exactly one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum UnitState {
    /// Its node is marked lost (whatever held the unit before).
    Lost,
    /// An active booking holds it now (spot work on a released unit included).
    Booked,
    /// A node reservation in its term holds it and has not released it (a needs-review
    /// reservation holds every unit it names: it lets no one place).
    Reserved,
    /// A node reservation in its term holds it and released it to the spot market.
    Released,
    /// Nothing holds it now.
    Free,
}

impl UnitState {
    pub const ALL: [UnitState; 5] = [
        UnitState::Lost,
        UnitState::Booked,
        UnitState::Reserved,
        UnitState::Released,
        UnitState::Free,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            UnitState::Lost => "lost",
            UnitState::Booked => "booked",
            UnitState::Reserved => "reserved",
            UnitState::Released => "released",
            UnitState::Free => "free",
        }
    }
}

impl NodeCapacity {
    /// Calls `each` with every sellable unit of the node (as its [`Slot`]) and what holds
    /// it at `now` ([`UnitState`]): one pass over the node's claims, bookings and units.
    /// `scratch` is reused from one node to the next, so a pass over many nodes allocates
    /// nothing per unit.
    pub fn unit_states(
        &self,
        now: i64,
        scratch: &mut Vec<UnitState>,
        mut each: impl FnMut(&Slot, UnitState),
    ) {
        use crate::node_reservations::{Lifecycle, Status};
        scratch.clear();
        if self.lost {
            scratch.resize(self.slots.len(), UnitState::Lost);
        } else {
            scratch.resize(self.slots.len(), UnitState::Free);
            for (claim, units) in self.claims_by_unit() {
                if claim.lifecycle == Lifecycle::Cancelled || !claim.term.contains(now) {
                    continue;
                }
                let active = claim.status(now) == Status::Active;
                for &u in units {
                    let released = active
                        && claim
                            .released_unit_ids
                            .iter()
                            .any(|id| *id == self.node.units[u].id);
                    // Released only while every claim on the unit released it.
                    scratch[u] = match scratch[u] {
                        UnitState::Reserved => UnitState::Reserved,
                        _ if released => UnitState::Released,
                        _ => UnitState::Reserved,
                    };
                }
            }
            for span in &self.spans {
                if span.start_ms <= now && now < span.end_ms {
                    scratch[span.unit as usize] = UnitState::Booked;
                }
            }
        }
        for (slot, state) in self.slots.iter().zip(scratch.iter()) {
            if slot.sellable {
                each(slot, *state);
            }
        }
    }
}

/// What a decision reads of one unit, packed so that a pass over a pool's units stays in
/// cache.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub sellable: bool,
    pub class: crate::inventory::DeviceClass,
    /// The unit's model, as an index into [`NodeCapacity::models`].
    pub model: u32,
    /// The unit's NVLink domain, numbered within the node in order of first appearance.
    pub domain: Option<u32>,
    pub memory_gib: u32,
}

/// One booking of a unit, as a decision reads it.
#[derive(Clone, Copy, Debug)]
pub struct Span {
    /// The unit's position in `node.units`.
    pub unit: u32,
    /// The booking's position in [`NodeCapacity::bookings`].
    pub booking: u32,
    /// [`reservation_hash`] of the booking's reservation.
    pub reservation: u64,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// A hash of a reservation id, compared before the id itself.
pub fn reservation_hash(id: &str) -> u64 {
    use std::hash::BuildHasher as _;
    foldhash::fast::FixedState::with_seed(0).hash_one(id)
}

/// An active booking of one unit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Booked {
    pub unit_id: String,
    pub reservation_id: String,
    pub spot: bool,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// Host resources: CPUs, GiB of memory, 1 GiB hugepages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostAmount {
    pub vcpu: i64,
    pub memory_gib: i64,
    pub hugepages_1gi: i64,
}

impl std::ops::Add for HostAmount {
    type Output = HostAmount;
    fn add(self, other: HostAmount) -> HostAmount {
        HostAmount {
            vcpu: self.vcpu + other.vcpu,
            memory_gib: self.memory_gib + other.memory_gib,
            hugepages_1gi: self.hugepages_1gi + other.hugepages_1gi,
        }
    }
}

impl std::iter::Sum for HostAmount {
    fn sum<I: Iterator<Item = HostAmount>>(amounts: I) -> HostAmount {
        amounts.fold(HostAmount::default(), std::ops::Add::add)
    }
}

/// An active booking of host resources.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostBooked {
    pub reservation_id: String,
    pub spot: bool,
    pub amount: HostAmount,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// Which nodes and pools changed since the view last looked.
enum Feed {
    /// SQLite: the `capacity_changes` rows past `cursor`. They are read only when this
    /// process (the one writer) has committed since the last read (`seen`, its count of
    /// commits then).
    Table {
        cursor: Option<i64>,
        commits: Commits,
        seen: u64,
    },
    /// PostgreSQL: what the listener heard.
    Notify(Arc<SyncMutex<Heard>>),
}

#[derive(Default)]
struct Heard {
    /// Whether the listener is connected; until it is, everything is stale.
    listening: bool,
    /// Set when the listener (re)connects: everything loaded before may have missed news.
    reset: bool,
    changes: Changes,
}

/// What changed: nodes' capacity, and pools' member lists.
#[derive(Default)]
struct Changes {
    nodes: HashSet<String>,
    pools: HashSet<String>,
    /// PostgreSQL: nodes announced with the transaction that changed them.
    written: HashSet<(String, i64)>,
}

/// How many nodes a chunk of [`Nodes`] holds.
const CHUNK: usize = 64;

/// A pool's nodes in order, shared by the decisions reading them, and held in chunks: a
/// change to one node while decisions still hold the list copies its chunk and the list of
/// chunks (about 150 pointers at 5,000 nodes) instead of the whole list. Every decision
/// assumes units on the view and every commit lays its changes on, so a busy pool's list is
/// changed while held several times a create.
#[derive(Clone, Default)]
pub struct Nodes {
    chunks: Arc<Vec<Arc<Vec<Arc<NodeCapacity>>>>>,
    len: usize,
}

impl Nodes {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> NodesIter<'_> {
        fn chunk(nodes: &Arc<Vec<Arc<NodeCapacity>>>) -> std::slice::Iter<'_, Arc<NodeCapacity>> {
            nodes.iter()
        }
        self.chunks.iter().flat_map(chunk)
    }

    /// Replaces node `i`, copying what others still hold of its chunk.
    fn set(&mut self, i: usize, node: Arc<NodeCapacity>) {
        let chunk = &mut Arc::make_mut(&mut self.chunks)[i / CHUNK];
        Arc::make_mut(chunk)[i % CHUNK] = node;
    }
}

impl std::ops::Index<usize> for Nodes {
    type Output = Arc<NodeCapacity>;

    fn index(&self, i: usize) -> &Arc<NodeCapacity> {
        &self.chunks[i / CHUNK][i % CHUNK]
    }
}

/// [`Nodes::iter`].
pub type NodesIter<'a> = std::iter::FlatMap<
    std::slice::Iter<'a, Arc<Vec<Arc<NodeCapacity>>>>,
    std::slice::Iter<'a, Arc<NodeCapacity>>,
    fn(&'a Arc<Vec<Arc<NodeCapacity>>>) -> std::slice::Iter<'a, Arc<NodeCapacity>>,
>;

impl<'a> IntoIterator for &'a Nodes {
    type Item = &'a Arc<NodeCapacity>;
    type IntoIter = NodesIter<'a>;

    fn into_iter(self) -> NodesIter<'a> {
        self.iter()
    }
}

impl FromIterator<Arc<NodeCapacity>> for Nodes {
    fn from_iter<I: IntoIterator<Item = Arc<NodeCapacity>>>(nodes: I) -> Nodes {
        let mut chunks = Vec::new();
        let mut len = 0;
        let mut nodes = nodes.into_iter().peekable();
        while nodes.peek().is_some() {
            let chunk: Vec<Arc<NodeCapacity>> = nodes.by_ref().take(CHUNK).collect();
            len += chunk.len();
            chunks.push(Arc::new(chunk));
        }
        Nodes {
            chunks: Arc::new(chunks),
            len,
        }
    }
}

/// The nodes of one pool, in the order of its member list (by node id).
struct PoolNodes {
    ids: Vec<String>,
    /// The member nodes that exist, in the order of `ids`; shared with the decisions
    /// reading them.
    nodes: Nodes,
    /// Each member's position in `nodes`.
    positions: HashMap<String, usize, foldhash::fast::RandomState>,
    /// Members that changed since `nodes` was assembled.
    stale: HashSet<String>,
    /// Where the next decision that reads only part of the pool starts reading.
    scan: Arc<AtomicUsize>,
    /// The smallest per-GPU share of host resources its nodes give, once worked out; taken
    /// back whenever a node's share changes.
    smallest_share: Option<Option<PerGpu>>,
}

/// A pool's member nodes as the view holds them ([`View::pool`]).
pub struct PoolList {
    /// The member nodes that exist, in the order of the member list (by node id).
    pub nodes: Nodes,
    /// Where the next decision that reads only part of the pool starts reading (a
    /// position in `nodes`), so that such decisions take the pool's nodes in turn.
    pub scan: Arc<AtomicUsize>,
    /// The smallest per-GPU share of host resources any of its GPU hosts that is not lost
    /// gives ([`pools::host_share`]).
    pub smallest_share: Option<PerGpu>,
}

/// One node as the view holds it.
struct Held {
    /// What the database holds, as loaded, with this replica's own commits since laid on.
    base: Arc<NodeCapacity>,
    /// What decisions read: `base` with the bookings decisions assumed laid over.
    shown: Arc<NodeCapacity>,
    /// Changes whenever `base` is replaced, so that a commit is laid only onto the base it
    /// was made against ([`View::apply`]).
    generation: u64,
}

struct State {
    nodes: HashMap<String, Held, foldhash::fast::RandomState>,
    pools: HashMap<String, PoolNodes, foldhash::fast::RandomState>,
    /// Bookings decisions assumed and have not written yet, by node: laid over what the
    /// database holds whenever the node is loaded.
    assumed: HashMap<String, Vec<Change>, foldhash::fast::RandomState>,
    feed: Feed,
    /// The last generation handed out.
    generation: u64,
    /// PostgreSQL: this replica's transactions whose changes were laid onto the view, with
    /// the nodes laid on and when; their announcements for those nodes are passed over.
    laid_on: HashMap<i64, (std::time::Instant, HashSet<String>), foldhash::fast::RandomState>,
}

/// How long announcements of a transaction laid onto the view are passed over: far longer
/// than one takes to arrive.
const LAID_ON_FOR: Duration = Duration::from_secs(30);

/// A change this replica's transaction made on one node, laid onto the view when it
/// commits ([`View::apply`]).
#[derive(Debug, Clone)]
pub struct Edit {
    pub node_id: String,
    /// The node's generation in the view, read before the transaction committed
    /// ([`View::generations`]).
    pub generation: u64,
    pub change: Change,
}

/// What a transaction changed on a node (or a decision assumed it will).
#[derive(Debug, Clone)]
pub enum Change {
    /// Booked units (and host resources) for a reservation.
    Booked {
        reservation_id: String,
        bookings: Vec<Booked>,
        host: Option<HostBooked>,
    },
    /// Ended every active booking of a reservation.
    Ended { reservation_id: String },
}

impl Change {
    /// `reservation_id` booking `units` over `[start_ms, end_ms)`, with host resources
    /// (none when all are 0).
    pub fn booked(
        reservation_id: &str,
        spot: bool,
        (start_ms, end_ms): (i64, i64),
        units: &[String],
        host: HostAmount,
    ) -> Change {
        Change::Booked {
            reservation_id: reservation_id.to_string(),
            bookings: units
                .iter()
                .map(|unit_id| Booked {
                    unit_id: unit_id.clone(),
                    reservation_id: reservation_id.to_string(),
                    spot,
                    start_ms,
                    end_ms,
                })
                .collect(),
            host: (host != HostAmount::default()).then(|| HostBooked {
                reservation_id: reservation_id.to_string(),
                spot,
                amount: host,
                start_ms,
                end_ms,
            }),
        }
    }

    fn reservation_id(&self) -> &str {
        match self {
            Change::Booked { reservation_id, .. } | Change::Ended { reservation_id } => {
                reservation_id
            }
        }
    }

    /// Adds booked units and host resources to `bookings` and `host`, unless they hold
    /// the reservation's bookings already (once written, they are in what was loaded).
    fn lay_on(&self, bookings: &mut Vec<Booked>, host: &mut Vec<HostBooked>) {
        if let Change::Booked {
            reservation_id,
            bookings: booked,
            host: host_booked,
        } = self
            && !bookings.iter().any(|b| b.reservation_id == *reservation_id)
        {
            bookings.extend(booked.iter().cloned());
            host.extend(host_booked.iter().cloned());
        }
    }
}

/// How a transaction's own entries in the change feed are told apart ([`View::since`]).
#[derive(Debug, Clone, Copy)]
pub enum Since {
    /// SQLite: the last `capacity_changes` row before the transaction wrote, and the last
    /// one after it wrote, when it read that too ([`Since::until`]).
    Rows { after: i64, until: Option<i64> },
    /// PostgreSQL: the transaction's id, which its announcements carry.
    Transaction(i64),
}

impl Since {
    /// What a transaction whose changes came in parts, `self` first and `later` last (the
    /// members of a group commit), lays on: from the first part's start to the last one's
    /// end.
    pub fn through(self, later: Since) -> Since {
        match (self, later) {
            (Since::Rows { after, .. }, Since::Rows { until, .. }) => Since::Rows { after, until },
            _ => later,
        }
    }

    /// With the position of the change feed read again in the transaction after its last
    /// change to capacity (the same [`View::since_sql`]), for a transaction whose every
    /// change to capacity is laid onto the view: on SQLite every row up to it is then
    /// known to be the transaction's, for nodes laid on, and [`View::apply`] need not read
    /// them.
    pub fn until(self, value: i64) -> Since {
        match self {
            Since::Rows { after, .. } => Since::Rows {
                after,
                until: Some(value),
            },
            Since::Transaction(_) => self,
        }
    }
}

/// A transaction's own rows in the SQLite change feed: those past `after` (up to `until`,
/// when known), for the `nodes` whose changes were laid onto the view.
#[derive(Clone, Copy)]
struct Own<'a> {
    after: i64,
    until: Option<i64>,
    nodes: &'a HashSet<String>,
}

/// Bookings a decision is about to write ([`View::assume`]).
pub struct Assumption<'a> {
    pub reservation_id: &'a str,
    pub spot: bool,
    pub start_ms: i64,
    pub end_ms: i64,
    /// Each node with the units booked there.
    pub members: &'a [(&'a str, &'a [String])],
    /// The host resources booked on each node.
    pub host: HostAmount,
}

/// Assumed bookings held in the view; dropping it ends them, and the view shows their
/// nodes as held (with the written bookings once laid on, or without after a rollback).
pub struct Assumed {
    reservation_id: String,
    nodes: Vec<String>,
    done: Arc<SyncMutex<Vec<Ended>>>,
}

/// Assumptions that ended: the reservation and its nodes.
type Ended = (String, Vec<String>);

impl Drop for Assumed {
    fn drop(&mut self) {
        let ended = (
            std::mem::take(&mut self.reservation_id),
            std::mem::take(&mut self.nodes),
        );
        self.done
            .lock()
            .expect("capacity view assumptions")
            .push(ended);
    }
}

/// The capacity view of this replica.
pub struct View {
    state: tokio::sync::Mutex<State>,
    /// Assumptions that ended, taken out of the view at its next read.
    done: Arc<SyncMutex<Vec<Ended>>>,
    /// One turn at a time per pool for decisions that assume ([`View::turn`]).
    turns: SyncMutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Its own connections: a decision reads the view while its transaction holds one of
    /// the store's.
    reader: AnyPool,
    backend: Backend,
}

impl View {
    /// An empty view for `store`; on PostgreSQL it starts listening for changes at once.
    pub fn new(store: &Store) -> View {
        let feed = match store.backend() {
            Backend::Sqlite => Feed::Table {
                cursor: None,
                commits: store.commits(),
                seen: 0,
            },
            Backend::Postgres => {
                let heard = Arc::new(SyncMutex::new(Heard::default()));
                let url = store.pool().connect_options().database_url.to_string();
                tokio::spawn(listen(url, heard.clone()));
                Feed::Notify(heard)
            }
        };
        View {
            state: tokio::sync::Mutex::new(State {
                nodes: HashMap::default(),
                pools: HashMap::default(),
                assumed: HashMap::default(),
                feed,
                generation: 0,
                laid_on: HashMap::default(),
            }),
            done: Arc::default(),
            turns: SyncMutex::default(),
            reader: store.reader(2),
            backend: store.backend(),
        }
    }

    /// The nodes of `ids` that exist, current as of the changes announced so far, in the
    /// order asked. A node that changed is dropped and, like one never seen, loaded again,
    /// in batches.
    ///
    /// It reads on a connection of its own, never inside a caller's write transaction: the
    /// view holds only what is committed.
    pub async fn nodes(&self, ids: &[String]) -> Result<Vec<Arc<NodeCapacity>>> {
        let mut conn = self.reader.acquire().await?;
        let conn = &mut *conn;
        let mut state = self.state.lock().await;
        state.catch_up(conn, &self.done, None).await?;
        state.load_missing(conn, ids).await?;
        Ok(ids
            .iter()
            .filter_map(|id| state.nodes.get(id).map(|h| h.shown.clone()))
            .collect())
    }

    /// The member nodes of pool `pool_id` that exist, in the order of its member list
    /// (by node id), current as of the changes announced so far. The list is assembled
    /// once and then patched where nodes change, so a read of an unchanged pool costs the
    /// same at 20,000 nodes as at 500.
    pub async fn pool(&self, pool_id: &str) -> Result<PoolList> {
        let mut conn = self.reader.acquire().await?;
        let conn = &mut *conn;
        let mut state = self.state.lock().await;
        state.catch_up(conn, &self.done, None).await?;
        if !state.pools.contains_key(pool_id) {
            let ids: Vec<String> = sqlx::query_scalar(
                "SELECT node_id FROM pool_nodes WHERE pool_id = $1 ORDER BY node_id",
            )
            .bind(pool_id)
            .fetch_all(&mut *conn)
            .await?;
            state.pools.insert(
                pool_id.to_string(),
                PoolNodes {
                    stale: ids.iter().cloned().collect(),
                    ids,
                    nodes: Nodes::default(),
                    positions: HashMap::default(),
                    scan: Arc::default(),
                    smallest_share: None,
                },
            );
        }
        let stale: Vec<String> = state.pools[pool_id].stale.iter().cloned().collect();
        if !stale.is_empty() {
            state.load_missing(conn, &stale).await?;
            let State { nodes, pools, .. } = &mut *state;
            let pool = pools.get_mut(pool_id).expect("assembled above");
            let patchable = pool.positions.len() == pool.ids.len()
                && stale.iter().all(|id| nodes.contains_key(id));
            if patchable && !pool.positions.is_empty() {
                for id in &stale {
                    let i = pool.positions[id];
                    if pool.nodes[i].share() != nodes[id].shown.share() {
                        pool.smallest_share = None;
                    }
                    pool.nodes.set(i, nodes[id].shown.clone());
                }
            } else {
                // First assembly, or a member that no longer exists: assemble it whole.
                let held: Vec<Arc<NodeCapacity>> = pool
                    .ids
                    .iter()
                    .filter_map(|id| nodes.get(id).map(|h| h.shown.clone()))
                    .collect();
                pool.positions = held
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.node.id.clone(), i))
                    .collect();
                pool.nodes = held.into_iter().collect();
                pool.smallest_share = None;
            }
            pool.stale.clear();
        }
        let pool = state.pools.get_mut(pool_id).expect("assembled above");
        let smallest_share = *pool.smallest_share.get_or_insert_with(|| {
            pools::smallest_share(pool.nodes.iter().filter_map(|c| c.share()))
        });
        Ok(PoolList {
            nodes: pool.nodes.clone(),
            scan: pool.scan.clone(),
            smallest_share,
        })
    }

    /// Waits for pool `pool_id`'s turn to decide and assume: decisions of one pool on this
    /// replica take turns, so each sees what the one before it assumed and none decides on
    /// units another has just taken. Only the decision holds the turn, never a write.
    pub async fn turn(&self, pool_id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = self
            .turns
            .lock()
            .expect("capacity view turns")
            .entry(pool_id.to_string())
            .or_default()
            .clone();
        turn.lock_owned().await
    }

    /// Holds `assumption` in the view before its write commits, so that decisions made
    /// meanwhile place around it. `None` when a booking the view holds (committed, or
    /// assumed by another decision) already takes one of its units over its window: the
    /// decision was made on a view that has changed since, and should be made again.
    ///
    /// The assumed bookings last until the returned guard is dropped (after the write
    /// committed, and its bookings were laid onto the view, or rolled back); the view
    /// then shows the nodes as held, without them.
    pub async fn assume(&self, assumption: Assumption<'_>) -> Option<Assumed> {
        let mut state = self.state.lock().await;
        for (node_id, unit_ids) in assumption.members {
            let taken = state.nodes.get(*node_id).is_some_and(|held| {
                held.shown.bookings.iter().any(|b| {
                    b.start_ms < assumption.end_ms
                        && b.end_ms > assumption.start_ms
                        && b.reservation_id != assumption.reservation_id
                        && unit_ids.contains(&b.unit_id)
                })
            });
            if taken {
                return None;
            }
        }
        let mut nodes = Vec::with_capacity(assumption.members.len());
        for (node_id, unit_ids) in assumption.members {
            let held = Change::booked(
                assumption.reservation_id,
                assumption.spot,
                (assumption.start_ms, assumption.end_ms),
                unit_ids,
                assumption.host,
            );
            state
                .assumed
                .entry(node_id.to_string())
                .or_default()
                .push(held);
            state.show(node_id);
            nodes.push(node_id.to_string());
        }
        Some(Assumed {
            reservation_id: assumption.reservation_id.to_string(),
            nodes,
            done: self.done.clone(),
        })
    }

    /// Forgets `ids`: the next read loads them from the database. For nodes this replica
    /// just changed (so its next decision need not wait for the announcement), and after a
    /// decision lost to a commit the view had not heard of.
    pub async fn forget(&self, ids: &[String]) {
        self.state.lock().await.mark_nodes(ids.iter().cloned());
    }

    /// How a write transaction's own entries in the change feed will be told apart, read
    /// in it before it changes capacity: on SQLite the last `capacity_changes` row (every
    /// row after it, until the transaction commits, is its own, as it is the one writer);
    /// on PostgreSQL the transaction's id, which its announcements carry.
    pub async fn since(&self, conn: &mut AnyConnection) -> Result<Since> {
        let value = sqlx::query_scalar(&format!("SELECT CAST(({}) AS BIGINT)", self.since_sql()))
            .fetch_one(conn)
            .await?;
        Ok(self.since_of(value))
    }

    /// The scalar query [`View::since`] reads, for a transaction that reads it in a round
    /// trip it makes anyway (before it changes capacity), and [`View::since_of`] what it
    /// read.
    pub fn since_sql(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "SELECT COALESCE(MAX(seq), 0) FROM capacity_changes",
            Backend::Postgres => "SELECT txid_current()",
        }
    }

    pub fn since_of(&self, value: i64) -> Since {
        match self.backend {
            Backend::Sqlite => Since::Rows {
                after: value,
                until: None,
            },
            Backend::Postgres => Since::Transaction(value),
        }
    }

    /// The generations of `ids` in the view (0 for a node it does not hold), read before a
    /// transaction that changes them commits: what its [`Edit`]s are laid onto.
    pub async fn generations(&self, ids: &[String]) -> Vec<u64> {
        let state = self.state.lock().await;
        ids.iter()
            .map(|id| state.nodes.get(id).map_or(0, |h| h.generation))
            .collect()
    }

    /// Lays this replica's own committed `edits` onto the view, so the next decision need
    /// not load those nodes again. Called right after the commit, before any other write
    /// of this replica's can commit (on SQLite while still holding the writer's turn), with
    /// `since` read in the transaction. An edit is laid only onto the base it was made
    /// against (the generation it names); a node loaded or changed since is loaded again
    /// instead. The transaction's own entries in the change feed are then passed over for
    /// the nodes edited; every other entry is taken in as usual. If the feed cannot be read,
    /// the edited nodes are loaded again instead.
    pub async fn apply(&self, since: Since, edits: Vec<Edit>) {
        let conn = self.reader.acquire().await;
        let mut state = self.state.lock().await;
        let edited: HashSet<String> = edits.iter().map(|e| e.node_id.clone()).collect();
        let own = match since {
            Since::Rows { after, until } => Some(Own {
                after,
                until,
                nodes: &edited,
            }),
            Since::Transaction(tx) => {
                // Its announcements may arrive before or after this: both are passed over.
                let now = std::time::Instant::now();
                state
                    .laid_on
                    .retain(|_, (at, _)| now.duration_since(*at) < LAID_ON_FOR);
                state.laid_on.insert(tx, (now, edited.clone()));
                None
            }
        };
        let caught_up = match conn {
            Ok(mut conn) => state.catch_up(&mut conn, &self.done, own).await,
            Err(err) => Err(err.into()),
        };
        if let Err(err) = caught_up {
            tracing::warn!(error = %err, "capacity view: cannot read the change feed; loading the nodes again");
            state.mark_nodes(edited.into_iter());
            return;
        }
        for edit in edits {
            let Some(held) = state.nodes.get(&edit.node_id) else {
                continue;
            };
            if held.generation != edit.generation {
                state.mark_nodes(std::iter::once(edit.node_id));
                continue;
            }
            let base = held.base.with_change(&edit.change);
            state.set_base(Arc::new(base));
        }
    }

    /// Compares the view with the database for `ids`: the ids of nodes whose loaded state
    /// differs from what the database holds now (empty when the view is current).
    pub async fn differences(&self, ids: &[String]) -> Result<Vec<String>> {
        self.nodes(ids).await?;
        let held: Vec<Arc<NodeCapacity>> = {
            let state = self.state.lock().await;
            ids.iter()
                .filter_map(|id| state.nodes.get(id).map(|h| h.base.clone()))
                .collect()
        };
        let mut conn = self.reader.acquire().await?;
        let conn = &mut *conn;
        let mut fresh: HashMap<String, NodeCapacity> = HashMap::new();
        for node in load(conn, ids).await? {
            fresh.insert(node.node.id.clone(), node);
        }
        let mut differ: Vec<String> = held
            .iter()
            .filter(|n| !fresh.remove(&n.node.id).is_some_and(|f| f.same_capacity(n)))
            .map(|n| n.node.id.clone())
            .collect();
        differ.extend(fresh.into_keys());
        differ.sort();
        Ok(differ)
    }

    /// Drops `capacity_changes` rows the view has read (SQLite; nothing to do elsewhere).
    pub async fn prune(&self, store: &Store) -> Result<()> {
        let cursor = match &self.state.lock().await.feed {
            Feed::Table {
                cursor: Some(c), ..
            } => *c,
            _ => return Ok(()),
        };
        let mut tx = store.begin().await?;
        sqlx::query("DELETE FROM capacity_changes WHERE seq <= $1")
            .bind(cursor)
            .execute(&mut **tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

impl State {
    /// Takes in what changed since the last look: changed nodes are dropped (and marked
    /// stale in the pools holding them), pools whose member list changed are dropped.
    /// Ended assumptions are taken off the nodes they were laid on. With `own` (SQLite:
    /// where a transaction of this replica's began, and the nodes whose changes by it were
    /// laid on already), that transaction's rows for those nodes are passed over.
    async fn catch_up(
        &mut self,
        conn: &mut AnyConnection,
        done: &SyncMutex<Vec<Ended>>,
        own: Option<Own<'_>>,
    ) -> Result<()> {
        let ended = std::mem::take(&mut *done.lock().expect("capacity view assumptions"));
        for (reservation_id, nodes) in ended {
            for node in &nodes {
                if let Some(held) = self.assumed.get_mut(node) {
                    held.retain(|a| a.reservation_id() != reservation_id);
                    if held.is_empty() {
                        self.assumed.remove(node);
                    }
                }
                self.show(node);
            }
        }
        match self.take_changes(conn, own).await? {
            Some(changes) => {
                for pool in &changes.pools {
                    self.pools.remove(pool);
                }
                self.mark_nodes(changes.nodes.into_iter());
            }
            None => {
                self.nodes.clear();
                self.pools.clear();
            }
        }
        Ok(())
    }

    /// Holds `base` as what the database holds for its node, in a new generation.
    fn set_base(&mut self, base: Arc<NodeCapacity>) {
        self.generation += 1;
        let id = base.node.id.clone();
        self.nodes.insert(
            id.clone(),
            Held {
                shown: base.clone(),
                base,
                generation: self.generation,
            },
        );
        self.show(&id);
    }

    /// Works out again what decisions read of node `id` (its base with the assumptions
    /// on it), in the pools holding it too.
    fn show(&mut self, id: &str) {
        let Some(held) = self.nodes.get(id) else {
            return;
        };
        let shown = match self.assumed.contains_key(id) {
            true => Arc::new(self.with_assumed(&held.base)),
            false => held.base.clone(),
        };
        for pool in self.pools.values_mut() {
            if let Some(&i) = pool.positions.get(id)
                && !pool.stale.contains(id)
            {
                pool.nodes.set(i, shown.clone());
            }
        }
        if let Some(held) = self.nodes.get_mut(id) {
            held.shown = shown;
        }
    }

    /// Drops `ids` so the next read loads them again.
    fn mark_nodes(&mut self, ids: impl Iterator<Item = String>) {
        for id in ids {
            if self.nodes.remove(&id).is_some() {
                for pool in self.pools.values_mut() {
                    if pool.positions.contains_key(&id) {
                        pool.stale.insert(id.clone());
                    }
                }
            }
        }
    }

    /// Loads those of `ids` the view does not hold.
    async fn load_missing(&mut self, conn: &mut AnyConnection, ids: &[String]) -> Result<()> {
        let missing: Vec<String> = ids
            .iter()
            .filter(|id| !self.nodes.contains_key(*id))
            .cloned()
            .collect();
        if !missing.is_empty() {
            for node in load(conn, &missing).await? {
                self.set_base(Arc::new(node));
            }
        }
        Ok(())
    }

    /// `held` with the bookings decisions assumed on it laid over.
    fn with_assumed(&self, held: &NodeCapacity) -> NodeCapacity {
        let mut bookings = held.bookings.clone();
        let mut host = held.host.clone();
        for assumed in self.assumed.get(&held.node.id).into_iter().flatten() {
            assumed.lay_on(&mut bookings, &mut host);
        }
        NodeCapacity::new(held.node.clone(), bookings, host, held.claims.clone())
    }

    /// What changed since the last call; `None` when everything must be treated as changed.
    /// With `own`, the rows past its position for its nodes are passed over.
    async fn take_changes(
        &mut self,
        conn: &mut AnyConnection,
        own: Option<Own<'_>>,
    ) -> Result<Option<Changes>> {
        match &mut self.feed {
            Feed::Table {
                cursor: cursor @ None,
                commits,
                seen,
            } => {
                // The first look: nothing is loaded yet, so nothing is stale; what commits
                // from here on is past the cursor.
                *seen = commits.get();
                let last: i64 =
                    sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM capacity_changes")
                        .fetch_one(&mut *conn)
                        .await?;
                *cursor = Some(last);
                Ok(Some(Changes::default()))
            }
            Feed::Table {
                cursor: Some(cursor),
                commits,
                seen,
            } => {
                let count = commits.get();
                if count == *seen {
                    return Ok(Some(Changes::default()));
                }
                // Only the transaction being laid on committed since the last read, and
                // every row it wrote is known: they name the nodes laid on, so there is
                // nothing to read.
                if let Some(Own {
                    after,
                    until: Some(until),
                    ..
                }) = own
                    && count == *seen + 1
                    && after == *cursor
                {
                    *cursor = until;
                    *seen = count;
                    return Ok(Some(Changes::default()));
                }
                let rows = sqlx::query(
                    "SELECT seq, node_id, pool_id FROM capacity_changes WHERE seq > $1 ORDER BY seq",
                )
                .bind(*cursor)
                .fetch_all(&mut *conn)
                .await?;
                let mut changes = Changes::default();
                for row in &rows {
                    let seq: i64 = row.get("seq");
                    *cursor = seq;
                    match row.get::<Option<String>, _>("pool_id") {
                        Some(pool) => {
                            changes.pools.insert(pool);
                        }
                        None => {
                            let node: String = row.get("node_id");
                            let laid_on =
                                own.is_some_and(|o| seq > o.after && o.nodes.contains(&node));
                            if !laid_on {
                                changes.nodes.insert(node);
                            }
                        }
                    }
                }
                *seen = count;
                Ok(Some(changes))
            }
            Feed::Notify(heard) => {
                let mut heard = heard.lock().expect("capacity listener state");
                if !heard.listening || std::mem::take(&mut heard.reset) {
                    heard.changes = Changes::default();
                    return Ok(None);
                }
                let mut changes = std::mem::take(&mut heard.changes);
                for (node, tx) in std::mem::take(&mut changes.written) {
                    let laid_on = self
                        .laid_on
                        .get(&tx)
                        .is_some_and(|(_, nodes)| nodes.contains(&node));
                    if !laid_on {
                        changes.nodes.insert(node);
                    }
                }
                Ok(Some(changes))
            }
        }
    }
}

/// Reads `ids` (those that exist) with what books and claims them, on `conn` as it sees
/// them (inside a transaction: with its own uncommitted changes). The view uses it on
/// committed data only.
pub async fn load(conn: &mut AnyConnection, ids: &[String]) -> Result<Vec<NodeCapacity>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(LOAD_BATCH) {
        out.extend(load_batch(conn, chunk).await?);
    }
    Ok(out)
}

/// [`load`] for at most [`LOAD_BATCH`] ids (one query each for nodes, units, bookings,
/// host bookings and claims).
async fn load_batch(conn: &mut AnyConnection, ids: &[String]) -> Result<Vec<NodeCapacity>> {
    // `IS TRUE`: what the partial indexes on live bookings say (`*_live_booking_indexes.sql`).
    let list = placeholders(1, ids.len());
    let mut bookings: HashMap<String, Vec<Booked>> = HashMap::new();
    let sql = format!(
        "SELECT node_id, unit_id, reservation_id, spot, start_ms, end_ms FROM bookings
         WHERE active IS TRUE AND node_id IN ({list}) ORDER BY node_id, unit_id, start_ms, reservation_id"
    );
    let mut query = sqlx::query(&sql);
    for id in ids {
        query = query.bind(id);
    }
    for row in query.fetch_all(&mut *conn).await? {
        bookings
            .entry(row.get("node_id"))
            .or_default()
            .push(Booked {
                unit_id: row.get("unit_id"),
                reservation_id: row.get("reservation_id"),
                spot: flag(&row, "spot"),
                start_ms: row.get("start_ms"),
                end_ms: row.get("end_ms"),
            });
    }
    let mut host: HashMap<String, Vec<HostBooked>> = HashMap::new();
    let sql = format!(
        "SELECT h.node_id, h.reservation_id, r.spot, h.vcpu, h.memory_gib, h.hugepages_1gi, h.start_ms, h.end_ms
         FROM host_bookings h JOIN compute_reservations r ON r.id = h.reservation_id
         WHERE h.active IS TRUE AND h.node_id IN ({list}) ORDER BY h.node_id, h.start_ms, h.reservation_id"
    );
    let mut query = sqlx::query(&sql);
    for id in ids {
        query = query.bind(id);
    }
    for row in query.fetch_all(&mut *conn).await? {
        host.entry(row.get("node_id"))
            .or_default()
            .push(HostBooked {
                reservation_id: row.get("reservation_id"),
                spot: flag(&row, "spot"),
                amount: HostAmount {
                    vcpu: row.get("vcpu"),
                    memory_gib: row.get("memory_gib"),
                    hugepages_1gi: row.get("hugepages_1gi"),
                },
                start_ms: row.get("start_ms"),
                end_ms: row.get("end_ms"),
            });
    }
    let mut claims: HashMap<String, Vec<Record>> = HashMap::new();
    for record in queries::live_on_nodes(conn, ids).await? {
        claims
            .entry(record.node_id.clone())
            .or_default()
            .push(record);
    }
    // In one order, so that two loads of the same rows compare equal.
    for records in claims.values_mut() {
        records.sort_by(|a, b| a.id.cmp(&b.id));
    }
    Ok(nodes::find_many(conn, ids)
        .await?
        .into_iter()
        .map(|node| {
            let bookings = bookings.remove(&node.id).unwrap_or_default();
            let host = host.remove(&node.id).unwrap_or_default();
            let claims = claims.remove(&node.id).unwrap_or_default();
            NodeCapacity::new(Arc::new(node), bookings, host, claims)
        })
        .collect())
}

/// Listens on [`CHANNEL`] until the process ends, reconnecting after a failure.
async fn listen(url: String, heard: Arc<SyncMutex<Heard>>) {
    loop {
        match sqlx::postgres::PgListener::connect(&url).await {
            Ok(mut listener) => {
                if let Err(err) = listener.listen_all([CHANNEL, POOLS_CHANNEL]).await {
                    tracing::warn!(error = %err, "capacity view: cannot LISTEN; retrying");
                } else {
                    {
                        let mut h = heard.lock().expect("capacity listener state");
                        h.listening = true;
                        h.reset = true;
                    }
                    loop {
                        match listener.try_recv().await {
                            Ok(Some(note)) => {
                                let mut h = heard.lock().expect("capacity listener state");
                                let payload = note.payload();
                                if note.channel() == POOLS_CHANNEL {
                                    h.changes.pools.insert(payload.to_string());
                                } else if let Some((node, tx)) = payload.rsplit_once(' ')
                                    && let Ok(tx) = tx.parse()
                                {
                                    h.changes.written.insert((node.to_string(), tx));
                                } else {
                                    h.changes.nodes.insert(payload.to_string());
                                }
                            }
                            Ok(None) => {
                                // The connection dropped; notifications may be lost.
                                heard.lock().expect("capacity listener state").reset = true;
                            }
                            Err(err) => {
                                tracing::warn!(error = %err, "capacity view: listener failed; reconnecting");
                                break;
                            }
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, "capacity view: cannot connect to listen"),
        }
        heard.lock().expect("capacity listener state").listening = false;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{DeviceClass, HostResources, Unit, UnitClass};

    fn node(units: usize) -> Arc<Node> {
        let host = HostResources {
            vcpu: 64,
            memory_gib: 512,
            hugepages_1gi: 0,
        };
        let units = (0..units)
            .map(|i| Unit {
                id: format!("g{i}"),
                class: UnitClass::VfioGroup,
                device_class: DeviceClass::Gpu,
                model: "H100".into(),
                memory_gib: 80,
                nvlink_domain: Some("0".into()),
                sellable: true,
                labels: Default::default(),
            })
            .collect();
        Arc::new(Node::sample("n1", host, units))
    }

    #[test]
    fn a_node_list_changed_while_held_copies_one_chunk_and_reads_in_order_across_chunks() {
        let n = 2 * CHUNK + 5;
        let capacities: Vec<Arc<NodeCapacity>> = (0..n)
            .map(|units| Arc::new(NodeCapacity::new(node(units % 4), vec![], vec![], vec![])))
            .collect();
        let mut list: Nodes = capacities.iter().cloned().collect();
        assert_eq!(list.len(), n);
        assert!(list.iter().zip(&capacities).all(|(a, b)| Arc::ptr_eq(a, b)));
        assert_eq!(list.iter().count(), n);
        let held = list.clone();
        let changed = Arc::new(NodeCapacity::new(node(7), vec![], vec![], vec![]));
        list.set(CHUNK + 3, changed.clone());
        assert!(Arc::ptr_eq(&list[CHUNK + 3], &changed));
        assert!(
            Arc::ptr_eq(&held[CHUNK + 3], &capacities[CHUNK + 3]),
            "the holder reads what it took"
        );
        // Only the changed chunk was copied: the others are still shared.
        assert!(Arc::ptr_eq(&list.chunks[0], &held.chunks[0]));
        assert!(Arc::ptr_eq(&list.chunks[2], &held.chunks[2]));
        assert!(!Arc::ptr_eq(&list.chunks[1], &held.chunks[1]));
        assert!(Nodes::default().is_empty());
    }

    fn booked(unit: &str, reservation: &str) -> Booked {
        Booked {
            unit_id: unit.into(),
            reservation_id: reservation.into(),
            spot: false,
            start_ms: 0,
            end_ms: 100,
        }
    }

    fn host(reservation: &str) -> HostBooked {
        HostBooked {
            reservation_id: reservation.into(),
            spot: false,
            amount: HostAmount {
                vcpu: 8,
                memory_gib: 64,
                hugepages_1gi: 0,
            },
            start_ms: 0,
            end_ms: 100,
        }
    }

    fn claim(
        units: &[&str],
        released: &[&str],
        lifecycle: crate::node_reservations::Lifecycle,
    ) -> Record {
        Record {
            id: format!("nrsv_{}", units.join("")),
            node_id: "n1".into(),
            unit_ids: units.iter().map(|u| u.to_string()).collect(),
            released_unit_ids: released.iter().map(|u| u.to_string()).collect(),
            allowed_org_ids: vec!["anchor".into()],
            managing_org_ids: vec![],
            term: crate::node_reservations::Term {
                starts_at: 0,
                ends_at: Some(1_000),
            },
            lifecycle,
            topology_gen: 0,
            contract_ref: None,
            reason: None,
            created_at: 0,
            updated_at: 0,
        }
    }

    fn states(capacity: &NodeCapacity, now: i64) -> Vec<UnitState> {
        let mut scratch = Vec::new();
        let mut out = Vec::new();
        capacity.unit_states(now, &mut scratch, |_, state| out.push(state));
        out
    }

    #[test]
    fn each_unit_counts_in_one_state_booked_before_reserved_before_released() {
        use crate::node_reservations::Lifecycle;
        use UnitState::*;
        // g0-g3 reserved with g0-g1 released; g1 booked (spot on a released unit); g2
        // booked within the reservation; g4 booked; g5 free; g6 under a reservation that
        // needs review, which releases nothing; g7 under a cancelled one.
        let claims = vec![
            claim(&["g0", "g1", "g2", "g3"], &["g0", "g1"], Lifecycle::Granted),
            claim(&["g6"], &["g6"], Lifecycle::NeedsReview),
            claim(&["g7"], &[], Lifecycle::Cancelled),
        ];
        let bookings = vec![booked("g1", "r1"), booked("g2", "r2"), booked("g4", "r3")];
        let capacity = NodeCapacity::new(node(8), bookings.clone(), vec![], claims.clone());
        assert_eq!(
            states(&capacity, 50),
            [
                Released, Booked, Booked, Reserved, Booked, Free, Reserved, Free
            ]
        );
        // Once the bookings end (at 100) they hold nothing; once the term ends (at 1000),
        // neither do the reservations.
        assert_eq!(
            states(&capacity, 100),
            [
                Released, Released, Reserved, Reserved, Free, Free, Reserved, Free
            ]
        );
        assert_eq!(states(&capacity, 1_000), [Free; 8]);
        // A lost node's units are lost, whatever held them.
        let mut lost = (*node(8)).clone();
        lost.conditions.push(crate::condition::Condition {
            kind: "NodeLost".into(),
            reason: "Silent".into(),
            message: String::new(),
            since: 0,
        });
        let capacity = NodeCapacity::new(Arc::new(lost), bookings, vec![], claims);
        assert_eq!(states(&capacity, 50), [Lost; 8]);
    }

    #[test]
    fn a_laid_on_commit_holds_what_a_fresh_load_would() {
        let held = NodeCapacity::new(node(4), vec![booked("g2", "r1")], vec![host("r1")], vec![]);
        let placed = held.with_change(&Change::Booked {
            reservation_id: "r2".into(),
            bookings: vec![booked("g0", "r2"), booked("g1", "r2")],
            host: Some(host("r2")),
        });
        // As loaded: bookings by unit, host bookings by start then reservation.
        let loaded = NodeCapacity::new(
            node(4),
            vec![booked("g0", "r2"), booked("g1", "r2"), booked("g2", "r1")],
            vec![host("r1"), host("r2")],
            vec![],
        );
        assert!(placed.same_capacity(&loaded));
        assert_eq!(placed.bookings, loaded.bookings);
        assert_eq!(placed.free_units(0, 100), 1);
        // Laid on twice (the node was loaded with it already): booked once.
        let again = placed.with_change(&Change::Booked {
            reservation_id: "r2".into(),
            bookings: vec![booked("g0", "r2"), booked("g1", "r2")],
            host: Some(host("r2")),
        });
        assert_eq!(again.bookings.len(), 3);
        assert_eq!(again.host.len(), 2);
        let released = again.with_change(&Change::Ended {
            reservation_id: "r2".into(),
        });
        assert!(released.same_capacity(&held));
        assert_eq!(released.free_units(0, 100), 3);
    }

    #[test]
    fn a_node_is_full_where_every_sellable_unit_is_held_and_only_there() {
        let during = |unit: &str, start_ms: i64, end_ms: i64| Booked {
            start_ms,
            end_ms,
            ..booked(unit, &format!("rsv-{unit}-{start_ms}"))
        };
        let mut units = node(3);
        Arc::make_mut(&mut units).units[2].sellable = false;
        // g0 held over [0, 10) in two touching bookings, g1 over [2, 12) and [20, 30).
        let bookings = vec![
            during("g0", 0, 5),
            during("g0", 5, 10),
            during("g1", 2, 12),
            during("g1", 20, 30),
            during("g0", 25, 40),
        ];
        let held = NodeCapacity::new(units, bookings, Vec::new(), Vec::new());
        assert_eq!(&*held.glance.full, &[(2, 10), (25, 30)]);
        let until = |start, end| held.full_until(start, end);
        assert_eq!(
            (until(9, 11), until(0, 3), until(29, 50)),
            (Some(10), Some(10), Some(30))
        );
        assert_eq!(
            (until(10, 25), until(0, 2), until(30, 99)),
            (None, None, None)
        );
        assert_eq!(
            until(0, 99),
            Some(10),
            "the first full interval in the window"
        );
        assert!(held.may_hold(reservation_hash("rsv-g1-20")));
        assert!(!held.holds_spot());
        // A node with no booking, or none sellable, is never full.
        let idle = NodeCapacity::new(node(2), Vec::new(), Vec::new(), Vec::new());
        assert_eq!(idle.full_until(0, 99), None);
        let mut unsellable = node(1);
        Arc::make_mut(&mut unsellable).units[0].sellable = false;
        let none = NodeCapacity::new(unsellable, vec![booked("g0", "r")], Vec::new(), Vec::new());
        assert_eq!(none.full_until(0, 99), None);
    }
}
