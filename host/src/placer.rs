//! The placement seam: what a placement (or preemption) policy is given, what it answers,
//! how an answer is checked, and how a decision fails. The booking engine decides through
//! it and the policy host implements it for WebAssembly components; both import this
//! module, neither imports the other's decision types.

use std::collections::{BTreeMap, HashSet};

use futures::future::BoxFuture;
use serde::Serialize;
use wasmtime::component::{ComponentType, Lower};

use crate::inventory::DeviceClass;

pub use orl_placer_default::{
    Candidates, DeviceClass as PolicyClass, DeviceRequest as DeviceAsk, DomainLoad,
    Placement as Choice, Request as PlacementRequest, Unit as CandidateUnit,
};

/// The device class of a unit as the policy interface spells it.
pub fn policy_class(class: DeviceClass) -> PolicyClass {
    match class {
        DeviceClass::Gpu => PolicyClass::Gpu,
        DeviceClass::GpuMig => PolicyClass::GpuMig,
        DeviceClass::GpuSlot => PolicyClass::GpuSlot,
        DeviceClass::NicVf => PolicyClass::NicVf,
        DeviceClass::Disk => PolicyClass::Disk,
        DeviceClass::Node => PolicyClass::Node,
    }
}

/// Why a placer did not place.
#[derive(Debug)]
pub enum Refusal {
    /// The request does not fit the candidates; it waits (`pending`).
    Unschedulable(String),
    /// The policy itself failed (trap, deadline, memory, or an invalid answer): the
    /// decision fails and nothing is written.
    Failed(Failure),
}

/// Works out the names, regions and labels of the nodes of some candidates (WIT
/// `node-facts`), for a policy that is given them (the booking engine's snapshot of a
/// pool answers them for its nodes). Only called when the policy deciding reads them.
pub type FactsOf<'a> = &'a (dyn Fn(&Candidates) -> NodeFacts + Sync);

/// What a placer answers: the units chosen and who decided, or why not.
pub type Placed = std::result::Result<(Choice, String), Refusal>;

/// The seam every placement policy implements, natively or as a WebAssembly component.
/// A decision is a future run on the caller's async worker: a WebAssembly policy gives the
/// worker back at every epoch tick while it computes, and its deadline bounds the whole
/// decision.
pub trait Placer: Send + Sync {
    /// The policy's id, e.g. `sha256:…`.
    fn id(&self) -> String;
    /// Chooses units, and names who decided (recorded on the placement); or says why not.
    /// `facts` gives the candidate nodes' names, regions and labels to a policy that reads
    /// them.
    fn place<'a>(
        &'a self,
        request: &'a PlacementRequest,
        candidates: &'a Candidates,
        facts: FactsOf<'a>,
    ) -> BoxFuture<'a, Placed>;
}

/// The default placement policy (NVLink-aware best fit) run natively: availability
/// searches and the benchmark's baseline. Pools decide through the WebAssembly component,
/// the fallback included.
pub struct NativeDefault;

impl NativeDefault {
    /// The decision, made at once on the calling thread.
    pub fn decide(&self, request: &PlacementRequest, candidates: &Candidates) -> Placed {
        orl_placer_default::place(request, candidates)
            .map(|choice| (choice, self.id()))
            .map_err(|u| Refusal::Unschedulable(u.into_reason()))
    }
}

impl Placer for NativeDefault {
    fn id(&self) -> String {
        "native:placer-default".into()
    }

    /// Ready at once: nothing to wait for.
    fn place<'a>(
        &'a self,
        request: &'a PlacementRequest,
        candidates: &'a Candidates,
        _facts: FactsOf<'a>,
    ) -> BoxFuture<'a, Placed> {
        Box::pin(std::future::ready(self.decide(request, candidates)))
    }
}

