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
    fn place(req: wit::Request, nodes: Vec<wit::Node>) -> Result<wit::Placement, String> {
        let req = request(req);
        let nodes: Vec<crate::Node> = nodes.into_iter().map(node).collect();
        match crate::place(&req, &nodes) {
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

fn node(node: wit::Node) -> crate::Node {
    crate::Node {
        id: node.id,
        busy_units: node.busy_units,
        total_units: node.total_units,
        domains: node
            .domains
            .into_iter()
            .map(|d| crate::DomainLoad {
                domain: d.domain,
                busy: d.busy,
                total: d.total,
            })
            .collect(),
        free: node.free.into_iter().map(unit).collect(),
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
