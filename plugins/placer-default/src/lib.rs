//! The default placement policy of orl: NVLink-aware best fit.
//!
//! The types mirror the records of the `orl:policy` WIT package (`wit/policy.wit`) and the
//! policy is a pure function over them, so the host runs it natively as well as through its
//! WebAssembly component (`orl-placer-default-component`, the `placer` world), and the
//! default preemptor (`orl-preemptor-default`) asks it whether a request fits on a node.
//!
//! The rules, in order of precedence:
//!
//! 1. All units of a request go on one node. A unit is taken only for an entry of its class
//!    and, when the entry names one, of its model; the units of an `nvlink_all` entry all
//!    come from one NVLink domain.
//! 2. An `nvlink_all` entry goes to the domain with the fewest free matching units that
//!    still holds it (best fit), so that larger domains stay whole for larger requests.
//! 3. Other entries pack: units outside any NVLink domain first, then units of domains that
//!    are already busy, then units of idle domains, each time from the domain with the fewest
//!    free matching units, so that whole domains stay free for large requests.
//! 4. Among nodes: the best fit of rule 2, then the fewest idle domains broken into, then
//!    the most busy units (packing), then the lowest node id.
//! 5. Within a domain, and wherever nothing else decides, the lowest unit id.
//!
//! Entries are satisfied `nvlink_all` first, largest first, trying every choice of domain
//! until the whole request fits; then entries pinned to a model; then the rest. When that
//! finds nothing on a node, an exact search (for each choice of domains, a maximum matching
//! of entries to units) decides, so a node is refused only when no placement exists on it.
//! The domain choices tried per node, by both together, are capped at 10,000 (only requests
//! with many `nvlink_all` entries come near it); a node that needs more counts as not
//! fitting.
//!
//! The answer is deterministic: the same input always gives the same placement.

mod fit;
mod reason;

use std::fmt;

/// What kind of device a unit provides and a request asks for (WIT `device-class`).
///
/// The columns of [`Units`] carry a class as its [`code`](DeviceClass::code): the position of
/// its case in the WIT enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DeviceClass {
    /// A whole GPU, or a group of GPUs handed out together.
    Gpu = 0,
    /// A MIG instance.
    GpuMig = 1,
    /// A time-slice or MPS slot.
    GpuSlot = 2,
    /// A NIC virtual function.
    NicVf = 3,
    /// A disk.
    Disk = 4,
    /// A whole node.
    Node = 5,
}

impl DeviceClass {
    /// Every class, in the order of the WIT enum: `ALL[code]` is the class of `code`.
    pub const ALL: [DeviceClass; 6] = [
        DeviceClass::Gpu,
        DeviceClass::GpuMig,
        DeviceClass::GpuSlot,
        DeviceClass::NicVf,
        DeviceClass::Disk,
        DeviceClass::Node,
    ];

    /// The WIT spelling (`gpu`, `gpu-mig`, …), used in reasons.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceClass::Gpu => "gpu",
            DeviceClass::GpuMig => "gpu-mig",
            DeviceClass::GpuSlot => "gpu-slot",
            DeviceClass::NicVf => "nic-vf",
            DeviceClass::Disk => "disk",
            DeviceClass::Node => "node",
        }
    }

    /// The class as [`Units::class`] carries it: the position of its case in the WIT enum.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The class of `code`, or `None` for a code no class has.
    pub fn from_code(code: u8) -> Option<DeviceClass> {
        DeviceClass::ALL.get(usize::from(code)).copied()
    }
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// [`Units::nvlink_domain`] of a unit in no NVLink domain.
pub const NO_DOMAIN: u32 = u32::MAX;

/// One unit, read from or appended to the columns of [`Units`]. Its id is its position there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unit {
    /// The device class the unit provides.
    pub class: DeviceClass,
    /// Index into [`Request::models`].
    pub model: u32,
    /// The NVLink domain, unique within the unit's node; `None` outside any domain.
    pub nvlink_domain: Option<u32>,
    /// Device memory in GiB.
    pub memory_gib: u32,
}