/// Checks a placer's answer against what it was offered: one node, exactly the requested
/// number of distinct offered units of each class and model, NVLink domains honoured.
pub fn check_choice(
    request: &PlacementRequest,
    candidates: &Candidates,
    choice: &Choice,
) -> std::result::Result<(), String> {
    let node = candidates
        .find(choice.node)
        .ok_or_else(|| format!("node {} was not offered", choice.node))?;
    let offered = node.free_ids();
    let mut seen = HashSet::new();
    let mut chosen: Vec<(u32, CandidateUnit)> = Vec::new();
    for &id in &choice.units {
        if !seen.insert(id) {
            return Err(format!("unit {id} chosen twice"));
        }
        let unit = offered
            .contains(&id)
            .then(|| candidates.units.get(id))
            .flatten()
            .ok_or_else(|| format!("unit {id} was not offered on node {}", choice.node))?;
        chosen.push((id, unit));
    }
    let wanted: u32 = request.devices.iter().map(|d| d.count).sum();
    if chosen.len() != wanted as usize {
        return Err(format!("{} units chosen, {wanted} requested", chosen.len()));
    }
    // Assign chosen units to device entries, most constrained entries first.
    let mut remaining = chosen;
    let mut asks: Vec<&DeviceAsk> = request.devices.iter().collect();
    asks.sort_by_key(|a| (!a.nvlink_all, a.model.is_none()));
    for ask in asks {
        let matching: Vec<u32> = remaining
            .iter()
            .filter(|(_, u)| ask.accepts(u))
            .map(|(id, _)| *id)
            .collect();
        let pick: Vec<u32> = if ask.nvlink_all {
            let mut by_domain: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
            for id in matching {
                if let Some(d) = candidates.units.get(id).and_then(|u| u.nvlink_domain) {
                    by_domain.entry(d).or_default().push(id);
                }
            }
            by_domain
                .into_values()
                .find(|units| units.len() >= ask.count as usize)
                .ok_or_else(|| {
                    format!(
                        "no {} {} units in one NVLink domain among those chosen",
                        ask.count, ask.class
                    )
                })?
                .into_iter()
                .take(ask.count as usize)
                .collect()
        } else {
            matching.into_iter().take(ask.count as usize).collect()
        };
        if pick.len() < ask.count as usize {
            return Err(format!("too few {} units chosen", ask.class));
        }
        remaining.retain(|(id, _)| !pick.contains(id));
    }
    Ok(())
}

/// A spot booking that could give way to a request (WIT `spot-booking`): its units are a
/// run of [`Candidates::units`] and in no node's free run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpotCandidate {
    pub id: u32,
    pub node: u32,
    pub units: orl_placer_default::Span,
    pub elapsed_seconds: u64,
    pub started_at_ms: i64,
}

/// What a policy of `orl:policy@0.2.0` sees of each candidate node beyond its units (WIT
/// `node-facts`): entry `j` of the `name`, `region` and `labels` columns describes node `j`
/// of the call's candidates, its strings runs of one block of text. Columns of numbers, so
/// the call copies each as one block.
#[derive(Clone, Debug, Default, PartialEq, Eq, ComponentType, Lower)]
#[component(record)]
pub struct NodeFacts {
    pub text: Vec<u8>,
    #[component(name = "name-start")]
    pub name_start: Vec<u32>,
    #[component(name = "name-len")]
    pub name_len: Vec<u32>,
    #[component(name = "region-start")]
    pub region_start: Vec<u32>,
    #[component(name = "region-len")]
    pub region_len: Vec<u32>,
    #[component(name = "labels-start")]
    pub labels_start: Vec<u32>,
    #[component(name = "labels-len")]
    pub labels_len: Vec<u32>,
    #[component(name = "key-start")]
    pub key_start: Vec<u32>,
    #[component(name = "key-len")]
    pub key_len: Vec<u32>,
    #[component(name = "value-start")]
    pub value_start: Vec<u32>,
    #[component(name = "value-len")]
    pub value_len: Vec<u32>,
}

