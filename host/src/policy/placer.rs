//! Placement through a WebAssembly component: the [`Placer`] seam implemented by running a
//! plugin instance, with its answer checked before the host trusts it.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;
use wasmtime::component::{ComponentType, Lower};

use super::bindings::placer::orl::policy::types as wit;
use super::{Loaded, PolicyHost};
use crate::metrics::Metrics;
use crate::placer::{
    Candidates, Choice, FactsOf, Failure, FailureKind, NodeFacts, Placed, PlacementRequest, Placer,
    PolicyClass, Refusal, SpotCandidate, check_choice,
};

/// A pool's placement plugin, as resolved when a decision starts: a swap of the pool's
/// assignment does not affect a decision already holding this.
pub struct WasmPlacer {
    pub host: Arc<PolicyHost>,
    pub loaded: Arc<Loaded>,
    pub config: Option<Value>,
    pub deadline_ms: u64,
    /// On a plugin failure, decide with the built-in default instead of failing.
    pub fallback: bool,
    pub metrics: Arc<Metrics>,
}

impl WasmPlacer {
    /// Runs the placer `loaded` and checks its answer, counting the decision.
    async fn decide(
        &self,
        loaded: &Loaded,
        config: Option<&Value>,
        request: &PlacementRequest,
        candidates: &Candidates,
        facts: FactsOf<'_>,
    ) -> Result<Result<Choice, String>, Failure> {
        let started = std::time::Instant::now();
        let outcome = self
            .host
            .place(loaded, request, candidates, facts, config, self.deadline_ms)
            .await
            .and_then(|answer| match answer {
                Ok(choice) => check_choice(request, candidates, &choice)
                    .map(|()| Ok(choice))
                    .map_err(|message| Failure {
                        plugin_id: loaded.id.clone(),
                        kind: FailureKind::InvalidAnswer,
                        message,
                    }),
                Err(reason) => Ok(Err(reason)),
            });
        let outcome_label = match &outcome {
            Ok(Ok(_)) => "placed",
            Ok(Err(_)) => "unschedulable",
            Err(failure) => {
                let kind = failure.kind.as_str();
                self.metrics
                    .observe_policy_failure(&loaded.id, "placer", kind);
                tracing::warn!(plugin = %failure.plugin_id, kind, message = %failure.message, "placement plugin failed");
                kind
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        self.metrics
            .observe_decision(&loaded.id, "placer", outcome_label, seconds);
        outcome
    }
}

impl Placer for WasmPlacer {
    fn id(&self) -> String {
        self.loaded.id.clone()
    }

    /// The pool's plugin decides; when it fails and the pool says `fallback`, the built-in
    /// default (the same WebAssembly component a pool without a placer runs, with no
    /// config) decides instead, and the placement names it.
    fn place<'a>(
        &'a self,
        request: &'a PlacementRequest,
        candidates: &'a Candidates,
        facts: FactsOf<'a>,
    ) -> BoxFuture<'a, Placed> {
        Box::pin(async move {
            let config = self.config.as_ref();
            let decided = (self.decide(&self.loaded, config, request, candidates, facts)).await;
            let (outcome, decided_by) = match decided {
                Err(_) if self.fallback => {
                    let default = self.host.default_placer();
                    let outcome = (self.decide(&default, None, request, candidates, facts)).await;
                    (outcome, default.id.clone())
                }
                outcome => (outcome, self.loaded.id.clone()),
            };
            match outcome {
                Ok(Ok(choice)) => Ok((choice, decided_by)),
                Ok(Err(reason)) => Err(Refusal::Unschedulable(reason.chars().take(500).collect())),
                Err(failure) => Err(Refusal::Failed(failure)),
            }
        })
    }
}

fn class(class: PolicyClass) -> wit::DeviceClass {
    match class {
        PolicyClass::Gpu => wit::DeviceClass::Gpu,
        PolicyClass::GpuMig => wit::DeviceClass::GpuMig,
        PolicyClass::GpuSlot => wit::DeviceClass::GpuSlot,
        PolicyClass::NicVf => wit::DeviceClass::NicVf,
        PolicyClass::Disk => wit::DeviceClass::Disk,
        PolicyClass::Node => wit::DeviceClass::Node,
    }
}

/// The request of one call, as the component takes it.
pub(super) fn request_to_wit(request: &PlacementRequest) -> wit::Request {
    wit::Request {
        devices: request
            .devices
            .iter()
            .map(|d| wit::DeviceRequest {
                class: class(d.class),
                count: d.count,
                model: d.model,
                nvlink_all: d.nvlink_all,
            })
            .collect(),
        spot: request.spot,
        duration_seconds: request.duration_seconds,
        models: request.models.clone(),
    }
}

