//! The `preemptor` world export: converts the WIT records to this crate's types (nodes
//! and bookings with their units resolved from the candidate columns), runs
//! [`crate::choose_victims`] and converts the answer back.

wit_bindgen::generate!({
    path: "../../wit",
    world: "preemptor",
});

use orl::policy::log::{Level, log};
use orl::policy::types as wit;

struct DefaultPreemptor;

impl Guest for DefaultPreemptor {
    fn choose_victims(
        req: wit::Request,
        candidates: wit::Candidates,
        spot: Vec<wit::SpotBooking>,
    ) -> Result<Vec<u32>, String> {
        let req = request(req);
        let wit::Candidates {
            nodes,
            units,
            domains,
        } = candidates;
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
        let domains: Vec<crate::DomainLoad> = (0..domains.domain.len())
            .map(|i| crate::DomainLoad {
                domain: domains.domain[i],
                busy: domains.busy[i],
                total: domains.total[i],
            })
            .collect();
        let nodes: Vec<crate::Node> = (0..nodes.id.len())
            .map(|j| crate::Node {
                id: nodes.id[j],
                busy_units: nodes.busy_units[j],
                total_units: nodes.total_units[j],
                domains: run(&domains, nodes.domains_start[j], nodes.domains_len[j]).to_vec(),
                free: run(&units, nodes.free_start[j], nodes.free_len[j]).to_vec(),
            })
            .collect();
        let spot: Vec<crate::SpotBooking> = spot
            .into_iter()
            .map(|b| crate::SpotBooking {
                id: b.id,
                node: b.node,
                units: run(&units, b.units.start, b.units.len).to_vec(),
                elapsed_seconds: b.elapsed_seconds,
                started_at_ms: b.started_at_ms,
            })
            .collect();
        crate::choose_victims(&req, &nodes, &spot).map_err(|unsatisfiable| {
            log(Level::Debug, unsatisfiable.reason());
            unsatisfiable.into_reason()
        })
    }
}

/// The `len` entries of `list` from `start`; empty when they reach past the end.
fn run<T>(list: &[T], start: u32, len: u32) -> &[T] {
    let start = start as usize;
    list.get(start..start.saturating_add(len as usize))
        .unwrap_or(&[])
}

export!(DefaultPreemptor);

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