impl NodeFacts {
    /// Appends the next node: its name, region (none is an empty run) and labels, which
    /// must come sorted by key as a node's labels are kept.
    pub fn push<'l>(
        &mut self,
        name: &str,
        region: Option<&str>,
        labels: impl IntoIterator<Item = (&'l str, &'l str)>,
    ) {
        let (start, len) = self.push_text(name);
        self.name_start.push(start);
        self.name_len.push(len);
        let (start, len) = region.map_or((0, 0), |r| self.push_text(r));
        self.region_start.push(start);
        self.region_len.push(len);
        let first = self.key_start.len() as u32;
        for (key, value) in labels {
            let (start, len) = self.push_text(key);
            self.key_start.push(start);
            self.key_len.push(len);
            let (start, len) = self.push_text(value);
            self.value_start.push(start);
            self.value_len.push(len);
        }
        self.labels_start.push(first);
        self.labels_len.push(self.key_start.len() as u32 - first);
    }

    /// Appends `text`; answers its run, start and length.
    fn push_text(&mut self, text: &str) -> (u32, u32) {
        let start = self.text.len() as u32;
        self.text.extend_from_slice(text.as_bytes());
        (start, text.len() as u32)
    }
}

/// How a decision failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    Trap,
    Deadline,
    Memory,
    InvalidAnswer,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Trap => "trap",
            FailureKind::Deadline => "deadline",
            FailureKind::Memory => "memory",
            FailureKind::InvalidAnswer => "invalid-answer",
        }
    }
}

/// A policy decision that failed: which plugin, how, and what it said.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub plugin_id: String,
    pub kind: FailureKind,
    pub message: String,
}

/// Candidates and requests for the decision tests here and in the booking engine.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A GPU in `domain`; its id is its position among the units of the test.
    pub(crate) fn unit(domain: u32) -> CandidateUnit {
        CandidateUnit {
            class: PolicyClass::Gpu,
            model: 0,
            nvlink_domain: Some(domain),
            memory_gib: 80,
        }
    }

    fn candidates(nodes: Vec<Vec<CandidateUnit>>) -> Candidates {
        let mut candidates = Candidates::default();
        for (id, units) in nodes.into_iter().enumerate() {
            candidates.push_node(id as u32, 0, 8, [], units);
        }
        candidates
    }

    /// A request for `count` GPUs, in one NVLink domain or not.
    pub(crate) fn ask(count: u32, nvlink_all: bool) -> PlacementRequest {
        PlacementRequest {
            devices: vec![DeviceAsk {
                class: PolicyClass::Gpu,
                count,
                model: None,
                nvlink_all,
            }],
            spot: false,
            duration_seconds: 3600,
            models: vec!["H100".into()],
        }
    }

    #[test]
    fn the_native_default_keeps_nvlink_all_in_one_domain() {
        let nodes = candidates(vec![
            vec![unit(0), unit(1), unit(1)],
            vec![unit(0), unit(0)],
        ]);
        let (choice, _) = NativeDefault.decide(&ask(2, true), &nodes).unwrap();
        assert!(check_choice(&ask(2, true), &nodes, &choice).is_ok());
        assert!(matches!(
            NativeDefault.decide(&ask(3, true), &nodes),
            Err(Refusal::Unschedulable(_))
        ));
    }

    #[test]
    fn answers_with_unknown_duplicate_or_wrong_units_are_refused() {
        let nodes = candidates(vec![vec![unit(0), unit(0), unit(1)]]);
        let check = |node: u32, units: &[u32]| {
            let choice = Choice {
                node,
                units: units.to_vec(),
            };
            check_choice(&ask(2, true), &nodes, &choice)
        };
        assert!(check(0, &[0, 1]).is_ok());
        assert!(check(0, &[0, 0]).unwrap_err().contains("twice"));
        assert!(check(0, &[0, 9]).unwrap_err().contains("not offered"));
        assert!(check(5, &[0, 1]).unwrap_err().contains("node 5"));
        assert!(check(0, &[0]).unwrap_err().contains("1 units chosen"));
        assert!(check(0, &[0, 2]).unwrap_err().contains("NVLink"));
    }
}
