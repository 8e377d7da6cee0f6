//! The `placer` world export: converts the WIT records to this crate's types, runs
//! [`crate::place`] and converts the answer back.

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

/// The columns of the call as this crate's rows; a unit's id is its position.
fn candidates(candidates: wit::Candidates) -> crate::Candidates {
    let wit::Candidates {
        nodes,
        units,
        domains,
    } = candidates;
    crate::Candidates {
        nodes: (0..nodes.id.len())
            .map(|j| crate::Node {
                id: nodes.id[j],
                busy_units: nodes.busy_units[j],
                total_units: nodes.total_units[j],
                domains: crate::Span {
                    start: nodes.domains_start[j],
                    len: nodes.domains_len[j],
                },
                free: crate::Span {
                    start: nodes.free_start[j],
                    len: nodes.free_len[j],
                },
            })
            .collect(),
        units: (0..units.class.len())
            .map(|i| crate::Unit {
                id: i as u32,
                class: class(units.class[i]),
                model: units.model[i],
                nvlink_domain: Some(units.nvlink_domain[i]).filter(|d| *d != u32::MAX),
                memory_gib: units.memory_gib[i],
            })
            .collect(),
        domains: (0..domains.domain.len())
            .map(|i| crate::DomainLoad {
                domain: domains.domain[i],
                busy: domains.busy[i],
                total: domains.total[i],
            })
            .collect(),
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
