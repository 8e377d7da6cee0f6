//! The `placer` world export: converts the WIT records to this crate's types (each node
//! with its free units resolved from the candidate columns), runs
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
        let wit::Candidates { nodes, units, .. } = candidates;
        let units: Vec<crate::Unit> = (0..units.class.len())
            .map(|i| {
                Ok(crate::Unit {
                    id: i as u32,
                    class: class_of(units.class[i])?,
                    model: units.model[i],
                    nvlink_domain: Some(units.nvlink_domain[i]).filter(|d| *d != u32::MAX),
                    memory_gib: units.memory_gib[i],
                })
            })
            .collect::<Result<_, String>>()?;
        let nodes: Vec<crate::Node> = (0..nodes.id.len())
            .map(|j| {
                let start = nodes.free_start[j] as usize;
                crate::Node {
                    id: nodes.id[j],
                    busy_units: nodes.busy_units[j],
                    total_units: nodes.total_units[j],
                    free: units
                        .get(start..start + nodes.free_len[j] as usize)
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

/// The class of a `units.class` code: the position of its case in the WIT enum.
fn class_of(code: u8) -> Result<crate::DeviceClass, String> {
    use wit::DeviceClass::*;
    [Gpu, GpuMig, GpuSlot, NicVf, Disk, Node]
        .get(usize::from(code))
        .map(|c| class(*c))
        .ok_or_else(|| format!("unknown device class code {code}"))
}
