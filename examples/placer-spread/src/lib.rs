//! An example placement policy for orl: spread requests over the least busy nodes.
//!
//! Where the default placer packs work onto busy nodes to keep whole nodes free, this one
//! does the opposite: it puts a request on the node with the fewest busy units (then the
//! lowest node id), which evens out heat and noisy neighbours at the cost of fragmentation.
//! It still keeps every rule the host checks: all units on one node, each of its entry's
//! class and model, and the units of an `nvlink_all` entry in one NVLink domain.
//!
//! Within the node, an `nvlink_all` entry takes the domain with the most free matching
//! units (then the lowest domain id), and every entry takes the lowest unit ids it can.
//! Entries are served `nvlink_all` first, largest first, then those pinned to a model, then
//! the rest, each once, without revisiting earlier choices: simple, and enough for the
//! requests this example is meant for.
//!
//! It is written with the author kit, `orl-policy-kit`: the records are the kit's, so this
//! crate declares only the rows it reads them into ([`Node`]), the policy ([`place`]) and
//! the export of the `placer` world ([`SpreadPlacer`]). Everything but the export's glue
//! is plain Rust, unit-tested natively; built for `wasm32-wasip2`, the crate is the
//! component.

use std::cmp::Reverse;

use orl_policy_kit::Unit;
use orl_policy_kit::types::{Candidates, Placement, Request};

/// The `placer` world's export: rows from the candidate columns, then [`place`].
pub struct SpreadPlacer;

impl orl_policy_kit::Placer for SpreadPlacer {
    fn place(req: Request, candidates: Candidates) -> Result<Placement, String> {
        place(&req, &nodes(&candidates))
    }
}

orl_policy_kit::export_placer!(SpreadPlacer);

/// A candidate node with its free units as rows (WIT `nodes`, one entry; the per-domain
/// load is not needed by this policy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The host's index for the node, unique within one call.
    pub id: u32,
    /// Units booked at some point of the requested window.
    pub busy_units: u32,
    /// All units of the node.
    pub total_units: u32,
    /// The units the request may take. A unit whose class code this kit does not know is
    /// left out: it matches nothing.
    pub free: Vec<Unit>,
}

/// The candidate nodes as rows, in the order the host listed them.
pub fn nodes(candidates: &Candidates) -> Vec<Node> {
    (0..candidates.nodes.id.len())
        .map(|j| Node {
            id: candidates.nodes.id[j],
            busy_units: candidates.nodes.busy_units[j],
            total_units: candidates.nodes.total_units[j],
            free: candidates
                .free(j)
                .filter_map(|id| candidates.unit(id))
                .collect(),
        })
        .collect()
}

/// Places `req` on the least busy node that holds it, or says why none does.
pub fn place(req: &Request, nodes: &[Node]) -> Result<Placement, String> {
    if req.unit_count() == 0 {
        return Err("the request asks for no devices".to_string());
    }
    let mut by_load: Vec<&Node> = nodes.iter().collect();
    by_load.sort_by_key(|n| (n.busy_units, n.id));
    by_load
        .into_iter()
        .find_map(|node| place_on(req, node))
        .ok_or_else(|| format!("no node has room for {}", describe(req)))
}

/// The units of `node` this policy gives `req`, or `None` when it does not fit there.
pub fn place_on(req: &Request, node: &Node) -> Option<Placement> {
    let mut order: Vec<usize> = (0..req.devices.len()).collect();
    order.sort_by_key(|&i| {
        let d = &req.devices[i];
        (
            !d.nvlink_all,
            Reverse(if d.nvlink_all { d.count } else { 0 }),
            d.model.is_none(),
            i,
        )
    });

    let mut units: Vec<&Unit> = node.free.iter().collect();
    units.sort_by_key(|u| u.id);
    let mut taken = vec![false; units.len()];
    let mut chosen: Vec<Vec<u32>> = vec![Vec::new(); req.devices.len()];
    for i in order {
        let entry = &req.devices[i];
        if entry.count == 0 {
            continue;
        }
        let open: Vec<usize> = (0..units.len())
            .filter(|&u| !taken[u] && entry.accepts(units[u]))
            .collect();
        let picked: Vec<usize> = if entry.nvlink_all {
            let domain = roomiest_domain(&units, &open)?;
            if domain.1 < entry.count as usize {
                return None;
            }
            open.into_iter()
                .filter(|&u| units[u].nvlink_domain == Some(domain.0))
                .take(entry.count as usize)
                .collect()
        } else {
            if open.len() < entry.count as usize {
                return None;
            }
            open.into_iter().take(entry.count as usize).collect()
        };
        for &u in &picked {
            taken[u] = true;
        }
        chosen[i] = picked.into_iter().map(|u| units[u].id).collect();
    }
    Some(Placement {
        node: node.id,
        units: chosen.concat(),
    })
}