/// The units of one call as columns (WIT `units`): entry `i` of every column describes unit
/// `i`, and `i` is the unit's id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Units {
    /// Each unit's [`DeviceClass::code`]. A code no class has matches no request.
    pub class: Vec<u8>,
    /// Each unit's model, an index into [`Request::models`].
    pub model: Vec<u32>,
    /// Each unit's NVLink domain, or [`NO_DOMAIN`].
    pub nvlink_domain: Vec<u32>,
    /// Each unit's device memory in GiB.
    pub memory_gib: Vec<u32>,
}

impl Units {
    /// How many units there are.
    pub fn len(&self) -> usize {
        self.class.len()
    }

    /// Whether there are no units.
    pub fn is_empty(&self) -> bool {
        self.class.is_empty()
    }

    /// The length every column has, or the shortest when a caller made them differ.
    fn columns_len(&self) -> usize {
        self.class
            .len()
            .min(self.model.len())
            .min(self.nvlink_domain.len())
            .min(self.memory_gib.len())
    }

    /// Appends `unit`, answering its id.
    pub fn push(&mut self, unit: Unit) -> u32 {
        let id = self.len() as u32;
        self.class.push(unit.class.code());
        self.model.push(unit.model);
        self.nvlink_domain
            .push(unit.nvlink_domain.unwrap_or(NO_DOMAIN));
        self.memory_gib.push(unit.memory_gib);
        id
    }

    /// Unit `id`, or `None` when there is no such unit or its class code is unknown.
    pub fn get(&self, id: u32) -> Option<Unit> {
        let i = id as usize;
        Some(Unit {
            class: DeviceClass::from_code(*self.class.get(i)?)?,
            model: *self.model.get(i)?,
            nvlink_domain: Some(*self.nvlink_domain.get(i)?).filter(|d| *d != NO_DOMAIN),
            memory_gib: *self.memory_gib.get(i)?,
        })
    }
}

/// How loaded one NVLink domain of a node is over the requested window: one entry of
/// [`Domains`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DomainLoad {
    /// The domain, as in [`Unit::nvlink_domain`].
    pub domain: u32,
    /// Units of the domain booked at some point of the window.
    pub busy: u32,
    /// All units of the domain.
    pub total: u32,
}

/// The domain loads of every candidate node as columns (WIT `domains`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Domains {
    /// The domain, as in [`Units::nvlink_domain`].
    pub domain: Vec<u32>,
    /// Units of the domain booked at some point of the window.
    pub busy: Vec<u32>,
    /// All units of the domain.
    pub total: Vec<u32>,
}

impl Domains {
    /// How many entries there are.
    pub fn len(&self) -> usize {
        self.domain.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.domain.is_empty()
    }

    /// The length every column has, or the shortest when a caller made them differ.
    fn columns_len(&self) -> usize {
        self.domain.len().min(self.busy.len()).min(self.total.len())
    }

    /// Appends `load`.
    pub fn push(&mut self, load: DomainLoad) {
        self.domain.push(load.domain);
        self.busy.push(load.busy);
        self.total.push(load.total);
    }

    /// Entry `i`.
    pub fn get(&self, i: usize) -> Option<DomainLoad> {
        Some(DomainLoad {
            domain: *self.domain.get(i)?,
            busy: *self.busy.get(i)?,
            total: *self.total.get(i)?,
        })
    }
}

/// A run of consecutive entries of a column (WIT `span`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// Index of the first entry.
    pub start: u32,
    /// Number of entries.
    pub len: u32,
}

impl Span {
    /// The indices the span covers.
    pub fn range(self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..start.saturating_add(self.len as usize)
    }

    /// The ids the span covers, as `u32`.
    pub fn ids(self) -> std::ops::Range<u32> {
        self.start..self.start.saturating_add(self.len)
    }
}

