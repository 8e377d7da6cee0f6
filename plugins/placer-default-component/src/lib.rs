//! The default placement policy of orl (`orl-placer-default`) as a WebAssembly component
//! of the `placer` world: the records the kit hands over become the policy's columns
//! without copying, [`orl_placer_default::place`] decides, and the answer goes back.
//!
//! Built for `wasm32-wasip2` by the host's build script, which embeds the result in the
//! `orl` binary.

use orl_placer_default as policy;
use orl_policy_kit::log::{Level, log};
use orl_policy_kit::types as wit;

struct DefaultPlacer;

impl orl_policy_kit::Placer for DefaultPlacer {
    fn place(req: wit::Request, candidates: wit::Candidates) -> Result<wit::Placement, String> {
        match policy::place(&request(req), &self::candidates(candidates)) {
            Ok(placement) => Ok(wit::Placement {
                node: placement.node,
                units: placement.units,
            }),
            Err(unschedulable) => {
                log(Level::Debug, unschedulable.reason());
                Err(unschedulable.into_reason())
            }
        }
    }
}

orl_policy_kit::export_placer!(DefaultPlacer);

/// The policy's class of a WIT class: the same case, by its code.
fn class(class: wit::DeviceClass) -> policy::DeviceClass {
    policy::DeviceClass::ALL[usize::from(class.code())]
}

/// The columns of the call, moved as they are. The default placer does not look at the
/// node facts.
fn candidates(candidates: wit::Candidates) -> policy::Candidates {
    let wit::Candidates {
        nodes,
        units,
        domains,
        node_facts: _,
    } = candidates;
    policy::Candidates {
        nodes: policy::Nodes {
            id: nodes.id,
            busy_units: nodes.busy_units,
            total_units: nodes.total_units,
            domains_start: nodes.domains_start,
            domains_len: nodes.domains_len,
            free_start: nodes.free_start,
            free_len: nodes.free_len,
        },
        units: policy::Units {
            class: units.class,
            model: units.model,
            nvlink_domain: units.nvlink_domain,
            memory_gib: units.memory_gib,
        },
        domains: policy::Domains {
            domain: domains.domain,
            busy: domains.busy,
            total: domains.total,
        },
    }
}

/// The request, its entries converted and its model names moved.
pub(crate) fn request(req: wit::Request) -> policy::Request {
    policy::Request {
        devices: req
            .devices
            .into_iter()
            .map(|d| policy::DeviceRequest {
                class: class(d.class),
                count: d.count,
                model: d.model,
                nvlink_all: d.nvlink_all,
            })
            .collect(),
        spot: req.spot,
        duration_seconds: req.duration_seconds,
        models: req.models,
    }
}
