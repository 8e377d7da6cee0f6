//! The `placer` world export: converts the WIT records to this crate's types (each node
//! with its free units resolved from the flat `candidates.units`), runs
//! [`crate::place`] and converts the answer back.

wit_bindgen::generate!({
    path: "../../wit",
    world: "placer",
});

use orl::policy::types as wit;

struct SpreadPlacer;

impl Guest for SpreadPlacer {
    fn place(req: wit::Request, candidates: wit::Candidates) -> Result<wit::Placement, String> {
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
        let units: Vec<crate::Unit> = candidates
            .units
            .into_iter()
            .map(|u| crate::Unit {
                id: u.id,
                class: class(u.class),
                model: u.model,
                nvlink_domain: u.nvlink_domain,
                memory_gib: u.memory_gib,
            })
            .collect();
        let nodes: Vec<crate::Node> = candidates
            .nodes
            .into_iter()
            .map(|n| {
                let start = n.free.start as usize;
                crate::Node {
                    id: n.id,
                    busy_units: n.busy_units,
                    total_units: n.total_units,
                    free: units
                        .get(start..start + n.free.len as usize)
                        .unwrap_or(&[])
                        .to_vec(),
                }
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