/// One candidate node, read from or appended to the columns of [`Nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// The host's index for the node, unique within one call.
    pub id: u32,
    /// Units of the node booked at some point of the window.
    pub busy_units: u32,
    /// All units of the node.
    pub total_units: u32,
    /// The load of each NVLink domain, in [`Candidates::domains`]; a domain missing there
    /// counts as idle.
    pub domains: Span,
    /// The units the request may take, in [`Candidates::units`].
    pub free: Span,
}

/// The candidate nodes as columns (WIT `nodes`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Nodes {
    /// The host's id for each node, unique within the call.
    pub id: Vec<u32>,
    /// Units of each node booked at some point of the window.
    pub busy_units: Vec<u32>,
    /// All units of each node.
    pub total_units: Vec<u32>,
    /// Each node's domain loads: a run of [`Candidates::domains`].
    pub domains_start: Vec<u32>,
    /// See `domains_start`.
    pub domains_len: Vec<u32>,
    /// Each node's free units: a run of [`Candidates::units`].
    pub free_start: Vec<u32>,
    /// See `free_start`.
    pub free_len: Vec<u32>,
}

impl Nodes {
    /// How many nodes there are.
    pub fn len(&self) -> usize {
        self.id.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.id.is_empty()
    }

    /// The length every column has, or the shortest when a caller made them differ.
    fn columns_len(&self) -> usize {
        (self.id.len())
            .min(self.busy_units.len())
            .min(self.total_units.len())
            .min(self.domains_start.len())
            .min(self.domains_len.len())
            .min(self.free_start.len())
            .min(self.free_len.len())
    }

    /// Appends `node`.
    pub fn push(&mut self, node: Node) {
        self.id.push(node.id);
        self.busy_units.push(node.busy_units);
        self.total_units.push(node.total_units);
        self.domains_start.push(node.domains.start);
        self.domains_len.push(node.domains.len);
        self.free_start.push(node.free.start);
        self.free_len.push(node.free.len);
    }

    /// Every node, in order.
    pub fn iter(&self) -> impl Iterator<Item = Node> + '_ {
        (0..self.len()).filter_map(|j| self.get(j))
    }

    /// Node `j` (a position, not an id).
    pub fn get(&self, j: usize) -> Option<Node> {
        Some(Node {
            id: *self.id.get(j)?,
            busy_units: *self.busy_units.get(j)?,
            total_units: *self.total_units.get(j)?,
            domains: Span {
                start: *self.domains_start.get(j)?,
                len: *self.domains_len.get(j)?,
            },
            free: Span {
                start: *self.free_start.get(j)?,
                len: *self.free_len.get(j)?,
            },
        })
    }
}

/// Everything the host found for one request, as columns of numbers (WIT `candidates`), so
/// that the WebAssembly component receives it without a conversion in either direction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidates {
    /// The candidate nodes.
    pub nodes: Nodes,
    /// Every unit of the call.
    pub units: Units,
    /// The domain loads of every node.
    pub domains: Domains,
}

impl Candidates {
    /// Makes room for `nodes` more nodes with `units` more units (and two domains a node)
    /// without growing the columns as they are filled.
    pub fn reserve(&mut self, nodes: usize, units: usize) {
        let n = &mut self.nodes;
        for column in [
            &mut n.id,
            &mut n.busy_units,
            &mut n.total_units,
            &mut n.domains_start,
            &mut n.domains_len,
            &mut n.free_start,
            &mut n.free_len,
        ] {
            column.reserve(nodes);
        }
        let d = &mut self.domains;
        for column in [&mut d.domain, &mut d.busy, &mut d.total] {
            column.reserve(nodes * 2);
        }
        let u = &mut self.units;
        for column in [&mut u.model, &mut u.nvlink_domain, &mut u.memory_gib] {
            column.reserve(units);
        }
        u.class.reserve(units);
    }

