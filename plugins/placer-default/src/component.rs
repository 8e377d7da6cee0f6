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

fn unit(unit: wit::Unit) -> crate::Unit {
    crate::Unit {
        id: unit.id,
        class: class(unit.class),
        model: unit.model,
        nvlink_domain: unit.nvlink_domain,
        memory_gib: unit.memory_gib,
    }
}

fn span(span: wit::Span) -> crate::Span {
    crate::Span {
        start: span.start,
        len: span.len,
    }
}

fn candidates(candidates: wit::Candidates) -> crate::Candidates {
    crate::Candidates {
        nodes: candidates
            .nodes
            .into_iter()
            .map(|n| crate::Node {
                id: n.id,
                busy_units: n.busy_units,
                total_units: n.total_units,
                domains: span(n.domains),
                free: span(n.free),
            })
            .collect(),
        units: candidates.units.into_iter().map(unit).collect(),
        domains: candidates
            .domains
            .into_iter()
            .map(|d| crate::DomainLoad {
                domain: d.domain,
                busy: d.busy,
                total: d.total,
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
