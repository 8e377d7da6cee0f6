//! The `placer` world export: the WIT records become this crate's columns without copying,
//! [`crate::place`] decides, and the answer goes back.

wit_bindgen::generate!({
    path: "../../wit",
    world: "placer",
});

use orl::policy::log::{Level, log};
use orl::policy::types as wit;

struct DefaultPlacer;

impl Guest for DefaultPlacer {
    fn place(req: wit::Request, candidates: wit::Candidates) -> Result<wit::Placement, String> {
        let req = request(req);
        match crate::place(&req, &self::candidates(candidates)) {
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

export!(DefaultPlacer);

fn class(class: wit::DeviceClass) -> crate::DeviceClass {
    match class {
        wit::DeviceClass::Gpu => crate::DeviceClass::Gpu,
        wit::DeviceClass::GpuMig => crate::DeviceClass::GpuMig,
        wit::DeviceClass::GpuSlot => crate::DeviceClass::GpuSlot,
        wit::DeviceClass::NicVf => crate::DeviceClass::NicVf,
        wit::DeviceClass::Disk => crate::DeviceClass::Disk,
        wit::DeviceClass::Node => crate::DeviceClass::Node,
    }
}

/// The columns of the call, moved as they are.
fn candidates(candidates: wit::Candidates) -> crate::Candidates {
    let wit::Candidates {
        nodes,
        units,
        domains,
    } = candidates;
    crate::Candidates {
        nodes: crate::Nodes {
            id: nodes.id,
            busy_units: nodes.busy_units,
            total_units: nodes.total_units,
            domains_start: nodes.domains_start,
            domains_len: nodes.domains_len,
            free_start: nodes.free_start,
            free_len: nodes.free_len,
        },
        units: crate::Units {
            class: units.class,
            model: units.model,
            nvlink_domain: units.nvlink_domain,
            memory_gib: units.memory_gib,
        },
        domains: crate::Domains {
            domain: domains.domain,
            busy: domains.busy,
            total: domains.total,
        },
    }
}

fn request(req: wit::Request) -> crate::Request {
    crate::Request {
        devices: req
            .devices
            .into_iter()
            .map(|d| crate::DeviceRequest {
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
