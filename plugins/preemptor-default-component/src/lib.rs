//! The default preemption policy of orl (`orl-preemptor-default`) as a WebAssembly
//! component of the `preemptor` world: the records the kit hands over become the policy's
//! nodes and bookings (their units resolved from the candidate columns),
//! [`orl_preemptor_default::choose_victims`] decides, and the answer goes back.
//!
//! Built for `wasm32-wasip2` by the host's build script, which embeds the result in the
//! `orl` binary.

use orl_policy_kit::log::{Level, log};
use orl_policy_kit::types as wit;
use orl_preemptor_default as policy;

struct DefaultPreemptor;

impl orl_policy_kit::Preemptor for DefaultPreemptor {
    fn choose_victims(
        req: wit::Request,
        candidates: wit::Candidates,
        spot: Vec<wit::SpotBooking>,
    ) -> Result<Vec<u32>, String> {
        let columns = &candidates.units;
        let units: Vec<policy::Unit> = (0..columns.class.len())
            .map(|i| {
                let code = columns.class[i];
                let class = wit::DeviceClass::from_code(code)
                    .ok_or_else(|| format!("unknown device class code {code}"))?;
                Ok(policy::Unit {
                    id: i as u32,
                    class: self::class(class),
                    model: columns.model[i],
                    nvlink_domain: Some(columns.nvlink_domain[i])
                        .filter(|d| *d != orl_policy_kit::NO_DOMAIN),
                    memory_gib: columns.memory_gib[i],
                })
            })
            .collect::<Result<_, String>>()?;
        let nodes: Vec<policy::Node> = (0..candidates.nodes.id.len())
            .map(|j| policy::Node {
                id: candidates.nodes.id[j],
                busy_units: candidates.nodes.busy_units[j],
                total_units: candidates.nodes.total_units[j],
                domains: candidates
                    .domains_of(j)
                    .map(|i| policy::DomainLoad {
                        domain: candidates.domains.domain[i],
                        busy: candidates.domains.busy[i],
                        total: candidates.domains.total[i],
                    })
                    .collect(),
                free: run(&units, candidates.free(j)).to_vec(),
            })
            .collect();
        let spot: Vec<policy::SpotBooking> = spot
            .into_iter()
            .map(|b| policy::SpotBooking {
                id: b.id,
                node: b.node,
                units: run(
                    &units,
                    b.units.start..b.units.start.saturating_add(b.units.len),
                )
                .to_vec(),
                elapsed_seconds: b.elapsed_seconds,
                started_at_ms: b.started_at_ms,
            })
            .collect();
        policy::choose_victims(&request(req), &nodes, &spot).map_err(|unsatisfiable| {
            log(Level::Debug, unsatisfiable.reason());
            unsatisfiable.into_reason()
        })
    }
}

orl_policy_kit::export_preemptor!(DefaultPreemptor);

/// The units of `ids`; none when the run reaches past the end.
fn run(units: &[policy::Unit], ids: std::ops::Range<u32>) -> &[policy::Unit] {
    units
        .get(ids.start as usize..ids.end as usize)
        .unwrap_or(&[])
}

/// The policy's class of a WIT class: the same case, by its code.
fn class(class: wit::DeviceClass) -> policy::DeviceClass {
    policy::DeviceClass::ALL[usize::from(class.code())]
}

/// The request, its entries converted and its model names moved.
fn request(req: wit::Request) -> policy::Request {
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
