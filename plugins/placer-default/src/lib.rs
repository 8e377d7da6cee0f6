//! The default placement policy of orl: NVLink-aware best fit.
//!
//! The types mirror the records of the `orl:policy` WIT package (`wit/policy.wit`) and the
//! policy is a pure function over them, so the host can run it natively as well as through
//! the WebAssembly component this crate also builds (the `placer` world, see
//! `component.rs`).
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
//! until the whole request fits; then entries pinned to a model; then the rest. The domain
//! choices tried per node are capped at 10,000 (only requests with many `nvlink_all` entries
//! come near it); a node that needs more counts as not fitting.
//!
//! The answer is deterministic: the same input always gives the same placement.

#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code, clippy::too_many_arguments)] // the generated export bindings
mod component;
mod fit;
mod reason;

use std::fmt;

/// What kind of device a unit provides and a request asks for (WIT `device-class`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceClass {
    /// A whole GPU, or a group of GPUs handed out together.
    Gpu,
    /// A MIG instance.
    GpuMig,
    /// A time-slice or MPS slot.
    GpuSlot,
    /// A NIC virtual function.
    NicVf,
    /// A disk.
    Disk,
    /// A whole node.
    Node,
}

impl DeviceClass {
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
}

impl fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A unit the host found feasible for the request (WIT `unit`).
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// How loaded one NVLink domain of a node is over the requested window (WIT `domain-load`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DomainLoad {
    /// The domain, as in [`Unit::nvlink_domain`].
    pub domain: u32,
    /// Units of the domain booked at some point of the window.
    pub busy: u32,
    /// All units of the domain.
    pub total: u32,
}

/// A run of consecutive entries of a [`Candidates`] list (WIT `span`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Span {
    /// Index of the first entry.
    pub start: u32,
    /// Number of entries.
    pub len: u32,
}

impl Span {
    /// The entries of `list` this span covers; empty when it reaches past the end.
    pub fn of<T>(self, list: &[T]) -> &[T] {
        let start = self.start as usize;
        list.get(start..start.saturating_add(self.len as usize))
            .unwrap_or(&[])
    }
}

/// A candidate node (WIT `node`): its load, and its domains and free units as runs of the
/// [`Candidates`] lists.
#[derive(Clone, Debug, PartialEq, Eq)]
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

/// Everything the host found for one request, as three flat lists (WIT `candidates`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Candidates {
    /// The candidate nodes.
    pub nodes: Vec<Node>,
    /// Every unit of the call.
    pub units: Vec<Unit>,
    /// The domain loads of every node.
    pub domains: Vec<DomainLoad>,
}

impl Candidates {
    /// Appends node `id` with its domain loads and free units (ids kept as given).
    pub fn push_node(
        &mut self,
        id: u32,
        busy_units: u32,
        total_units: u32,
        domains: impl IntoIterator<Item = DomainLoad>,
        free: impl IntoIterator<Item = Unit>,
    ) {
        let domains = Self::extend(&mut self.domains, domains);
        let free = Self::extend(&mut self.units, free);
        self.nodes.push(Node {
            id,
            busy_units,
            total_units,
            domains,
            free,
        });
    }

    /// Appends `items` to `list`, answering the span they take.
    pub fn extend<T>(list: &mut Vec<T>, items: impl IntoIterator<Item = T>) -> Span {
        let start = list.len();
        list.extend(items);
        Span {
            start: start as u32,
            len: (list.len() - start) as u32,
        }
    }

    /// `node` with its runs resolved.
    pub fn view<'a>(&'a self, node: &'a Node) -> NodeView<'a> {
        NodeView {
            id: node.id,
            busy_units: node.busy_units,
            total_units: node.total_units,
            domains: node.domains.of(&self.domains),
            free: node.free.of(&self.units),
        }
    }

    /// Every node with its runs resolved, in order.
    pub fn views(&self) -> impl Iterator<Item = NodeView<'_>> {
        self.nodes.iter().map(|n| self.view(n))
    }
}

/// A candidate node with its domain loads and free units borrowed from [`Candidates`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeView<'a> {
    /// The host's index for the node.
    pub id: u32,
    /// Units of the node booked at some point of the window.
    pub busy_units: u32,
    /// All units of the node.
    pub total_units: u32,
    /// The load of each NVLink domain; a domain missing here counts as idle.
    pub domains: &'a [DomainLoad],
    /// The units the request may take.
    pub free: &'a [Unit],
}

impl NodeView<'_> {
    /// Busy units of `domain` as reported by the host, `0` when it is not reported.
    pub fn domain_busy(&self, domain: u32) -> u32 {
        self.domains
            .iter()
            .find(|d| d.domain == domain)
            .map_or(0, |d| d.busy)
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
    let mut scratch = fit::Scratch::new(req);
    let mut best: Option<(fit::Score, NodeView<'_>)> = None;
    for node in candidates.views() {
        if let Some(score) = fit::best_on(req, &node, &mut scratch)
            && best.as_ref().is_none_or(|(b, _)| score < *b)
        {
            best = Some((score, node));
        }
    }
    let (_, node) =
        best.ok_or_else(|| Unschedulable::new(reason::no_node_fits(req, candidates)))?;
    fit::best_on(req, &node, &mut scratch).expect("the best node still fits");
    Ok(fit::placement(&node, &scratch))
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

#[cfg(test)]
mod tests;
