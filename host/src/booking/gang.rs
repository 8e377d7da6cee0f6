//! Gangs: a request with `gang.size` members, each member the request's devices (and host
//! resources) on one node, every member on a different node, placed all or none.
//!
//! The placer interface stays one request, one node: the pool's placer is asked once per
//! member, each time over the candidates minus the nodes earlier members took, and every
//! answer is checked like any other placement. When a member does not fit, nothing is
//! written and the whole gang is `pending` (`Unschedulable`). The members' bookings are
//! written in one savepoint, so a concurrent booking of any chosen unit undoes them all.
//!
//! With `gang.topologyKey`, every member shares the key's value: candidate nodes are grouped
//! by it and the groups tried in order, most free candidate units first (then by value),
//! the whole gang inside one group. The key is `region` (or
//! `topology.kubernetes.io/region`: the node's reported region) or any node label key (e.g.
//! `rack`: the value of that label on the node; unit labels play no part). Nodes without a
//! value for the key take no part.

use std::collections::{BTreeMap, BTreeSet};

use super::place::Chosen;
use super::placement::{Candidacy, Census, Snapshot};
use super::store::{Member, Reservation};
use crate::inventory::nodes::Node;
use crate::placer::{Candidates, Placer, Refusal, check_choice};
use crate::{Error, Result};

/// The node attribute every member of a gang must share (`gang.topologyKey`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyKey {
    /// The node's reported `region`.
    Region,
    /// The value of this node label (node labels only, not unit labels).
    Label(String),
}

impl TopologyKey {
    /// The keys that mean the node's `region`; any other well-formed label key names a
    /// node label.
    pub const REGION_KEYS: [&'static str; 2] = ["region", "topology.kubernetes.io/region"];

    /// The key `gang.topologyKey` names; `None` when it is not a label key either.
    pub fn parse(key: &str) -> Option<TopologyKey> {
        if Self::REGION_KEYS.contains(&key) {
            Some(TopologyKey::Region)
        } else if crate::inventory::is_label_key(key) {
            Some(TopologyKey::Label(key.to_string()))
        } else {
            None
        }
    }

    /// The node's value for this key; `None` when it reports none.
    pub fn value<'a>(&self, node: &'a Node) -> Option<&'a str> {
        match self {
            TopologyKey::Region => node.region.as_deref(),
            TopologyKey::Label(key) => node.labels.get(key).map(String::as_str),
        }
    }
}

/// The groups of nodes a gang may be placed in, in the order they are tried. `nodes` gives
/// each node's value for the topology key (`None`: no value) and its free candidate units.
/// Without a key (`keyed` false) every node is one group. Groups with more free units come
/// first; ties go to the smaller value. Node indices are ascending within a group.
pub fn groups(nodes: &[(Option<&str>, u32)], keyed: bool) -> Vec<Vec<usize>> {
    if !keyed {
        return vec![(0..nodes.len()).collect()];
    }
    let mut by_value: BTreeMap<&str, (u64, Vec<usize>)> = BTreeMap::new();
    for (i, (value, free)) in nodes.iter().enumerate() {
        if let Some(value) = value {
            let group = by_value.entry(value).or_default();
            group.0 += u64::from(*free);
            group.1.push(i);
        }
    }
    let mut ordered: Vec<(&str, (u64, Vec<usize>))> = by_value.into_iter().collect();
    // Stable: equal free capacity keeps the value order of the map.
    ordered.sort_by_key(|(_, (free, _))| std::cmp::Reverse(*free));
    ordered.into_iter().map(|(_, (_, nodes))| nodes).collect()
}

/// The candidates of `offer` on the nodes `keep` accepts (by candidate node id, which is the
/// node's index in the snapshot), renumbered so unit ids index the new list again; with
/// the snapshot (node, unit) behind each new unit id.
pub fn restrict(
    offer: &Candidacy,
    keep: impl Fn(u32) -> bool,
) -> (Candidates, Vec<(usize, usize)>) {
    let mut out = Candidates::default();
    let mut index = Vec::new();
    let from = &offer.candidates;
    for node in from.nodes.iter().filter(|n| keep(n.id)) {
        let units: Vec<_> = node
            .free
            .ids()
            .map(|id| {
                index.push(offer.index[id as usize]);
                from.units.get(id).expect("the snapshot's own units")
            })
            .collect();
        let domains = node.domains.range().filter_map(|i| from.domains.get(i));
        out.push_node(node.id, node.busy_units, node.total_units, domains, units);
    }
    (out, index)
}

