use super::*;

const H100: u32 = 0;
const A100: u32 = 1;

/// Unit `id`: a unit's id is its position among all units of the call, so the tests
/// number them in the order the nodes list them (checked by [`candidates`]).
fn unit(id: u32, class: DeviceClass, model: u32, domain: Option<u32>) -> (u32, Unit) {
    let unit = Unit {
        class,
        model,
        nvlink_domain: domain,
        memory_gib: 80,
    };
    (id, unit)
}

/// H100 GPUs `ids` in NVLink domain `domain`.
fn h100s(ids: std::ops::Range<u32>, domain: u32) -> Vec<(u32, Unit)> {
    ids.map(|id| unit(id, DeviceClass::Gpu, H100, Some(domain)))
        .collect()
}

/// A candidate node written out whole; the tests flatten a list of them into
/// [`Candidates`] as the host does.
#[derive(Clone)]
struct TestNode {
    id: u32,
    busy_units: u32,
    domains: Vec<DomainLoad>,
    free: Vec<(u32, Unit)>,
}

fn node(id: u32, busy_units: u32, domains: &[(u32, u32, u32)], free: Vec<(u32, Unit)>) -> TestNode {
    TestNode {
        id,
        busy_units,
        domains: domains
            .iter()
            .map(|&(domain, busy, total)| DomainLoad {
                domain,
                busy,
                total,
            })
            .collect(),
        free,
    }
}

fn candidates(nodes: &[TestNode]) -> Candidates {
    let mut candidates = Candidates::default();
    for n in nodes {
        for (position, (id, _)) in (candidates.units.len() as u32..).zip(&n.free) {
            assert_eq!(*id, position, "test units are numbered by position");
        }
        let free = n.free.iter().map(|(_, unit)| *unit);
        candidates.push_node(n.id, n.busy_units, 16, n.domains.clone(), free);
    }
    candidates
}

/// [`super::place`] over `nodes` flattened.
fn place(req: &Request, nodes: &[TestNode]) -> Result<Placement, Unschedulable> {
    super::place(req, &candidates(nodes))
}

fn gpus(count: u32, nvlink_all: bool) -> DeviceRequest {
    DeviceRequest {
        class: DeviceClass::Gpu,
        count,
        model: Some(H100),
        nvlink_all,
    }
}

fn request(devices: Vec<DeviceRequest>) -> Request {
    Request {
        devices,
        spot: false,
        duration_seconds: 3600,
        models: vec!["H100".to_string(), "A100".to_string()],
    }
}

#[test]
fn nvlink_all_fits_inside_one_domain() {
    let mut free = h100s(0..3, 0);
    free.extend(h100s(3..7, 1));
    let nodes = [node(1, 0, &[(0, 0, 4), (1, 0, 4)], free)];

    let placement = place(&request(vec![gpus(4, true)]), &nodes).unwrap();

    assert_eq!(
        placement,
        Placement {
            node: 1,
            units: vec![3, 4, 5, 6]
        }
    );
}