    /// Empties every column, keeping what it allocated, so the candidates can be filled
    /// again without allocating.
    pub fn clear(&mut self) {
        let Candidates {
            nodes,
            units,
            domains,
        } = self;
        for column in [
            &mut nodes.id,
            &mut nodes.busy_units,
            &mut nodes.total_units,
            &mut nodes.domains_start,
            &mut nodes.domains_len,
            &mut nodes.free_start,
            &mut nodes.free_len,
            &mut units.model,
            &mut units.nvlink_domain,
            &mut units.memory_gib,
            &mut domains.domain,
            &mut domains.busy,
            &mut domains.total,
        ] {
            column.clear();
        }
        units.class.clear();
    }

    /// Appends node `id` with its domain loads and free units; the units get the next ids.
    pub fn push_node(
        &mut self,
        id: u32,
        busy_units: u32,
        total_units: u32,
        domains: impl IntoIterator<Item = DomainLoad>,
        free: impl IntoIterator<Item = Unit>,
    ) {
        let domains = self.push_domains(domains);
        let free = self.push_units(free);
        self.nodes.push(Node {
            id,
            busy_units,
            total_units,
            domains,
            free,
        });
    }

    /// Appends `units`, answering the span of ids they get.
    pub fn push_units(&mut self, units: impl IntoIterator<Item = Unit>) -> Span {
        let start = self.units.len() as u32;
        for unit in units {
            self.units.push(unit);
        }
        Span {
            start,
            len: self.units.len() as u32 - start,
        }
    }

    /// Appends `loads`, answering the span they take.
    pub fn push_domains(&mut self, loads: impl IntoIterator<Item = DomainLoad>) -> Span {
        let start = self.domains.len() as u32;
        for load in loads {
            self.domains.push(load);
        }
        Span {
            start,
            len: self.domains.len() as u32 - start,
        }
    }

    /// Node `j` (a position) with its runs resolved; `None` past the last node. A run that
    /// reaches past the end of its columns resolves to nothing.
    pub fn view(&self, j: usize) -> Option<NodeView<'_>> {
        let cut = Cut::new(self);
        (j < cut.len()).then(|| cut.view(j))
    }

    /// Every node with its runs resolved, in order.
    pub fn views(&self) -> impl Iterator<Item = NodeView<'_>> {
        let cut = Cut::new(self);
        (0..cut.len()).map(move |j| cut.view(j))
    }

    /// The node whose id is `id`, with its runs resolved.
    pub fn find(&self, id: u32) -> Option<NodeView<'_>> {
        let j = self.nodes.id.iter().position(|n| *n == id)?;
        self.view(j)
    }
}

/// The columns of one call cut to the lengths they share (a caller may have made them
/// differ), so that resolving a node checks only its own runs.
struct Cut<'a> {
    id: &'a [u32],
    busy_units: &'a [u32],
    total_units: &'a [u32],
    domains_start: &'a [u32],
    domains_len: &'a [u32],
    free_start: &'a [u32],
    free_len: &'a [u32],
    class: &'a [u8],
    model: &'a [u32],
    nvlink_domain: &'a [u32],
    domain: &'a [u32],
    domain_busy: &'a [u32],
}

impl<'a> Cut<'a> {
    /// Inlined, so that the loop over the nodes knows every node column has the same
    /// length and checks no index against each.
    #[inline(always)]
    fn new(candidates: &'a Candidates) -> Self {
        let Candidates {
            nodes,
            units,
            domains,
        } = candidates;
        let n = nodes.columns_len();
        let u = units.columns_len();
        let d = domains.columns_len();
        Cut {
            id: &nodes.id[..n],
            busy_units: &nodes.busy_units[..n],
            total_units: &nodes.total_units[..n],
            domains_start: &nodes.domains_start[..n],
            domains_len: &nodes.domains_len[..n],
            free_start: &nodes.free_start[..n],
            free_len: &nodes.free_len[..n],
            class: &units.class[..u],
            model: &units.model[..u],
            nvlink_domain: &units.nvlink_domain[..u],
            domain: &domains.domain[..d],
            domain_busy: &domains.busy[..d],
        }
    }

