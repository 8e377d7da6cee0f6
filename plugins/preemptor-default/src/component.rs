//! The `preemptor` world export: converts the WIT records to this crate's types (nodes
//! and bookings with their units resolved from the flat candidate lists), runs
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
        let units: Vec<crate::Unit> = candidates.units.into_iter().map(unit).collect();
        let domains: Vec<crate::DomainLoad> = candidates
            .domains
            .into_iter()
            .map(|d| crate::DomainLoad {
                domain: d.domain,
                busy: d.busy,
                total: d.total,
            })
            .collect();
        let nodes: Vec<crate::Node> = candidates
            .nodes
            .into_iter()
            .map(|n| crate::Node {
                id: n.id,
                busy_units: n.busy_units,
                total_units: n.total_units,
                domains: run(&domains, n.domains).to_vec(),
                free: run(&units, n.free).to_vec(),
            })
            .collect();
        let spot: Vec<crate::SpotBooking> = spot
            .into_iter()
            .map(|b| crate::SpotBooking {
                id: b.id,
                node: b.node,
                units: run(&units, b.units).to_vec(),
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

/// The entries of `list` that `span` covers; empty when it reaches past the end.
fn run<T>(list: &[T], span: wit::Span) -> &[T] {
    let start = span.start as usize;
    list.get(start..start.saturating_add(span.len as usize))
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

fn unit(unit: wit::Unit) -> crate::Unit {
    crate::Unit {
        id: unit.id,
        class: class(unit.class),
        model: unit.model,
        nvlink_domain: unit.nvlink_domain,
        memory_gib: unit.memory_gib,
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