#[test]
fn nvlink_all_takes_the_domain_with_the_fewest_free_units_that_fits() {
    let mut free = h100s(0..8, 0);
    free.extend(h100s(8..12, 1));
    free.extend(h100s(12..14, 2));
    let nodes = [node(1, 2, &[(0, 0, 8), (1, 0, 4), (2, 2, 4)], free)];

    let placement = place(&request(vec![gpus(3, true)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![8, 9, 10]);
}

#[test]
fn nvlink_best_fit_beats_a_busier_node() {
    let nodes = [
        node(1, 8, &[(0, 0, 8)], h100s(0..8, 0)),
        node(2, 0, &[(0, 4, 8)], h100s(8..12, 0)),
    ];

    let placement = place(&request(vec![gpus(4, true)]), &nodes).unwrap();

    assert_eq!(
        placement,
        Placement {
            node: 2,
            units: vec![8, 9, 10, 11]
        }
    );
}

#[test]
fn nvlink_all_ties_go_to_the_busier_node() {
    let nodes = [
        node(1, 0, &[(0, 0, 4)], h100s(0..4, 0)),
        node(2, 4, &[(0, 0, 4)], h100s(4..8, 0)),
    ];

    let placement = place(&request(vec![gpus(4, true)]), &nodes).unwrap();

    assert_eq!(placement.node, 2);
}

#[test]
fn nvlink_all_never_splits_across_domains() {
    let mut free = h100s(0..4, 0);
    free.extend(h100s(4..8, 1));
    let nodes = [node(1, 0, &[(0, 0, 4), (1, 0, 4)], free)];

    let err = place(&request(vec![gpus(5, true)]), &nodes).unwrap_err();

    assert_eq!(
        err.reason(),
        "no node has 5 free gpu units of model H100 in one NVLink domain"
    );
}

#[test]
fn units_outside_any_domain_never_satisfy_nvlink_all() {
    let free = (0..8)
        .map(|id| unit(id, DeviceClass::Gpu, H100, None))
        .collect();
    let nodes = [node(1, 0, &[], free)];

    assert!(place(&request(vec![gpus(2, true)]), &nodes).is_err());
    assert!(place(&request(vec![gpus(1, true)]), &nodes).is_err());
    assert!(place(&request(vec![gpus(2, false)]), &nodes).is_ok());
}

#[test]
fn small_requests_pack_into_used_domains() {
    let mut free = h100s(0..4, 0);
    free.extend(h100s(4..6, 1));
    // Domain 0 is idle with four free units; domain 1 is half busy with two.
    let nodes = [node(1, 2, &[(0, 0, 4), (1, 2, 4)], free)];

    let placement = place(&request(vec![gpus(1, false)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![4]);
}

#[test]
fn small_requests_take_busy_domains_before_idle_smaller_ones() {
    let mut free = h100s(0..2, 0);
    free.extend(h100s(2..6, 1));
    let nodes = [node(1, 4, &[(0, 0, 2), (1, 4, 8)], free)];

    let placement = place(&request(vec![gpus(2, false)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![2, 3]);
}

#[test]
fn idle_requests_take_the_smallest_idle_domain_first() {
    let mut free = h100s(0..8, 0);
    free.extend(h100s(8..12, 1));
    let nodes = [node(1, 0, &[(0, 0, 8), (1, 0, 4)], free)];

    let placement = place(&request(vec![gpus(2, false)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![8, 9]);
}

#[test]
fn large_open_requests_fill_busy_domains_before_breaking_idle_ones() {
    let mut free = h100s(0..2, 0);
    free.extend(h100s(2..10, 1));
    let nodes = [node(1, 6, &[(0, 6, 8), (1, 0, 8)], free)];

    let placement = place(&request(vec![gpus(6, false)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![0, 1, 2, 3, 4, 5]);
}

#[test]
fn units_outside_any_domain_are_taken_first_by_open_requests() {
    let mut free = h100s(0..4, 0);
    free.push(unit(4, DeviceClass::Gpu, H100, None));
    let nodes = [node(1, 4, &[(0, 4, 8)], free)];

    let placement = place(&request(vec![gpus(2, false)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![0, 4]);
}

#[test]
fn open_requests_prefer_nodes_with_busy_domains_over_busier_nodes_with_idle_ones() {
    let nodes = [
        // Busier, but only a whole idle domain is free.
        node(1, 8, &[(0, 8, 8), (1, 0, 8)], h100s(0..8, 1)),
        node(2, 2, &[(0, 2, 8)], h100s(8..14, 0)),
    ];

    let placement = place(&request(vec![gpus(2, false)]), &nodes).unwrap();

    assert_eq!(placement.node, 2);
}

#[test]
fn open_requests_pack_onto_the_busier_node() {
    let nodes = [
        node(1, 1, &[(0, 1, 8)], h100s(0..7, 0)),
        node(2, 5, &[(0, 5, 8)], h100s(7..10, 0)),
    ];

    let placement = place(&request(vec![gpus(2, false)]), &nodes).unwrap();

    assert_eq!(
        placement,
        Placement {
            node: 2,
            units: vec![7, 8]
        }
    );
}

#[test]
fn a_request_never_spans_nodes() {
    let nodes = [
        node(1, 0, &[(0, 0, 4)], h100s(0..4, 0)),
        node(2, 0, &[(0, 0, 4)], h100s(4..8, 0)),
    ];

    let err = place(&request(vec![gpus(8, false)]), &nodes).unwrap_err();

    assert_eq!(err.reason(), "no node has 8 free gpu units of model H100");
}

#[test]
fn class_and_model_are_respected() {
    let free = vec![
        unit(0, DeviceClass::Gpu, A100, Some(0)),
        unit(1, DeviceClass::GpuMig, H100, Some(0)),
        unit(2, DeviceClass::Gpu, H100, Some(0)),
        unit(3, DeviceClass::NicVf, 0, None),
        unit(4, DeviceClass::Gpu, H100, Some(0)),
    ];
    let nodes = [node(1, 0, &[(0, 0, 4)], free)];

    let placement = place(&request(vec![gpus(2, false)]), &nodes).unwrap();
    assert_eq!(placement.units, vec![2, 4]);

    let any_model = DeviceRequest {
        model: None,
        ..gpus(3, false)
    };
    let placement = place(&request(vec![any_model]), &nodes).unwrap();
    assert_eq!(placement.units, vec![0, 2, 4]);

    let err = place(&request(vec![gpus(3, false)]), &nodes).unwrap_err();
    assert_eq!(err.reason(), "no node has 3 free gpu units of model H100");
}

#[test]
fn units_are_listed_entry_by_entry_in_request_order() {
    let mut free = h100s(0..4, 0);
    free.push(unit(4, DeviceClass::NicVf, 0, None));
    free.push(unit(5, DeviceClass::NicVf, 0, None));
    let nodes = [node(1, 0, &[(0, 0, 4)], free)];
    let nic = DeviceRequest {
        class: DeviceClass::NicVf,
        count: 1,
        model: None,
        nvlink_all: false,
    };

    let placement = place(&request(vec![nic, gpus(2, true)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![4, 0, 1]);
}

#[test]
fn pinned_entries_are_served_before_open_ones() {
    let free = vec![
        unit(0, DeviceClass::Gpu, H100, None),
        unit(1, DeviceClass::Gpu, A100, Some(0)),
    ];
    let nodes = [node(1, 0, &[(0, 0, 1)], free)];
    let open = DeviceRequest {
        model: None,
        ..gpus(1, false)
    };

    // The open entry alone would take unit 0 (outside any domain); it must leave it to the
    // entry pinned to H100.
    let placement = place(&request(vec![open, gpus(1, false)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![1, 0]);
}

#[test]
fn nvlink_entries_backtrack_when_the_tightest_domain_starves_a_later_entry() {
    // Domain 0: one H100 and two A100s. Domain 1: five H100s.
    let mut free = vec![
        unit(0, DeviceClass::Gpu, H100, Some(0)),
        unit(1, DeviceClass::Gpu, A100, Some(0)),
        unit(2, DeviceClass::Gpu, A100, Some(0)),
    ];
    free.extend(h100s(3..8, 1));
    let nodes = [node(1, 0, &[(0, 0, 3), (1, 0, 5)], free)];
    let any_three = DeviceRequest {
        model: None,
        ..gpus(3, true)
    };
    let two_a100 = DeviceRequest {
        model: Some(A100),
        ..gpus(2, true)
    };

    let placement = place(&request(vec![any_three, two_a100]), &nodes).unwrap();

    assert_eq!(placement.units, vec![3, 4, 5, 1, 2]);
}

#[test]
fn two_nvlink_entries_may_share_a_domain() {
    let nodes = [node(1, 0, &[(0, 0, 8)], h100s(0..8, 0))];

    let placement = place(&request(vec![gpus(4, true), gpus(4, true)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![0, 1, 2, 3, 4, 5, 6, 7]);
}

#[test]
fn ties_go_to_the_lowest_node_id_and_unit_id() {
    let nodes = [
        node(5, 0, &[(0, 0, 4)], h100s(0..4, 0)),
        node(3, 0, &[(0, 0, 4)], h100s(4..8, 0)),
    ];

    let placement = place(&request(vec![gpus(2, false)]), &nodes).unwrap();

    assert_eq!(
        placement,
        Placement {
            node: 3,
            units: vec![4, 5]
        }
    );
}

#[test]
fn the_answer_does_not_depend_on_node_or_domain_order() {
    // Two equal nodes whose units start at id `first`; node 2 lists its domains the other
    // way round.
    let free = |first: u32| {
        let mut free = h100s(first..first + 4, 0);
        free.extend(h100s(first + 4..first + 10, 1));
        free
    };
    let a = |first| node(1, 3, &[(0, 2, 6), (1, 1, 7)], free(first));
    let b = |first| node(2, 3, &[(1, 1, 7), (0, 2, 6)], free(first));
    let req = request(vec![gpus(3, false), gpus(2, true)]);

    let first = place(&req, &[a(0), b(10)]).unwrap();
    let second = place(&req, &[b(0), a(10)]).unwrap();

    assert_eq!(first.node, 1);
    assert_eq!(second.node, 1);
    let shifted: Vec<u32> = first.units.iter().map(|id| id + 10).collect();
    assert_eq!(second.units, shifted);
}

#[test]
fn a_request_for_nothing_is_refused() {
    let nodes = [node(1, 0, &[(0, 0, 4)], h100s(0..4, 0))];

    let err = place(&request(vec![gpus(0, true)]), &nodes).unwrap_err();

    assert_eq!(err.reason(), "the request asks for no devices");
    let flat = candidates(&nodes);
    assert_eq!(place_on(&request(vec![]), &flat.view(0).unwrap()), None);
}

#[test]
fn entries_asking_for_nothing_are_ignored() {
    let nodes = [node(1, 0, &[(0, 0, 4)], h100s(0..4, 0))];

    let placement = place(&request(vec![gpus(0, true), gpus(2, true)]), &nodes).unwrap();

    assert_eq!(placement.units, vec![0, 1]);
}

#[test]
fn no_candidates_is_unschedulable_with_a_reason() {
    let err = place(&request(vec![gpus(8, true)]), &[]).unwrap_err();

    assert_eq!(
        err.reason(),
        "no node has 8 free gpu units of model H100 in one NVLink domain: no candidate nodes"
    );
}

#[test]
fn the_reason_names_the_entry_that_fits_nowhere() {
    let nodes = [node(1, 0, &[(0, 0, 4)], h100s(0..4, 0))];
    let nic = DeviceRequest {
        class: DeviceClass::NicVf,
        count: 1,
        model: None,
        nvlink_all: false,
    };

    let err = place(&request(vec![gpus(2, true), nic]), &nodes).unwrap_err();

    assert_eq!(err.reason(), "no node has 1 free nic-vf unit");
}

#[test]
fn the_reason_names_all_entries_when_each_fits_somewhere_but_not_together() {
    let nodes = [
        node(1, 0, &[(0, 0, 4)], h100s(0..4, 0)),
        node(2, 0, &[], vec![unit(4, DeviceClass::Disk, A100, None)]),
    ];
    let disk = DeviceRequest {
        class: DeviceClass::Disk,
        count: 1,
        model: Some(A100),
        nvlink_all: false,
    };

    let err = place(&request(vec![gpus(4, true), disk]), &nodes).unwrap_err();

    assert_eq!(
        err.reason(),
        "no node has, at the same time, 4 free gpu units of model H100 in one NVLink domain \
         and 1 free disk unit of model A100"
    );
}

#[test]
fn an_unknown_model_index_is_named_by_its_index() {
    let err = place(
        &request(vec![DeviceRequest {
            model: Some(7),
            ..gpus(1, false)
        }]),
        &[node(1, 0, &[], h100s(0..1, 0))],
    )
    .unwrap_err();

    assert_eq!(err.reason(), "no node has 1 free gpu unit of model #7");
}

#[test]
fn place_on_agrees_with_place_for_a_single_node() {
    let mut free = h100s(0..3, 0);
    free.extend(h100s(3..8, 1));
    let candidate = node(4, 3, &[(0, 1, 4), (1, 2, 7)], free);
    let req = request(vec![gpus(2, false), gpus(3, true)]);

    let flat = candidates(std::slice::from_ref(&candidate));

    assert_eq!(
        place_on(&req, &flat.view(0).unwrap()),
        Some(place(&req, std::slice::from_ref(&candidate)).unwrap())
    );
}

/// A small deterministic generator, so the property test needs no dependency.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u32) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % u64::from(n)) as u32
    }
}

/// Checks every rule of the WIT `placement` record.
fn assert_valid(req: &Request, nodes: &[TestNode], placement: &Placement) {
    let node = nodes
        .iter()
        .find(|n| n.id == placement.node)
        .expect("a given node");
    assert_eq!(placement.units.len() as u64, req.unit_count());
    let mut seen = placement.units.clone();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), placement.units.len(), "duplicate units");
    let mut ids = placement.units.iter();
    for entry in &req.devices {
        let units: Vec<&Unit> = ids
            .by_ref()
            .take(entry.count as usize)
            .map(|id| {
                let (_, unit) = node
                    .free
                    .iter()
                    .find(|(u, _)| u == id)
                    .expect("a free unit");
                unit
            })
            .collect();
        assert!(units.iter().all(|u| entry.accepts(u)), "class or model");
        if entry.nvlink_all {
            assert!(units.iter().all(|u| u.nvlink_domain.is_some()));
            assert!(
                units
                    .windows(2)
                    .all(|w| w[0].nvlink_domain == w[1].nvlink_domain)
            );
        }
    }
}

#[test]
fn every_placement_keeps_the_placement_rules() {
    let mut rng = Lcg(7);
    let mut placed = 0;
    for _ in 0..500 {
        let mut next_id = 0;
        let nodes: Vec<TestNode> = (0..1 + rng.below(4))
            .map(|id| {
                let domains = rng.below(3);
                let free = (0..rng.below(12))
                    .map(|_| {
                        let id = next_id;
                        next_id += 1;
                        let class = if rng.below(5) == 0 {
                            DeviceClass::NicVf
                        } else {
                            DeviceClass::Gpu
                        };
                        let domain = (domains > 0 && rng.below(4) != 0).then(|| rng.below(domains));
                        unit(id, class, rng.below(2), domain)
                    })
                    .collect();
                let loads: Vec<(u32, u32, u32)> =
                    (0..domains).map(|d| (d, rng.below(3), 8)).collect();
                node(id, rng.below(8), &loads, free)
            })
            .collect();
        let devices = (0..1 + rng.below(3))
            .map(|_| DeviceRequest {
                class: if rng.below(4) == 0 {
                    DeviceClass::NicVf
                } else {
                    DeviceClass::Gpu
                },
                count: rng.below(4),
                model: (rng.below(2) == 0).then(|| rng.below(2)),
                nvlink_all: rng.below(2) == 0,
            })
            .collect();
        let req = request(devices);

        let flat = candidates(&nodes);
        for node in flat.views() {
            let mut scratch = crate::fit::Scratch::new(&req);
            if crate::fit::search_on(&req, &node, &mut scratch).is_some() {
                assert!(
                    crate::fit::could_fit(&req, &node),
                    "the quick test never rules out a node the search fits: {req:?} {node:?}"
                );
            }
        }
        match place(&req, &nodes) {
            Ok(placement) => {
                assert_valid(&req, &nodes, &placement);
                placed += 1;
            }
            Err(err) => assert!(err.reason().starts_with("no node has") || req.unit_count() == 0),
        }
    }
    assert!(
        placed > 50,
        "the generator should produce placeable requests ({placed})"
    );
}

#[test]
fn the_single_entry_path_chooses_what_the_general_search_chooses() {
    let mut rng = Lcg(11);
    let mut compared = 0;
    for _ in 0..6_000 {
        let domains = rng.below(5);
        // Ids in the table, across its end, beyond it, and a mix of small and large.
        let ids = [
            [0, 1, 2, 3],
            [62, 63, 64, 65],
            [253, 254, 255, 256],
            [0, 256, 1, 257],
            [1_000, 1_001, 1_002, 1_003],
        ][rng.below(5) as usize];
        let free: Vec<(u32, Unit)> = (0..rng.below(20))
            .map(|id| {
                let class = if rng.below(6) == 0 {
                    DeviceClass::NicVf
                } else {
                    DeviceClass::Gpu
                };
                let domain =
                    (domains > 0 && rng.below(5) != 0).then(|| ids[rng.below(domains) as usize]);
                unit(id, class, rng.below(2), domain)
            })
            .collect();
        let mut loads: Vec<(u32, u32, u32)> = Vec::new();
        for d in 0..domains {
            if rng.below(4) != 0 {
                loads.push((ids[d as usize], rng.below(3), 8));
            }
        }
        // Now and then a domain reported twice: its first load counts.
        if let Some(&(domain, ..)) = loads.first()
            && rng.below(8) == 0
        {
            loads.push((domain, rng.below(3), 8));
        }
        // Now and then a load reported for `NO_DOMAIN`: the units outside any domain must
        // not become a domain.
        if rng.below(8) == 0 {
            loads.push((NO_DOMAIN, rng.below(3), 8));
        }
        // A second node after the first, so that the first's units are not the columns'
        // last and words read past them meet another node's units.
        let first = free.len() as u32;
        let next: Vec<(u32, Unit)> = (first..first + rng.below(10))
            .map(|id| {
                let domain = (rng.below(3) != 0).then(|| rng.below(300));
                unit(id, DeviceClass::Gpu, 0, domain)
            })
            .collect();
        let nodes = [node(1, rng.below(8), &loads, free), node(2, 0, &[], next)];
        let entry = DeviceRequest {
            class: DeviceClass::Gpu,
            count: 1 + rng.below(6),
            model: (rng.below(2) == 0).then(|| rng.below(2)),
            nvlink_all: rng.below(2) == 0,
        };
        let req = request(vec![entry]);
        let flat = candidates(&nodes);
        let node = flat.view(0).unwrap();

        let mut fast = crate::fit::Scratch::new(&req);
        let fast_score = crate::fit::best_on(&req, &node, &mut fast);
        let mut general = crate::fit::Scratch::new(&req);
        let general_score = crate::fit::search_on(&req, &node, &mut general);

        assert_eq!(fast_score, general_score, "{req:?} {node:?}");
        if fast_score.is_some() {
            assert_eq!(
                crate::fit::placement(&node, &fast),
                crate::fit::placement(&node, &general),
                "{req:?} {node:?}"
            );
            compared += 1;
        }
    }
    assert!(
        compared > 500,
        "the generator should produce fits ({compared})"
    );
}

/// Whether the entries of `req` from `entry` on can be served from the units of `free`
/// not yet `used`, trying every choice: the definition of placeable on one node.
fn fits_by_brute_force(
    req: &Request,
    entry: usize,
    free: &[(u32, Unit)],
    used: &mut [bool],
) -> bool {
    let Some(wanted) = req.devices.get(entry) else {
        return true;
    };
    fn choose(
        req: &Request,
        entry: usize,
        free: &[(u32, Unit)],
        used: &mut [bool],
        from: usize,
        left: u32,
        domain: Option<Option<u32>>,
    ) -> bool {
        if left == 0 {
            return fits_by_brute_force(req, entry + 1, free, used);
        }
        let wanted = &req.devices[entry];
        for k in from..free.len() {
            let unit = &free[k].1;
            if used[k] || !wanted.accepts(unit) {
                continue;
            }
            if wanted.nvlink_all
                && (unit.nvlink_domain.is_none() || domain.is_some_and(|d| d != unit.nvlink_domain))
            {
                continue;
            }
            used[k] = true;
            let found = choose(
                req,
                entry,
                free,
                used,
                k + 1,
                left - 1,
                Some(unit.nvlink_domain),
            );
            used[k] = false;
            if found {
                return true;
            }
        }
        false
    }
    choose(req, entry, free, used, 0, wanted.count, None)
}

/// Completeness of the search on one node, against [`fits_by_brute_force`]: requests of up
/// to four entries mixing pinned and open models, with and without `nvlink_all`, on small
/// nodes with a few domains. A node is refused only when no assignment serves the request
/// there, and every answer keeps the placement rules.
#[test]
fn a_refusal_means_no_node_can_serve_the_request_by_brute_force() {
    let mut rng = Lcg(23);
    let (mut placed, mut refused, mut mixed) = (0, 0, 0);
    for _ in 0..20_000 {
        let mut next_id = 0;
        let nodes: Vec<TestNode> = (0..1 + rng.below(3))
            .map(|id| {
                let domains = rng.below(4);
                let free = (0..rng.below(11))
                    .map(|_| {
                        let id = next_id;
                        next_id += 1;
                        let class = if rng.below(6) == 0 {
                            DeviceClass::NicVf
                        } else {
                            DeviceClass::Gpu
                        };
                        let domain = (domains > 0 && rng.below(4) != 0).then(|| rng.below(domains));
                        unit(id, class, rng.below(2), domain)
                    })
                    .collect();
                let loads: Vec<(u32, u32, u32)> =
                    (0..domains).map(|d| (d, rng.below(3), 8)).collect();
                node(id, rng.below(8), &loads, free)
            })
            .collect();
        let devices = (0..1 + rng.below(4))
            .map(|_| DeviceRequest {
                class: if rng.below(5) == 0 {
                    DeviceClass::NicVf
                } else {
                    DeviceClass::Gpu
                },
                count: 1 + rng.below(4),
                model: (rng.below(2) == 0).then(|| rng.below(2)),
                nvlink_all: rng.below(2) == 0,
            })
            .collect();
        let req = request(devices);
        let flat = candidates(&nodes);
        let mut placeable = false;
        for (view, n) in flat.views().zip(&nodes) {
            let fits = fits_by_brute_force(&req, 0, &n.free, &mut vec![false; n.free.len()]);
            placeable |= fits;
            match place_on(&req, &view) {
                Some(placement) => {
                    assert!(
                        fits,
                        "placed what cannot be placed: {req:?} on {:?}",
                        n.free
                    );
                    assert_valid(&req, &nodes, &placement);
                }
                None => assert!(!fits, "refused a node that can serve {req:?}: {:?}", n.free),
            }
        }
        match place(&req, &nodes) {
            Ok(placement) => {
                assert!(placeable, "placed what cannot be placed: {req:?}");
                assert_valid(&req, &nodes, &placement);
                placed += 1;
                let nvlink = |d: &DeviceRequest| d.nvlink_all;
                mixed +=
                    usize::from(req.devices.iter().any(nvlink) && !req.devices.iter().all(nvlink));
            }
            Err(err) => {
                assert!(
                    !placeable,
                    "refused ({}) a request a node can serve: {req:?} on {:?}",
                    err.reason(),
                    nodes.iter().map(|n| &n.free).collect::<Vec<_>>()
                );
                refused += 1;
            }
        }
    }
    assert!(
        placed > 2_000 && refused > 2_000 && mixed > 500,
        "the generator should produce both ({placed} placed, {mixed} of them mixing \
         nvlink_all with other entries; {refused} refused)"
    );
}

/// Two `nvlink_all` entries in one domain of three H100s and two A100s: the open entry,
/// satisfied first as the larger, takes the three H100s (the lowest ids), which leaves the
/// H100 entry nothing; the exact search gives it two H100s and the open entry the rest.
#[test]
fn an_open_nvlink_entry_leaves_a_pinned_nvlink_entry_its_units() {
    let mut free = h100s(0..3, 0);
    free.push(unit(3, DeviceClass::Gpu, A100, Some(0)));
    free.push(unit(4, DeviceClass::Gpu, A100, Some(0)));
    let nodes = [node(1, 0, &[(0, 0, 5)], free)];
    let any_three = DeviceRequest {
        model: None,
        ..gpus(3, true)
    };

    let placement = place(&request(vec![gpus(2, true), any_three]), &nodes).unwrap();

    assert_eq!(placement.units, vec![0, 1, 2, 3, 4]);
}

/// Found by the brute-force check: the node can serve 3 A100s, 3 H100s and 2 GPUs of any
/// model in one NVLink domain (the domain's two A100s), but the open NVLink entry takes the
/// domain's lowest ids, an H100 among them, and the H100 entry then falls short; the exact
/// search finds the placement.
#[test]
fn an_open_nvlink_entry_leaves_pinned_entries_the_models_they_need() {
    let a100 = |id, domain| unit(id, DeviceClass::Gpu, A100, domain);
    let h100 = |id, domain| unit(id, DeviceClass::Gpu, H100, domain);
    let free = vec![
        h100(0, Some(0)),
        a100(1, Some(0)),
        a100(2, Some(0)),
        h100(3, Some(0)),
        h100(4, Some(0)),
        a100(5, None),
        a100(6, None),
        a100(7, None),
    ];
    let nodes = [node(1, 0, &[(0, 0, 8)], free)];
    let pinned = |count, model| DeviceRequest {
        class: DeviceClass::Gpu,
        count,
        model: Some(model),
        nvlink_all: false,
    };
    let open_nvlink = DeviceRequest {
        class: DeviceClass::Gpu,
        count: 2,
        model: None,
        nvlink_all: true,
    };
    let req = request(vec![pinned(3, A100), pinned(3, H100), open_nvlink]);
    assert!(fits_by_brute_force(
        &req,
        0,
        &nodes[0].free,
        &mut [false; 8]
    ));
    let placement = place(&req, &nodes).expect("the node can serve it");
    assert_valid(&req, &nodes, &placement);
}