    /// How many nodes there are.
    fn len(&self) -> usize {
        self.id.len()
    }

    /// Node `j`, which must be below [`len`](Self::len).
    #[inline(always)]
    fn view(&self, j: usize) -> NodeView<'a> {
        // A run past the end of its columns (or past `usize`) resolves to nothing.
        let run = |start: u32, len: u32, columns: usize| {
            let start = start as usize;
            match start.checked_add(len as usize) {
                Some(end) if end <= columns => start..end,
                _ => 0..0,
            }
        };
        let free = run(self.free_start[j], self.free_len[j], self.class.len());
        let domains = run(
            self.domains_start[j],
            self.domains_len[j],
            self.domain.len(),
        );
        NodeView {
            id: self.id[j],
            busy_units: self.busy_units[j],
            total_units: self.total_units[j],
            first: free.start as u32,
            class: &self.class[free.clone()],
            class_to_end: &self.class[free.start..],
            nvlink_domain_to_end: &self.nvlink_domain[free.start..],
            model: &self.model[free.clone()],
            nvlink_domain: &self.nvlink_domain[free],
            domain: &self.domain[domains.clone()],
            domain_busy: &self.domain_busy[domains],
        }
    }
}

/// A candidate node with its free units and domain loads borrowed from the columns of
/// [`Candidates`]. Its free units are indexed locally: local index `k` is unit id
/// `first + k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeView<'a> {
    /// The host's index for the node.
    pub id: u32,
    /// Units of the node booked at some point of the window.
    pub busy_units: u32,
    /// All units of the node.
    pub total_units: u32,
    /// The id of the first free unit.
    pub first: u32,
    /// The class codes of the free units.
    pub class: &'a [u8],
    /// The class codes from the first free unit to the end of the column, so they can be
    /// read a word at a time.
    class_to_end: &'a [u8],
    /// The NVLink domains from the first free unit to the end of the column, so that a
    /// node's first units can be read as one array.
    nvlink_domain_to_end: &'a [u32],
    /// The models of the free units.
    pub model: &'a [u32],
    /// The NVLink domains of the free units ([`NO_DOMAIN`] for none).
    pub nvlink_domain: &'a [u32],
    /// The NVLink domains the host reported a load for.
    pub domain: &'a [u32],
    /// Busy units of each of those domains.
    pub domain_busy: &'a [u32],
}

impl NodeView<'_> {
    /// How many free units the node offers.
    pub fn free_len(&self) -> usize {
        self.class.len()
    }

    /// The ids of the free units.
    pub fn free_ids(&self) -> std::ops::Range<u32> {
        self.first..self.first + self.class.len() as u32
    }

    /// Busy units of `domain` as reported by the host, `0` when it is not reported.
    pub fn domain_busy(&self, domain: u32) -> u32 {
        self.domain
            .iter()
            .position(|d| *d == domain)
            .map_or(0, |i| self.domain_busy[i])
    }
}

/// One kind of device a request asks for (WIT `device-request`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRequest {
    /// The class every unit for this entry must have.
    pub class: DeviceClass,
    /// How many units this entry needs; `0` asks for nothing.
    pub count: u32,
    /// Index into [`Request::models`]; `None` accepts any model.
    pub model: Option<u32>,
    /// All units of this entry must share one NVLink domain.
    pub nvlink_all: bool,
}

impl DeviceRequest {
    /// Whether `unit` may serve this entry: same class and, when the entry names a model,
    /// same model. NVLink domains are not considered here.
    pub fn accepts(&self, unit: &Unit) -> bool {
        unit.class == self.class && self.model.is_none_or(|m| m == unit.model)
    }

    /// [`accepts`](Self::accepts) for free unit `k` of `node`.
    #[inline]
    pub fn accepts_at(&self, node: &NodeView<'_>, k: usize) -> bool {
        node.class[k] == self.class.code() && self.model.is_none_or(|m| m == node.model[k])
    }
}