/// The domain with the most of the `open` units, then the lowest id, with that count.
fn roomiest_domain(units: &[&Unit], open: &[usize]) -> Option<(u32, usize)> {
    let mut domains: Vec<u32> = open
        .iter()
        .filter_map(|&u| units[u].nvlink_domain)
        .collect();
    domains.sort_unstable();
    domains.dedup();
    domains
        .into_iter()
        .map(|d| {
            (
                d,
                open.iter()
                    .filter(|&&u| units[u].nvlink_domain == Some(d))
                    .count(),
            )
        })
        .max_by_key(|&(d, count)| (count, Reverse(d)))
}

/// `8 gpu units of model H100 in one NVLink domain and 1 nic-vf unit`.
fn describe(req: &Request) -> String {
    let parts: Vec<String> = req
        .devices
        .iter()
        .filter(|d| d.count > 0)
        .map(|d| {
            let model = match d.model {
                Some(m) => format!(" of model {}", req.model_name(m)),
                None => String::new(),
            };
            let plural = if d.count == 1 { "" } else { "s" };
            let nvlink = if d.nvlink_all {
                " in one NVLink domain"
            } else {
                ""
            };
            format!("{} {} unit{plural}{model}{nvlink}", d.count, d.class)
        })
        .collect();
    parts.join(" and ")
}

#[cfg(test)]
mod tests {
    use orl_policy_kit::types::{DeviceClass, DeviceRequest};

    use super::*;

    fn gpu(id: u32, domain: Option<u32>) -> Unit {
        Unit {
            id,
            class: DeviceClass::Gpu,
            model: 0,
            nvlink_domain: domain,
            memory_gib: 80,
        }
    }

    fn node(id: u32, busy_units: u32, free: Vec<Unit>) -> Node {
        Node {
            id,
            busy_units,
            total_units: 8,
            free,
        }
    }

    fn gpus(count: u32, nvlink_all: bool) -> Request {
        Request {
            devices: vec![DeviceRequest {
                class: DeviceClass::Gpu,
                count,
                model: Some(0),
                nvlink_all,
            }],
            spot: false,
            duration_seconds: 3600,
            models: vec!["H100".to_string()],
        }
    }

    #[test]
    fn requests_go_to_the_least_busy_node() {
        let nodes = [
            node(1, 6, vec![gpu(0, Some(0)), gpu(1, Some(0))]),
            node(2, 2, vec![gpu(2, Some(0)), gpu(3, Some(0))]),
        ];

        assert_eq!(
            place(&gpus(2, false), &nodes),
            Ok(Placement {
                node: 2,
                units: vec![2, 3]
            })
        );
    }

    #[test]
    fn equally_busy_nodes_go_to_the_lowest_id() {
        let nodes = [
            node(9, 1, vec![gpu(5, None)]),
            node(4, 1, vec![gpu(6, None)]),
        ];

        assert_eq!(place(&gpus(1, false), &nodes).unwrap().node, 4);
    }

    #[test]
    fn a_less_busy_node_without_room_is_skipped() {
        let nodes = [
            node(1, 0, vec![gpu(0, None)]),
            node(2, 5, vec![gpu(1, None), gpu(2, None)]),
        ];

        assert_eq!(place(&gpus(2, false), &nodes).unwrap().node, 2);
    }

    #[test]
    fn nvlink_all_stays_inside_one_domain() {
        let free = vec![
            gpu(0, Some(0)),
            gpu(1, Some(1)),
            gpu(2, Some(1)),
            gpu(3, Some(0)),
            gpu(4, Some(1)),
        ];
        let nodes = [node(1, 0, free)];

        assert_eq!(place(&gpus(3, true), &nodes).unwrap().units, vec![1, 2, 4]);
        assert_eq!(
            place(&gpus(4, true), &nodes),
            Err("no node has room for 4 gpu units of model H100 in one NVLink domain".to_string())
        );
    }

    #[test]
    fn class_and_model_are_respected() {
        let mut other_model = gpu(0, None);
        other_model.model = 1;
        let mut nic = gpu(1, None);
        nic.class = DeviceClass::NicVf;
        let nodes = [node(1, 0, vec![other_model, nic, gpu(2, None)])];

        assert_eq!(place(&gpus(1, false), &nodes).unwrap().units, vec![2]);
        assert!(place(&gpus(2, false), &nodes).is_err());
    }

    #[test]
    fn units_are_listed_entry_by_entry_in_request_order() {
        let mut nic = gpu(7, None);
        nic.class = DeviceClass::NicVf;
        let nodes = [node(1, 0, vec![gpu(0, Some(0)), gpu(1, Some(0)), nic])];
        let mut req = gpus(2, true);
        req.devices.insert(
            0,
            DeviceRequest {
                class: DeviceClass::NicVf,
                count: 1,
                model: None,
                nvlink_all: false,
            },
        );

        assert_eq!(place(&req, &nodes).unwrap().units, vec![7, 0, 1]);
    }

    #[test]
    fn a_request_for_nothing_is_refused() {
        assert_eq!(
            place(&gpus(0, false), &[node(1, 0, vec![gpu(0, None)])]),
            Err("the request asks for no devices".to_string())
        );
    }
}
