//! The `placer` world export: converts the WIT records to this crate's types, runs
//! [`crate::place`] and converts the answer back.

wit_bindgen::generate!({
    path: "../../wit",
    world: "placer",
});

use orl::policy::types as wit;

struct SpreadPlacer;

impl Guest for SpreadPlacer {
    fn place(req: wit::Request, nodes: Vec<wit::Node>) -> Result<wit::Placement, String> {
        let req = crate::Request {
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
            models: req.models,
        };
        let nodes: Vec<crate::Node> = nodes
            .into_iter()
            .map(|n| crate::Node {
                id: n.id,
                busy_units: n.busy_units,
                total_units: n.total_units,
                free: n
                    .free
                    .into_iter()
                    .map(|u| crate::Unit {
                        id: u.id,
                        class: class(u.class),
                        model: u.model,
                        nvlink_domain: u.nvlink_domain,
                        memory_gib: u.memory_gib,
                    })
                    .collect(),
            })
            .collect();
        crate::place(&req, &nodes).map(|p| wit::Placement {
            node: p.node,
            units: p.units,
        })
    }
}

export!(SpreadPlacer);

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