/// What a tenant asks to have placed (WIT `request`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// The devices asked for; a placement lists units entry by entry in this order.
    pub devices: Vec<DeviceRequest>,
    /// A request for spot capacity.
    pub spot: bool,
    /// How long the units would be held, in seconds.
    pub duration_seconds: u64,
    /// Interned model names, indexed by `Unit::model` and `DeviceRequest::model`.
    pub models: Vec<String>,
}

impl Request {
    /// How many units a placement of this request holds: the sum of the entries' counts.
    pub fn unit_count(&self) -> u64 {
        self.devices.iter().map(|d| u64::from(d.count)).sum()
    }

    /// What the request asks for, in the words of the placer's reasons: `6 free gpu units
    /// of model H100 in one NVLink domain and 1 free nic-vf unit`.
    pub fn describe(&self) -> String {
        reason::all_of(self)
    }

    /// The name of model index `model`, or `#<index>` when the request does not list it.
    pub fn model_name(&self, model: u32) -> String {
        match self.models.get(model as usize) {
            Some(name) => name.clone(),
            None => format!("#{model}"),
        }
    }
}

/// Where a request goes (WIT `placement`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The node every unit is on.
    pub node: u32,
    /// Unit ids entry by entry, in the order of [`Request::devices`]; ascending within an
    /// entry.
    pub units: Vec<u32>,
}

/// Why a request cannot be placed on the candidates it was given. The reason is meant for
/// the person who made the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unschedulable {
    reason: String,
}

impl Unschedulable {
    /// An unschedulable verdict with `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        Unschedulable {
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

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unschedulable {}

/// Places `req` on the best of `nodes` by the rules in the crate documentation.
///
/// An `Ok` placement satisfies every rule of the WIT `placement` record: exactly
/// [`Request::unit_count`] distinct ids, all from the chosen node's `free` units, listed
/// entry by entry, each of its entry's class and model, and one domain per `nvlink_all`
/// entry. `Err` carries a reason naming what no node has.
pub fn place(req: &Request, candidates: &Candidates) -> Result<Placement, Unschedulable> {
    if req.unit_count() == 0 {
        return Err(Unschedulable::new("the request asks for no devices"));
    }
    fit::Scratch::with(req, |scratch| {
        let mut best: Option<(fit::Score, NodeView<'_>)> = None;
        // The columns are cut here, in this function, so that a node's are read unchecked.
        let cut = Cut::new(candidates);
        for j in 0..cut.len() {
            let node = cut.view(j);
            if let Some(score) = fit::best_on(req, &node, scratch)
                && best.as_ref().is_none_or(|(b, _)| score < *b)
            {
                best = Some((score, node));
            }
        }
        let (_, node) =
            best.ok_or_else(|| Unschedulable::new(reason::no_node_fits(req, candidates)))?;
        fit::best_on(req, &node, scratch).expect("the best node still fits");
        Ok(fit::placement(&node, scratch))
    })
}

/// The placement [`place`] would choose for `req` if `node` were the only candidate, or
/// `None` when the request does not fit on it. A request for no devices fits nowhere.
pub fn place_on(req: &Request, node: &NodeView<'_>) -> Option<Placement> {
    if req.unit_count() == 0 {
        return None;
    }
    let mut scratch = fit::Scratch::new(req);
    fit::best_on(req, node, &mut scratch).map(|_| fit::placement(node, &scratch))
}

/// Whether [`place_on`] would find a placement for `req` on `node`, without building it: the
/// same search, run on this thread's reused buffers. The default preemptor asks this of
/// every choice of terminations it weighs, so that it frees exactly what this placer needs.
pub fn fits_on(req: &Request, node: &NodeView<'_>) -> bool {
    req.unit_count() != 0
        && fit::Scratch::with(req, |scratch| fit::best_on(req, node, scratch).is_some())
}

#[cfg(test)]
mod tests;
