//! Placement through a WebAssembly component: the [`Placer`] seam implemented by running a
//! plugin instance, with its answer checked before the host trusts it.

use std::sync::Arc;

use serde_json::Value;

use super::bindings::placer::orl::policy::types as wit;
use super::{Failure, FailureKind, Loaded, PolicyHost};
use crate::booking::placement::{
    Candidates, Choice, NativeDefault, PlacementRequest, Placer, PolicyClass, Refusal, check_choice,
};
use crate::metrics::Metrics;

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

impl Placer for WasmPlacer {
    fn id(&self) -> String {
        self.loaded.id.clone()
    }

    fn place(
        &self,
        request: &PlacementRequest,
        candidates: &Candidates,
    ) -> Result<(Choice, String), Refusal> {
        let outcome = self
            .host
            .place(
                &self.loaded,
                request,
                candidates,
                self.config.as_ref(),
                self.deadline_ms,
            )
            .and_then(|answer| match answer {
                Ok(choice) => check_choice(request, candidates, &choice)
                    .map(|()| Ok(choice))
                    .map_err(|message| Failure {
                        plugin_id: self.loaded.id.clone(),
                        kind: FailureKind::InvalidAnswer,
                        message,
                    }),
                Err(reason) => Ok(Err(reason)),
            });
        match outcome {
            Ok(Ok(choice)) => {
                self.metrics
                    .observe_decision(&self.loaded.id, "placer", "placed");
                Ok((choice, self.loaded.id.clone()))
            }
            Ok(Err(reason)) => {
                self.metrics
                    .observe_decision(&self.loaded.id, "placer", "unschedulable");
                Err(Refusal::Unschedulable(reason.chars().take(500).collect()))
            }
            Err(failure) => {
                self.metrics
                    .observe_decision(&self.loaded.id, "placer", failure.kind.as_str());
                tracing::warn!(plugin = %failure.plugin_id, kind = failure.kind.as_str(), message = %failure.message, "placement plugin failed");
                if self.fallback {
                    let (choice, native) = NativeDefault.place(request, candidates)?;
                    Ok((
                        choice,
                        format!(
                            "{native} (fallback: {} failed with {})",
                            failure.plugin_id,
                            failure.kind.as_str()
                        ),
                    ))
                } else {
                    Err(Refusal::Failed(failure))
                }
            }
        }
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

/// A spot booking that could give way, as the preemptor takes it.
pub(super) fn spot_to_wit(spot: &crate::booking::placement::SpotCandidate) -> wit::SpotBooking {
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

/// `units.nvlink-domain` of a unit in no NVLink domain.
const NO_DOMAIN: u32 = u32::MAX;

/// The records of one call, as the component takes them: columns of numbers, whatever the
/// number of candidates. Unit ids are their positions, as the snapshot already numbers them.
pub(super) fn to_wit(
    request: &PlacementRequest,
    candidates: &Candidates,
) -> (wit::Request, wit::Candidates) {
    let request = wit::Request {
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
    };
    let nodes = &candidates.nodes;
    let units = &candidates.units;
    let domains = &candidates.domains;
    let candidates = wit::Candidates {
        nodes: wit::Nodes {
            id: nodes.iter().map(|n| n.id).collect(),
            busy_units: nodes.iter().map(|n| n.busy_units).collect(),
            total_units: nodes.iter().map(|n| n.total_units).collect(),
            domains_start: nodes.iter().map(|n| n.domains.start).collect(),
            domains_len: nodes.iter().map(|n| n.domains.len).collect(),
            free_start: nodes.iter().map(|n| n.free.start).collect(),
            free_len: nodes.iter().map(|n| n.free.len).collect(),
        },
        units: wit::Units {
            class: units.iter().map(|u| class(u.class)).collect(),
            model: units.iter().map(|u| u.model).collect(),
            nvlink_domain: units
                .iter()
                .map(|u| u.nvlink_domain.unwrap_or(NO_DOMAIN))
                .collect(),
            memory_gib: units.iter().map(|u| u.memory_gib).collect(),
        },
        domains: wit::Domains {
            domain: domains.iter().map(|d| d.domain).collect(),
            busy: domains.iter().map(|d| d.busy).collect(),
            total: domains.iter().map(|d| d.total).collect(),
        },
    };
    (request, candidates)
}