/// Decides where every member of the gang `r` asks for goes on `snapshot`; or why it
/// does not fit, with the pool's census for one member. Nothing is written: the members
/// are booked together ([`super::place::book`]).
pub(super) async fn decide(
    placer: &dyn Placer,
    r: &Reservation,
    snapshot: &Snapshot,
) -> Result<std::result::Result<Chosen, (String, Option<Census>)>> {
    let Some(gang) = r.request.gang.clone() else {
        return Err(anyhow::anyhow!("gang placement without a gang").into());
    };
    let size = gang.size.max(1) as usize;
    let key = gang.topology_key.as_deref().and_then(TopologyKey::parse);
    let offer = snapshot.candidates(r, false, None);
    let mut free = vec![0u32; snapshot.len()];
    for node in offer.candidates.nodes.iter() {
        free[node.id as usize] = node.free.len;
    }
    let described: Vec<(Option<&str>, u32)> = snapshot
        .nodes()
        .zip(&free)
        .map(|(node, free)| (key.as_ref().map_or(Some(""), |k| k.value(node)), *free))
        .collect();
    let mut reason: Option<String> = None;
    let scope = |group: &[usize]| match (&key, group.first()) {
        (Some(k), Some(&n)) => format!(
            " in {} {}",
            gang.topology_key.as_deref().unwrap_or("region"),
            k.value(snapshot.node(n)).unwrap_or_default()
        ),
        _ => String::new(),
    };
    for group in groups(&described, key.is_some()) {
        // A group with fewer nodes offering anything than members cannot hold the gang.
        let offering = group.iter().filter(|&&n| free[n] > 0).count();
        if offering < size {
            reason.get_or_insert_with(|| {
                format!(
                    "a gang of {size} needs {size} nodes where the request fits{}; {offering} have free units",
                    scope(&group)
                )
            });
            continue;
        }
        let in_group: BTreeSet<u32> = group.iter().map(|&n| n as u32).collect();
        let mut taken: BTreeSet<u32> = BTreeSet::new();
        let mut members: Vec<Member> = Vec::new();
        let mut decided: Vec<String> = Vec::new();
        let mut claimed = false;
        let mut why = String::new();
        while members.len() < size {
            let (candidates, index) =
                restrict(&offer, |id| in_group.contains(&id) && !taken.contains(&id));
            if candidates.nodes.is_empty() {
                why = "no other node has room".into();
                break;
            }
            let facts = |c: &Candidates| snapshot.facts(c);
            let decision = (placer.place(&offer.request, &candidates, &facts)).await;
            let (choice, decided_by) = match decision {
                Ok(decision) => decision,
                Err(Refusal::Unschedulable(message)) => {
                    why = message;
                    break;
                }
                Err(Refusal::Failed(failure)) => return Err(Error::PolicyFailed(failure)),
            };
            if let Err(message) = check_choice(&offer.request, &candidates, &choice) {
                return Err(Error::PolicyFailed(crate::placer::Failure {
                    plugin_id: placer.id(),
                    kind: crate::placer::FailureKind::InvalidAnswer,
                    message,
                }));
            }
            let node = snapshot.node(choice.node as usize);
            let mut unit_ids: Vec<String> = choice
                .units
                .iter()
                .map(|u| node.units[index[*u as usize].1].id.clone())
                .collect();
            unit_ids.sort();
            taken.insert(choice.node);
            claimed |= snapshot.claimed(choice.node as usize);
            members.push(Member {
                node_id: node.id.clone(),
                unit_ids,
            });
            if !decided.contains(&decided_by) {
                decided.push(decided_by);
            }
        }
        if members.len() == size {
            return Ok(Ok(Chosen {
                members,
                decided_by: decided.join(", "),
                claimed,
            }));
        }
        if reason.is_none() {
            reason = Some(format!(
                "a gang of {size} needs {size} nodes where the request fits{}; {} found ({why})",
                scope(&group),
                members.len()
            ));
        }
    }
    let reason =
        reason.unwrap_or_else(|| "no node reports a value for the gang's topologyKey".to_string());
    Ok(Err((reason, offer.census)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placer::tests::{ask, unit};
    use crate::placer::{CandidateUnit, DomainLoad};

    /// Three snapshot nodes (0, 1, 2) with 2, 1 and 3 free units.
    fn offer() -> Candidacy {
        let mut candidates = Candidates::default();
        let mut index = Vec::new();
        for (node, free) in [(0u32, 2u32), (1, 1), (2, 3)] {
            let units: Vec<CandidateUnit> = (0..free)
                .map(|u| {
                    index.push((node as usize, u as usize));
                    unit(node)
                })
                .collect();
            let load = DomainLoad {
                domain: node,
                busy: 8 - free,
                total: 8,
            };
            candidates.push_node(node, 8 - free, 8, [load], units);
        }
        Candidacy {
            request: ask(1, false),
            candidates,
            index,
            census: None,
            spot: Vec::new(),
            spot_reservations: Vec::new(),
            partial: false,
        }
    }

    #[test]
    fn restricting_candidates_renumbers_units_and_keeps_the_snapshot_index() {
        let offer = offer();
        let (candidates, index) = restrict(&offer, |id| id != 1);
        assert_eq!(
            candidates.nodes.iter().map(|n| n.id).collect::<Vec<_>>(),
            [0, 2]
        );
        assert_eq!(candidates.units.len(), 5);
        assert_eq!(index, [(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)]);
        let last = candidates.nodes.get(1).unwrap();
        assert_eq!(last.free.ids(), 2..5);
        assert_eq!(
            candidates.domains.get(last.domains.start as usize),
            Some(DomainLoad {
                domain: 2,
                busy: 5,
                total: 8
            })
        );
    }

    #[test]
    fn an_answer_on_an_excluded_node_is_refused() {
        let offer = offer();
        let (candidates, _) = restrict(&offer, |id| id != 1);
        let on_taken = crate::placer::Choice {
            node: 1,
            units: vec![0],
        };
        assert!(check_choice(&offer.request, &candidates, &on_taken).is_err());
        let fine = crate::placer::Choice {
            node: 2,
            units: vec![2],
        };
        assert!(check_choice(&offer.request, &candidates, &fine).is_ok());
    }

    #[test]
    fn without_a_topology_key_every_node_is_one_group() {
        let nodes = [(Some(""), 3), (Some(""), 0), (None, 5)];
        assert_eq!(groups(&nodes, false), vec![vec![0, 1, 2]]);
    }

    #[test]
    fn topology_groups_go_most_free_capacity_first_then_by_value() {
        let nodes = [
            (Some("eu"), 8),
            (Some("us"), 8),
            (Some("us"), 4),
            (None, 64),
            (Some("ap"), 8),
            (Some("eu"), 4),
            (Some("ca"), 3),
        ];
        assert_eq!(
            groups(&nodes, true),
            vec![vec![0, 5], vec![1, 2], vec![4], vec![6]],
            "eu and us tie on 12 free units (eu first by name); a node without a region is in no group"
        );
    }

    fn gang_request(gang: serde_json::Value) -> crate::Result<crate::booking::CreateRequest> {
        let request: crate::booking::CreateRequest = serde_json::from_value(serde_json::json!({
            "tenantId": "tenant-a",
            "poolId": "pool_01jd0000000000000000000000",
            "devices": [{ "class": "gpu", "count": 8 }, { "class": "nic.vf", "count": 1 }],
            "duration": "2h",
            "idempotencyKey": "k-1",
            "gang": gang,
        }))
        .unwrap();
        request.validate().map(|()| request)
    }

    #[test]
    fn a_gang_charges_its_devices_and_host_excess_once_per_member() {
        let request = gang_request(serde_json::json!({ "size": 4 })).unwrap();
        let excess = crate::booking::HostBooking {
            vcpu: 2,
            memory_gib: 16,
            hugepages_1gi: 0,
        };
        let charge = crate::booking::quota_charge(&request, excess);
        assert_eq!(charge["gpu"], 32);
        assert_eq!(charge["nic.vf"], 4);
        assert_eq!(charge["vcpu"], 8);
        assert_eq!(charge["memoryGiB"], 64);
        assert_eq!(request.gpu_count(), 8, "per member");
        assert_eq!(request.total_gpu_count(), 32);
    }

    #[test]
    fn gang_size_and_topology_key_are_validated() {
        for key in [
            "region",
            "topology.kubernetes.io/region",
            "rack",
            "example.com/row",
        ] {
            assert!(
                gang_request(serde_json::json!({ "size": 2, "topologyKey": key })).is_ok(),
                "{key}"
            );
        }
        for (gang, field) in [
            (serde_json::json!({ "size": 1 }), "gang.size"),
            (serde_json::json!({ "size": 65 }), "gang.size"),
            (
                serde_json::json!({ "size": 2, "topologyKey": "nvlink switch" }),
                "gang.topologyKey",
            ),
            (
                serde_json::json!({ "size": 2, "topologyKey": "-rack" }),
                "gang.topologyKey",
            ),
            (
                serde_json::json!({ "size": 2, "topologyKey": "x".repeat(129) }),
                "gang.topologyKey",
            ),
        ] {
            let err = gang_request(gang.clone()).unwrap_err().to_string();
            assert!(err.starts_with(field), "{gang}: {err}");
        }
    }

    #[test]
    fn region_keys_mean_the_region_and_other_label_keys_a_node_label() {
        assert_eq!(TopologyKey::parse("region"), Some(TopologyKey::Region));
        assert_eq!(
            TopologyKey::parse("topology.kubernetes.io/region"),
            Some(TopologyKey::Region)
        );
        assert_eq!(
            TopologyKey::parse("rack"),
            Some(TopologyKey::Label("rack".into()))
        );
        assert_eq!(
            TopologyKey::parse("topology.kubernetes.io/zone"),
            Some(TopologyKey::Label("topology.kubernetes.io/zone".into()))
        );
        assert_eq!(TopologyKey::parse("nvlink switch"), None);
        assert_eq!(TopologyKey::parse("Example.com/rack"), None);
        assert_eq!(TopologyKey::parse(""), None);
    }

    fn node(region: Option<&str>, labels: &[(&str, &str)]) -> Node {
        let host = crate::inventory::HostResources {
            vcpu: 224,
            memory_gib: 2048,
            hugepages_1gi: 0,
        };
        Node {
            region: region.map(Into::into),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Node::sample("n", host, Vec::new())
        }
    }

    #[test]
    fn a_label_key_groups_nodes_by_their_label_and_leaves_out_nodes_without_it() {
        let rack = TopologyKey::parse("rack").unwrap();
        let region = TopologyKey::parse("region").unwrap();
        let nodes = [
            node(Some("eu"), &[("rack", "r2")]),
            node(Some("eu"), &[("rack", "r1")]),
            node(Some("eu"), &[("row", "7")]),
            node(None, &[("rack", "r2")]),
            node(Some("us"), &[("rack", "r1"), ("region", "ignored")]),
        ];
        assert_eq!(rack.value(&nodes[0]), Some("r2"));
        assert_eq!(rack.value(&nodes[2]), None);
        assert_eq!(region.value(&nodes[3]), None);
        assert_eq!(
            region.value(&nodes[4]),
            Some("us"),
            "the region, not a label"
        );
        let described: Vec<(Option<&str>, u32)> =
            nodes.iter().map(|n| (rack.value(n), 8)).collect();
        assert_eq!(
            groups(&described, true),
            vec![vec![1, 4], vec![0, 3]],
            "r1 and r2 tie on 16 free units (r1 first); the node without a rack is in no group"
        );
    }
}