/// A spot booking that could give way, as the preemptor takes it.
pub(super) fn spot_to_wit(spot: &SpotCandidate) -> wit::SpotBooking {
    wit::SpotBooking {
        id: spot.id,
        node: spot.node,
        units: wit::Span {
            start: spot.units.start,
            len: spot.units.len,
        },
        elapsed_seconds: spot.elapsed_seconds,
        started_at_ms: spot.started_at_ms,
    }
}

/// The parameters of the `place` export as the host lowers them, and its results.
pub(super) type PlaceParams<'a> = (&'a wit::Request, &'a CandidatesRef<'a>);
/// The parameters of a 0.1 placer's `place`.
pub(super) type PlaceParamsV0_1<'a> = (&'a wit::Request, &'a CandidatesRefV0_1<'a>);
pub(super) type PlaceResults = (Result<wit::Placement, String>,);

/// The parameters of the preemptor's `choose-victims` export, and its results.
pub(super) type VictimsParams<'a> = (
    &'a wit::Request,
    &'a CandidatesRef<'a>,
    &'a [wit::SpotBooking],
);
pub(super) type VictimsResults = (Result<Vec<u32>, String>,);
/// The parameters of a 0.1 preemptor's `choose-victims`.
pub(super) type VictimsParamsV0_1<'a> = (
    &'a wit::Request,
    &'a CandidatesRefV0_1<'a>,
    &'a [wit::SpotBooking],
);

/// The WIT `candidates` record borrowed from the columns of [`Candidates`]: a call lowers
/// each column into the plugin's memory as one copy, with no conversion on the host.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(super) struct CandidatesRef<'a> {
    nodes: NodesRef<'a>,
    units: UnitsRef<'a>,
    domains: DomainsRef<'a>,
    #[component(name = "node-facts")]
    node_facts: &'a NodeFacts,
}

/// The `candidates` record of `orl:policy@0.1.0`: the same columns without `node-facts`.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(super) struct CandidatesRefV0_1<'a> {
    nodes: NodesRef<'a>,
    units: UnitsRef<'a>,
    domains: DomainsRef<'a>,
}

#[derive(Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub(super) struct NodesRef<'a> {
    id: &'a [u32],
    #[component(name = "busy-units")]
    busy_units: &'a [u32],
    #[component(name = "total-units")]
    total_units: &'a [u32],
    #[component(name = "domains-start")]
    domains_start: &'a [u32],
    #[component(name = "domains-len")]
    domains_len: &'a [u32],
    #[component(name = "free-start")]
    free_start: &'a [u32],
    #[component(name = "free-len")]
    free_len: &'a [u32],
}

#[derive(Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub(super) struct UnitsRef<'a> {
    class: &'a [u8],
    model: &'a [u32],
    #[component(name = "nvlink-domain")]
    nvlink_domain: &'a [u32],
    #[component(name = "memory-gib")]
    memory_gib: &'a [u32],
}

#[derive(Clone, Copy, ComponentType, Lower)]
#[component(record)]
pub(super) struct DomainsRef<'a> {
    domain: &'a [u32],
    busy: &'a [u32],
    total: &'a [u32],
}

impl<'a> CandidatesRef<'a> {
    /// The candidates of a call with the facts of their nodes, `facts` (empty for a
    /// policy of a version without them).
    pub(super) fn of(candidates: &'a Candidates, facts: &'a NodeFacts) -> Self {
        let Candidates {
            nodes,
            units,
            domains,
        } = candidates;
        CandidatesRef {
            nodes: NodesRef {
                id: &nodes.id,
                busy_units: &nodes.busy_units,
                total_units: &nodes.total_units,
                domains_start: &nodes.domains_start,
                domains_len: &nodes.domains_len,
                free_start: &nodes.free_start,
                free_len: &nodes.free_len,
            },
            units: UnitsRef {
                class: &units.class,
                model: &units.model,
                nvlink_domain: &units.nvlink_domain,
                memory_gib: &units.memory_gib,
            },
            domains: DomainsRef {
                domain: &domains.domain,
                busy: &domains.busy,
                total: &domains.total,
            },
            node_facts: facts,
        }
    }

    /// The same candidates as a 0.1 policy takes them.
    pub(super) fn v0_1(&self) -> CandidatesRefV0_1<'a> {
        CandidatesRefV0_1 {
            nodes: self.nodes,
            units: self.units,
            domains: self.domains,
        }
    }
}
