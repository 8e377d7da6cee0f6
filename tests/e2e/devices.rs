//! Compute reservations for every device class, selectors, sharing, host resources and
//! gangs (seed 004, `create`): nodes report MIG instances, slots, NIC VFs, disks and whole
//! nodes besides GPUs, and gangs are placed on several nodes at once, all or none. Nodes
//! and units carry labels that selectors match and that a gang's `topologyKey` may name.

use std::collections::{BTreeMap, HashSet};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Api, Db, HOUR, Server, T0, assert_error, on_both_databases};

/// A unit of `class` (unit class) on `node`, with NVLink domain `domain` when given.
fn unit(
    node: &str,
    id: &str,
    class: &str,
    model: &str,
    memory: i64,
    domain: Option<&str>,
) -> Value {
    let device_class = match class {
        "vfio-group" | "device-request" => "gpu",
        "mig" => "gpu.mig",
        "slot" => "gpu.slot",
        "nic-vf" => "nic.vf",
        other => other,
    };
    let mut unit = json!({
        "id": format!("{node}-{id}"), "class": class, "deviceClass": device_class,
        "model": model, "memoryGiB": memory, "sellable": true,
    });
    if let Some(d) = domain {
        unit["nvlinkDomain"] = json!(d);
    }
    unit
}

/// A node inventory builder: a region, node labels, the host's resources and any units.
struct Inventory {
    node: String,
    region: String,
    labels: Option<Value>,
    host: (i64, i64, i64),
    units: Vec<Value>,
}

impl Inventory {
    fn new(node: &str) -> Inventory {
        Inventory {
            node: node.to_string(),
            region: "eu-west-1".into(),
            labels: None,
            host: (224, 2048, 512),
            units: Vec::new(),
        }
    }

    fn region(mut self, region: &str) -> Self {
        self.region = region.into();
        self
    }

    /// The node's labels.
    fn labels(mut self, labels: Value) -> Self {
        self.labels = Some(labels);
        self
    }

    /// Labels on the units at positions `at` (in the order they were added).
    fn unit_labels(mut self, at: std::ops::Range<usize>, labels: Value) -> Self {
        for u in &mut self.units[at] {
            u["labels"] = labels.clone();
        }
        self
    }

    /// `count` whole GPUs of `model` in one NVLink domain.
    fn gpus(mut self, count: usize, model: &str, memory: i64) -> Self {
        let start = self.units.len();
        for g in 0..count {
            let id = format!("gpu{}", start + g);
            let u = unit(&self.node, &id, "vfio-group", model, memory, Some("nvl0"));
            self.units.push(u);
        }
        self
    }

    fn units(mut self, class: &str, count: usize, model: &str, memory: i64) -> Self {
        for i in 0..count {
            let id = format!("{class}{i}");
            self.units
                .push(unit(&self.node, &id, class, model, memory, None));
        }
        self
    }

    fn json(&self) -> Value {
        let mut inv = json!({
            "region": self.region,
            "host": { "vcpu": self.host.0, "memoryGiB": self.host.1, "hugepages1Gi": self.host.2 },
            "units": self.units,
        });
        if let Some(labels) = &self.labels {
            inv["labels"] = labels.clone();
        }
        inv
    }
}

/// A provider `acme` with the given nodes in one pool offered to `tenant-a` with `quota`.
struct World {
    server: Server,
    tenant: Api,
    pool: String,
}

async fn world(db: Db, nodes: Vec<Inventory>, quota: Value, policy: Value) -> World {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let mut node_ids = Vec::new();
    for inv in &nodes {
        let (status, body) = provider
            .put(
                &format!("/v1/orgs/acme/provider/nodes/{}", inv.node),
                inv.json(),
            )
            .await;
        assert!(status.is_success(), "{status} {body}");
        node_ids.push(inv.node.clone());
    }
    let tenant = server.org_with_key("tenant-a", "member").await;
    let (status, pool) = server
        .admin()
        .post(
            "/v1/pools",
            json!({ "name": "mixed", "ownerOrgId": "acme", "nodeIds": node_ids, "policy": policy }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{pool}");
    let pool = pool["id"].as_str().unwrap().to_string();
    let (status, offer) = server
        .admin()
        .post(
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-a", "quota": quota }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{offer}");
    World {
        server,
        tenant,
        pool,
    }
}

/// `n` nodes `{prefix}{1..=n}` of 8 H100s in one NVLink domain, in `region`.
fn h100_nodes(prefix: &str, n: usize, region: &str) -> Vec<Inventory> {
    (1..=n)
        .map(|i| {
            Inventory::new(&format!("{prefix}{i}"))
                .region(region)
                .gpus(8, "H100-SXM5-80GB", 80)
        })
        .collect()
}

impl World {
    fn ask(&self, key: &str, devices: Value) -> Value {
        json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": devices, "duration": "2h", "idempotencyKey": key })
    }

    async fn rpc(&self, method: &str, body: Value) -> (StatusCode, Value) {
        self.tenant
            .post(&format!("/api/compute/reservations/{method}"), body)
            .await
    }

    async fn create(&self, body: Value) -> Value {
        let (status, r) = self.rpc("create", body).await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    async fn call(&self, method: &str, id: &Value) -> Value {
        let (status, r) = self
            .rpc(
                method,
                json!({ "tenantId": "tenant-a", "reservationId": id }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }

    async fn used(&self) -> BTreeMap<String, i64> {
        let (_, offers) = self
            .server
            .admin()
            .get(&format!("/v1/pools/{}/offers", self.pool))
            .await;
        serde_json::from_value(offers["items"][0]["used"].clone()).unwrap_or_default()
    }

    async fn used_of(&self, resource: &str) -> i64 {
        self.used().await.get(resource).copied().unwrap_or(0)
    }

    /// The classes of a node's units, by unit id.
    async fn classes(&self, node: &str) -> BTreeMap<String, String> {
        let (_, view) = self.server.admin().get(&format!("/v1/nodes/{node}")).await;
        view["units"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| {
                (
                    u["id"].as_str().unwrap().to_string(),
                    u["deviceClass"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    async fn db(&self) -> sqlx::AnyConnection {
        use sqlx::Connection as _;
        let url = self.server.db.url.clone().unwrap_or_else(|| {
            format!(
                "sqlite://{}",
                self.server.data_dir.path().join("orl.db").display()
            )
        });
        sqlx::any::install_default_drivers();
        sqlx::AnyConnection::connect(&url).await.unwrap()
    }

    /// Active bookings of a reservation, per node.
    async fn active_bookings(&self, id: &Value) -> BTreeMap<String, i64> {
        use sqlx::Row as _;
        let mut conn = self.db().await;
        let rows = sqlx::query(
            "SELECT node_id, COUNT(*) AS n FROM bookings WHERE reservation_id = $1 AND active = $2 GROUP BY node_id",
        )
        .bind(id.as_str().unwrap())
        .bind(true)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        rows.iter()
            .map(|r| (r.get::<String, _>("node_id"), r.get::<i64, _>("n")))
            .collect()
    }

    /// Active host bookings of a reservation: (node, vcpu, memoryGiB, hugepages1Gi).
    async fn host_bookings(&self, id: &Value) -> Vec<(String, i64, i64, i64)> {
        use sqlx::Row as _;
        let mut conn = self.db().await;
        sqlx::query(
            "SELECT node_id, vcpu, memory_gib, hugepages_1gi FROM host_bookings
             WHERE reservation_id = $1 AND active = $2 ORDER BY node_id",
        )
        .bind(id.as_str().unwrap())
        .bind(true)
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|r| {
            (
                r.get("node_id"),
                r.get("vcpu"),
                r.get("memory_gib"),
                r.get("hugepages_1gi"),
            )
        })
        .collect()
    }

    /// Polls `get` until the reservation is in `state` (the wake-up after a release runs
    /// right after the release answers).
    async fn eventually(&self, id: &Value, state: &str) -> Value {
        for _ in 0..50 {
            let r = self.call("get", id).await;
            if r["state"] == state {
                return r;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("{id} never became {state}");
    }
}

/// The nodes of a placed gang, checking each member is on its own node with `per_member`
/// units, and that `nodeId`/`unitIds` name the first member.
fn members(r: &Value, per_member: usize) -> Vec<String> {
    let placement = &r["placement"];
    let members = placement["members"].as_array().unwrap();
    assert_eq!(placement["nodeId"], members[0]["nodeId"], "{r}");
    assert_eq!(placement["unitIds"], members[0]["unitIds"], "{r}");
    let nodes: Vec<String> = members
        .iter()
        .map(|m| m["nodeId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        nodes.iter().collect::<HashSet<_>>().len(),
        nodes.len(),
        "members are on distinct nodes: {r}"
    );
    for m in members {
        assert_eq!(m["unitIds"].as_array().unwrap().len(), per_member, "{r}");
    }
    nodes
}

on_both_databases!(
    every_device_class_is_placed_from_inventory,
    mig_or_slot_requests_alone_book_no_host_resources,
    selectors_pick_units_by_model_and_memory,
    a_sharing_mode_other_than_the_pools_is_invalid_input,
    host_resources_are_booked_on_the_devices_node_with_the_per_gpu_share_as_floor,
    a_gang_of_four_nvlink_nodes_lands_on_four_idle_nodes_of_a_loaded_pool,
    a_gang_that_does_not_fit_books_nothing_and_waits_pending_until_it_fits,
    a_gang_with_topology_key_region_stays_in_one_region,
    releasing_a_gang_frees_every_member_and_refunds_its_quota_once,
    extending_a_gang_moves_every_member_and_cancel_and_expiry_end_it,
    iam_sees_gpus_and_host_resources_summed_over_a_gang,
    a_gang_spans_nodes_that_report_the_same_unit_ids,
    inventory_labels_round_trip_and_do_not_bump_the_topology_generation,
    invalid_labels_are_refused_naming_the_field,
    label_selectors_match_unit_labels_then_node_labels,
    a_gang_with_a_label_topology_key_lands_on_nodes_of_one_rack,
);

fn mixed_node(node: &str) -> Inventory {
    Inventory::new(node)
        .gpus(2, "H100-SXM5-80GB", 80)
        .units("mig", 4, "A100-1g.10gb", 10)
        .units("slot", 4, "L4-slot", 6)
        .units("nic-vf", 2, "CX7-VF", 0)
        .units("disk", 2, "NVMe-3.84TB", 0)
}

fn all_classes_quota() -> Value {
    json!({ "gpu": 8, "gpu.mig": 8, "gpu.slot": 8, "nic.vf": 8, "disk": 8, "node": 2 })
}

async fn every_device_class_is_placed_from_inventory(db: Db) {
    let w = world(
        db,
        vec![
            mixed_node("m1"),
            Inventory::new("whole1").units("node", 1, "DGX-H100", 0),
        ],
        all_classes_quota(),
        json!({}),
    )
    .await;
    let devices = json!([
        { "class": "gpu", "count": 1 },
        { "class": "gpu.mig", "count": 2 },
        { "class": "gpu.slot", "count": 3 },
        { "class": "nic.vf", "count": 1 },
        { "class": "disk", "count": 2 },
    ]);
    let r = w.create(w.ask("k-mixed", devices)).await;
    assert_eq!(r["state"], "placed", "{r}");
    assert_eq!(r["placement"]["nodeId"], "m1");
    let classes = w.classes("m1").await;
    let mut got: BTreeMap<String, i64> = BTreeMap::new();
    for id in r["placement"]["unitIds"].as_array().unwrap() {
        *got.entry(classes[id.as_str().unwrap()].clone())
            .or_default() += 1;
    }
    let expected: BTreeMap<String, i64> = [
        ("gpu", 1),
        ("gpu.mig", 2),
        ("gpu.slot", 3),
        ("nic.vf", 1),
        ("disk", 2),
    ]
    .into_iter()
    .map(|(c, n)| (c.to_string(), n))
    .collect();
    assert_eq!(got, expected, "{r}");
    let whole = w
        .create(w.ask("k-node", json!([{ "class": "node", "count": 1 }])))
        .await;
    assert_eq!(whole["state"], "placed", "{whole}");
    assert_eq!(whole["placement"]["unitIds"], json!(["whole1-node0"]));
    let used = w.used().await;
    for (class, n) in expected {
        assert_eq!(used.get(&class), Some(&n), "quota per class: {used:?}");
    }
    assert_eq!(used.get("node"), Some(&1));
    // Every unit of a class taken: the next one waits.
    let more = w
        .create(w.ask("k-disk", json!([{ "class": "disk", "count": 1 }])))
        .await;
    assert_eq!(more["state"], "pending", "{more}");
}

async fn mig_or_slot_requests_alone_book_no_host_resources(db: Db) {
    let w = world(db, vec![mixed_node("m1")], all_classes_quota(), json!({})).await;
    let mig = w
        .create(w.ask("k-mig", json!([{ "class": "gpu.mig", "count": 2 }])))
        .await;
    let slot = w
        .create(w.ask(
            "k-slot",
            json!([{ "class": "gpu.slot", "count": 1 }, { "class": "gpu.mig", "count": 1 }]),
        ))
        .await;
    let gpu = w
        .create(w.ask(
            "k-gpu",
            json!([{ "class": "gpu", "count": 1 }, { "class": "gpu.mig", "count": 1 }]),
        ))
        .await;
    for r in [&mig, &slot] {
        assert_eq!(r["state"], "placed", "{r}");
        assert_eq!(
            r["resources"],
            json!({ "vcpu": 0, "memoryGiB": 0, "hugepages1Gi": 0 })
        );
        assert!(w.host_bookings(&r["id"]).await.is_empty());
    }
    assert_eq!(gpu["state"], "placed", "{gpu}");
    assert_eq!(
        gpu["resources"],
        json!({ "vcpu": 112, "memoryGiB": 1024, "hugepages1Gi": 0 }),
        "a whole GPU books the per-GPU share of a 224-vCPU, 2-GPU host"
    );
    assert_eq!(
        w.host_bookings(&gpu["id"]).await,
        [("m1".to_string(), 112, 1024, 0)]
    );
}

async fn selectors_pick_units_by_model_and_memory(db: Db) {
    let node = Inventory::new("s1")
        .gpus(4, "H100-SXM5-80GB", 80)
        .gpus(4, "L40S-48GB", 48);
    let w = world(db, vec![node], json!({ "gpu": 16 }), json!({})).await;
    let models = |r: &Value| -> HashSet<String> {
        r["placement"]["unitIds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| {
                let n: usize = u.as_str().unwrap()["s1-gpu".len()..].parse().unwrap();
                if n < 4 { "H100" } else { "L40S" }.to_string()
            })
            .collect()
    };
    let l40s = w
        .create(w.ask(
            "k-model",
            json!([{ "class": "gpu", "count": 2, "selector": { "model": "L40S-48GB" } }]),
        ))
        .await;
    assert_eq!(l40s["state"], "placed", "{l40s}");
    assert_eq!(models(&l40s), HashSet::from(["L40S".to_string()]));
    let big = w
        .create(w.ask(
            "k-memory",
            json!([{ "class": "gpu", "count": 3, "selector": { "memoryGiB": 64 } }]),
        ))
        .await;
    assert_eq!(big["state"], "placed", "{big}");
    assert_eq!(models(&big), HashSet::from(["H100".to_string()]));
    let none = w
        .create(w.ask(
            "k-none",
            json!([{ "class": "gpu", "count": 1, "selector": { "model": "H100-SXM5-80GB", "memoryGiB": 100 } }]),
        ))
        .await;
    assert_eq!(none["state"], "pending", "no unit matches: {none}");
    assert_eq!(none["conditions"][0]["type"], "Unschedulable");
    // No unit or node carries the label: the request waits, it is not refused.
    let unlabelled = w
        .create(w.ask(
            "k-labels",
            json!([{ "class": "gpu", "count": 1, "selector": { "labels": { "rack": "a" } } }]),
        ))
        .await;
    assert_eq!(unlabelled["state"], "pending", "{unlabelled}");
}

async fn a_sharing_mode_other_than_the_pools_is_invalid_input(db: Db) {
    let w = world(
        db,
        vec![mixed_node("m1")],
        all_classes_quota(),
        json!({ "sharing": "timeslice" }),
    )
    .await;
    for (key, sharing) in [("k-excl", "exclusive"), ("k-mig", "mig"), ("k-mps", "mps")] {
        let (status, err) = w
            .rpc(
                "create",
                w.ask(
                    key,
                    json!([{ "class": "gpu.slot", "count": 1, "sharing": sharing }]),
                ),
            )
            .await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert!(
            err["error"]["message"]
                .as_str()
                .unwrap()
                .contains("devices[0].sharing"),
            "{err}"
        );
    }
    let r = w
        .create(w.ask(
            "k-ts",
            json!([{ "class": "gpu.slot", "count": 2, "sharing": "timeslice" }]),
        ))
        .await;
    assert_eq!(r["state"], "placed", "{r}");
    assert_eq!(
        w.used_of("gpu.slot").await,
        2,
        "only the matching request charged"
    );
}

async fn host_resources_are_booked_on_the_devices_node_with_the_per_gpu_share_as_floor(db: Db) {
    let w = world(
        db,
        h100_nodes("n", 2, "eu-west-1"),
        json!({ "gpu": 16, "vcpu": 400, "memoryGiB": 200 }),
        json!({}),
    )
    .await;
    // Below the share (28 vCPU, 256 GiB per GPU on a 224-vCPU, 2 TiB, 8-GPU host): raised.
    let mut small = w.ask("k-small", json!([{ "class": "gpu", "count": 2 }]));
    small["resources"] = json!({ "vcpu": 4 });
    let small = w.create(small).await;
    assert_eq!(
        small["resources"],
        json!({ "vcpu": 56, "memoryGiB": 512, "hugepages1Gi": 0 })
    );
    assert_eq!(w.used_of("vcpu").await, 0, "the share needs no quota");
    // Above it: the excess is charged, hugepages as memory.
    let mut big = w.ask("k-big", json!([{ "class": "gpu", "count": 1 }]));
    big["resources"] = json!({ "vcpu": 160, "memoryGiB": 300, "hugepages1Gi": 10 });
    let big = w.create(big).await;
    assert_eq!(big["state"], "placed", "{big}");
    assert_eq!(
        big["resources"],
        json!({ "vcpu": 160, "memoryGiB": 300, "hugepages1Gi": 10 })
    );
    assert_eq!(w.used_of("vcpu").await, 160 - 28);
    assert_eq!(w.used_of("memoryGiB").await, (300 - 256) + 10);
    let node = big["placement"]["nodeId"].as_str().unwrap().to_string();
    assert_eq!(
        w.host_bookings(&big["id"]).await,
        [(node.clone(), 160, 300, 10)],
        "host resources are booked on the devices' node"
    );
    // The node with 160 vCPU booked has no room for 100 more: the next goes elsewhere.
    let mut next = w.ask("k-next", json!([{ "class": "gpu", "count": 1 }]));
    next["resources"] = json!({ "vcpu": 100 });
    let next = w.create(next).await;
    assert_eq!(next["state"], "placed", "{next}");
    assert_ne!(next["placement"]["nodeId"], json!(node));
}

/// Six nodes of eight NVLink-connected H100s; two of them partly busy.
async fn loaded_pool(db: Db, gpu_quota: i64) -> (World, Vec<String>) {
    let w = world(
        db,
        h100_nodes("n", 6, "eu-west-1"),
        json!({ "gpu": gpu_quota }),
        json!({}),
    )
    .await;
    let mut busy = Vec::new();
    for (key, count) in [("k-load-1", 3), ("k-load-2", 6)] {
        let r = w
            .create(w.ask(key, json!([{ "class": "gpu", "count": count }])))
            .await;
        assert_eq!(r["state"], "placed", "{r}");
        busy.push(r["placement"]["nodeId"].as_str().unwrap().to_string());
    }
    assert_ne!(busy[0], busy[1], "the loads sit on two nodes");
    (w, busy)
}

fn gang(w: &World, key: &str, gpus: i64, size: i64) -> Value {
    let mut ask = w.ask(
        key,
        json!([{ "class": "gpu", "count": gpus, "topology": "nvlink-all" }]),
    );
    ask["gang"] = json!({ "size": size });
    ask
}

async fn a_gang_of_four_nvlink_nodes_lands_on_four_idle_nodes_of_a_loaded_pool(db: Db) {
    let (w, busy) = loaded_pool(db, 64).await;
    let r = w.create(gang(&w, "k-gang", 8, 4)).await;
    assert_eq!(r["state"], "placed", "{r}");
    let nodes = members(&r, 8);
    assert_eq!(nodes.len(), 4);
    assert!(
        nodes.iter().all(|n| !busy.contains(n)),
        "only whole idle nodes fit 8 nvlink-all GPUs: {nodes:?} vs busy {busy:?}"
    );
    assert_eq!(
        r["resources"],
        json!({ "vcpu": 224, "memoryGiB": 2048, "hugepages1Gi": 0 }),
        "host resources are per member node"
    );
    let booked = w.active_bookings(&r["id"]).await;
    assert_eq!(booked.len(), 4);
    assert!(booked.values().all(|n| *n == 8), "{booked:?}");
    let hosts = w.host_bookings(&r["id"]).await;
    assert_eq!(hosts.len(), 4, "one host booking per member node");
    assert!(
        hosts
            .iter()
            .all(|(_, vcpu, mem, _)| (*vcpu, *mem) == (224, 2048))
    );
    assert_eq!(w.used_of("gpu").await, 3 + 6 + 32, "count x size charged");
    let got = w.call("get", &r["id"]).await;
    assert_eq!(
        got["placement"], r["placement"],
        "get shows the same members"
    );
}

async fn a_gang_that_does_not_fit_books_nothing_and_waits_pending_until_it_fits(db: Db) {
    let (w, _) = loaded_pool(db, 128).await;
    // Four idle nodes: a gang of five whole nodes does not fit, and books nothing.
    let r = w.create(gang(&w, "k-five", 8, 5)).await;
    assert_eq!(r["state"], "pending", "{r}");
    assert_eq!(r["conditions"][0]["type"], "Unschedulable", "{r}");
    let message = r["conditions"][0]["message"].as_str().unwrap();
    assert!(message.contains("a gang of 5"), "{message}");
    assert!(r.get("placement").is_none(), "{r}");
    assert!(w.active_bookings(&r["id"]).await.is_empty());
    assert!(w.host_bookings(&r["id"]).await.is_empty());
    // Nothing was taken: four whole nodes are still free for a gang of four.
    let four = w.create(gang(&w, "k-four", 8, 4)).await;
    assert_eq!(four["state"], "placed", "{four}");
    // Releasing the four frees their nodes, but five still do not fit: still pending.
    w.call("release", &four["id"]).await;
    assert_eq!(w.call("get", &r["id"]).await["state"], "pending");
    // Ending one load leaves five idle nodes: the pending gang is placed on them.
    let (_, list) = w
        .rpc("list", json!({ "tenantId": "tenant-a", "state": "placed" }))
        .await;
    let load = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["request"]["idempotencyKey"] == "k-load-1")
        .unwrap()["id"]
        .clone();
    w.call("release", &load).await;
    let placed = w.eventually(&r["id"], "placed").await;
    assert_eq!(members(&placed, 8).len(), 5);
    assert_eq!(w.active_bookings(&r["id"]).await.len(), 5);
}

async fn a_gang_with_topology_key_region_stays_in_one_region(db: Db) {
    let mut nodes = h100_nodes("eu", 2, "eu-west-1");
    nodes.extend(h100_nodes("us", 3, "us-east-1"));
    let w = world(db, nodes, json!({ "gpu": 64 }), json!({})).await;
    let mut three = gang(&w, "k-three", 8, 3);
    three["gang"]["topologyKey"] = json!("region");
    let three = w.create(three).await;
    assert_eq!(three["state"], "placed", "{three}");
    let nodes = members(&three, 8);
    assert!(nodes.iter().all(|n| n.starts_with("us")), "{nodes:?}");
    // Two idle nodes remain in eu-west-1, none in us-east-1.
    let mut two = gang(&w, "k-two", 4, 2);
    two["gang"]["topologyKey"] = json!("region");
    let two = w.create(two).await;
    assert_eq!(two["state"], "placed", "{two}");
    assert!(members(&two, 4).iter().all(|n| n.starts_with("eu")));
    // Four free GPUs on each eu node and none in us: a gang of three does not fit one region.
    let mut wide = gang(&w, "k-wide", 2, 3);
    wide["gang"]["topologyKey"] = json!("region");
    let wide = w.create(wide).await;
    assert_eq!(wide["state"], "pending", "{wide}");
    assert!(
        wide["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("in region eu-west-1"),
        "{wide}"
    );
    let mut unknown = gang(&w, "k-unknown", 1, 2);
    unknown["gang"]["topologyKey"] = json!("nvlink switch");
    let (status, err) = w.rpc("create", unknown).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
}

async fn releasing_a_gang_frees_every_member_and_refunds_its_quota_once(db: Db) {
    let w = world(
        db,
        h100_nodes("n", 3, "eu-west-1"),
        json!({ "gpu": 8, "vcpu": 64 }),
        json!({}),
    )
    .await;
    let mut too_big = gang(&w, "k-big", 5, 2);
    too_big["devices"][0]["topology"] = json!("any");
    let (status, err) = w.rpc("create", too_big).await;
    assert_error(status, &err, StatusCode::CONFLICT, "QUOTA_EXCEEDED");
    assert_eq!(err["error"]["details"]["requested"], 10, "{err}");
    let mut ask = gang(&w, "k-gang", 4, 2);
    ask["resources"] = json!({ "vcpu": 140 });
    let r = w.create(ask).await;
    assert_eq!(r["state"], "placed", "{r}");
    members(&r, 4);
    assert_eq!(w.used_of("gpu").await, 8);
    assert_eq!(
        w.used_of("vcpu").await,
        2 * (140 - 4 * 28),
        "excess per node x size"
    );
    assert_eq!(w.host_bookings(&r["id"]).await.len(), 2);

    let released = w.call("release", &r["id"]).await;
    assert_eq!(released["state"], "released");
    assert!(w.active_bookings(&r["id"]).await.is_empty());
    assert!(w.host_bookings(&r["id"]).await.is_empty());
    assert_eq!(w.used_of("gpu").await, 0);
    assert_eq!(w.used_of("vcpu").await, 0);
    let again = w.call("release", &r["id"]).await;
    assert_eq!(again["state"], "released");
    assert_eq!(w.used_of("gpu").await, 0, "refunded once");
    // Every member's units are free again: the same nodes take a new gang.
    let next = w.create(gang(&w, "k-next", 4, 2)).await;
    assert_eq!(next["state"], "placed", "{next}");
}

async fn extending_a_gang_moves_every_member_and_cancel_and_expiry_end_it(db: Db) {
    let w = world(
        db,
        h100_nodes("n", 3, "eu-west-1"),
        json!({ "gpu": 64 }),
        json!({}),
    )
    .await;
    let r = w.create(gang(&w, "k-gang", 8, 2)).await;
    assert_eq!(r["state"], "placed", "{r}");
    let (status, ext) = w
        .rpc(
            "extend",
            json!({ "tenantId": "tenant-a", "reservationId": r["id"], "by": "1h", "idempotencyKey": "e-1" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ext}");
    assert_eq!(ext["extended"], true);
    let end = T0 + 3 * HOUR;
    assert_eq!(ext["reservation"]["end"], end);
    {
        let mut conn = w.db().await;
        let ends: Vec<i64> = sqlx::query_scalar(
            "SELECT end_ms FROM bookings WHERE reservation_id = $1 AND active = $2",
        )
        .bind(r["id"].as_str().unwrap())
        .bind(true)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        assert_eq!(ends.len(), 16);
        assert!(
            ends.iter().all(|e| *e == end),
            "every member moves: {ends:?}"
        );
    }
    // A later booking on the second member's node blocks the next extension.
    let second = members(&r, 8)[1].clone();
    let mut later = gang(&w, "k-later", 8, 3);
    later["start"] = json!(end + HOUR);
    later["duration"] = json!(3600);
    let later = w.create(later).await;
    assert_eq!(later["state"], "placed", "{later}");
    assert!(members(&later, 8).contains(&second));
    let (status, ext) = w
        .rpc(
            "extend",
            json!({ "tenantId": "tenant-a", "reservationId": r["id"], "by": "2h", "idempotencyKey": "e-2" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ext}");
    assert_eq!(ext["extended"], false, "{ext}");
    assert_eq!(ext["availableUntil"], end + HOUR);

    let cancelled = w.call("cancel", &later["id"]).await;
    assert_eq!(cancelled["state"], "cancelled");
    assert!(w.active_bookings(&later["id"]).await.is_empty());
    w.server.set_clock(T0 + HOUR).await;
    assert_eq!(w.call("get", &r["id"]).await["state"], "active");
    w.server.set_clock(end).await;
    assert_eq!(w.call("get", &r["id"]).await["state"], "expired");
    assert!(w.active_bookings(&r["id"]).await.is_empty());
    assert_eq!(w.used_of("gpu").await, 0);
}

async fn iam_sees_gpus_and_host_resources_summed_over_a_gang(db: Db) {
    let w = world(
        db,
        h100_nodes("n", 4, "eu-west-1"),
        json!({ "gpu": 64 }),
        json!({}),
    )
    .await;
    // Each rule alone decides one of the two gangs below: had IAM seen one member's GPUs
    // (4) or vCPUs (4 × 28 = 112), both gangs would pass both rules.
    for (rule, key, members) in [
        ("context.gpuCount <= 8", "k-gpus", 3),
        ("context.vcpu <= 224", "k-vcpu", 3),
    ] {
        let policy = format!(
            r#"permit(principal, action == Orl::Action::"compute:reservations:create", resource) when {{ {rule} }};"#
        );
        let (status, body) = w
            .server
            .admin()
            .put("/v1/orgs/tenant-a/iam/policy", json!({ "policy": policy }))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let ok = w.create(gang(&w, &format!("{key}-ok"), 4, 2)).await;
        assert_eq!(
            ok["state"], "placed",
            "{rule}: 8 GPUs and 224 vCPU in all: {ok}"
        );
        let (status, err) = w.rpc("create", gang(&w, key, 4, members)).await;
        assert_error(status, &err, StatusCode::FORBIDDEN, "ACCESS_DENIED");
    }
}

async fn a_gang_spans_nodes_that_report_the_same_unit_ids(db: Db) {
    let same_ids = |node: &str| {
        let mut inv = Inventory::new(node);
        inv.units = (0..4)
            .map(|g| {
                unit(
                    "x",
                    &format!("gpu{g}"),
                    "vfio-group",
                    "H100-SXM5-80GB",
                    80,
                    Some("nvl0"),
                )
            })
            .collect();
        inv
    };
    let w = world(
        db,
        vec![same_ids("a1"), same_ids("a2")],
        json!({ "gpu": 8 }),
        json!({}),
    )
    .await;
    let r = w.create(gang(&w, "k-gang", 4, 2)).await;
    assert_eq!(r["state"], "placed", "{r}");
    let members = r["placement"]["members"].as_array().unwrap();
    assert_eq!(members[0]["unitIds"], members[1]["unitIds"], "{r}");
    assert_eq!(w.active_bookings(&r["id"]).await.len(), 2);
    let released = w.call("release", &r["id"]).await;
    assert_eq!(released["state"], "released");
    assert!(w.active_bookings(&r["id"]).await.is_empty());
}

/// The labels of a node view and of each of its units (`{}` for a unit without labels).
fn labels_of(view: &Value) -> (Value, Vec<Value>) {
    let units = view["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.get("labels").cloned().unwrap_or_else(|| json!({})))
        .collect();
    (view["labels"].clone(), units)
}

async fn inventory_labels_round_trip_and_do_not_bump_the_topology_generation(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let inv = Inventory::new("l1")
        .labels(json!({ "rack": "r1", "example.com/tier": "gold", "empty": "" }))
        .gpus(2, "H100-SXM5-80GB", 80)
        .unit_labels(0..1, json!({ "nvidia.com/mig.capable": "true" }));
    let path = "/v1/orgs/acme/provider/nodes/l1";
    let (status, put) = provider.put(path, inv.json()).await;
    assert_eq!(status, StatusCode::CREATED, "{put}");
    let expected = (
        json!({ "rack": "r1", "example.com/tier": "gold", "empty": "" }),
        vec![json!({ "nvidia.com/mig.capable": "true" }), json!({})],
    );
    assert_eq!(labels_of(&put), expected);
    assert!(put["units"][1].get("labels").is_none(), "{put}");
    let (status, got) = provider.get("/v1/nodes/l1").await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(labels_of(&got), expected);
    assert_eq!(got["topologyGen"], 1);
    let (_, listed) = provider.get("/v1/orgs/acme/provider/nodes").await;
    assert_eq!(labels_of(&listed["items"][0]), expected);

    // The same report again changes nothing.
    server.set_clock(T0 + 60_000).await;
    let (status, same) = provider.put(path, inv.json()).await;
    assert_eq!(status, StatusCode::OK, "{same}");
    assert_eq!(same["topologyGen"], 1);
    assert_eq!(same["updatedAt"], got["updatedAt"], "unchanged: {same}");
    assert_eq!(labels_of(&same), expected);

    // Changed labels update the node but are not topology.
    server.set_clock(T0 + 120_000).await;
    let relabelled = Inventory::new("l1")
        .labels(json!({ "rack": "r2" }))
        .gpus(2, "H100-SXM5-80GB", 80)
        .unit_labels(1..2, json!({ "tier": "silver" }));
    let (status, updated) = provider.put(path, relabelled.json()).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["topologyGen"], 1, "labels are not topology");
    assert_ne!(updated["updatedAt"], got["updatedAt"], "{updated}");
    assert_eq!(
        labels_of(&updated),
        (
            json!({ "rack": "r2" }),
            vec![json!({}), json!({ "tier": "silver" })]
        )
    );
    let (_, got) = provider.get("/v1/nodes/l1").await;
    assert_eq!(labels_of(&got), labels_of(&updated));
    let (status, again) = provider.put(path, relabelled.json()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["updatedAt"], updated["updatedAt"], "idempotent");
    let (_, events) = provider.get("/v1/events").await;
    let types: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["objectId"] == "l1")
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert!(types.contains(&"inventory.node-updated"), "{types:?}");
    assert!(!types.contains(&"inventory.topology-changed"), "{types:?}");

    // Dropping the labels stores none; a node never labelled reads `{}`.
    let bare = Inventory::new("l1").gpus(2, "H100-SXM5-80GB", 80);
    let (_, cleared) = provider.put(path, bare.json()).await;
    assert_eq!(labels_of(&cleared), (json!({}), vec![json!({}), json!({})]));
    assert_eq!(cleared["topologyGen"], 1);
    let (status, other) = provider
        .put("/v1/orgs/acme/provider/nodes/l2", bare.json())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{other}");
    assert_eq!(other["labels"], json!({}));
}

async fn invalid_labels_are_refused_naming_the_field(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let too_many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = [
        (
            Inventory::new("bad")
                .gpus(4, "H100-SXM5-80GB", 80)
                .unit_labels(3..4, json!({ "-rack": "r1" })),
            "units[3].labels",
        ),
        (
            Inventory::new("bad")
                .gpus(2, "H100-SXM5-80GB", 80)
                .unit_labels(0..1, json!({ "rack": "r 1" })),
            "units[0].labels",
        ),
        (
            Inventory::new("bad").labels(json!({ "rack": "x".repeat(64) })),
            "labels",
        ),
        (
            Inventory::new("bad").labels(json!({ "Example.com/rack": "r1" })),
            "labels",
        ),
        (
            Inventory::new("bad").labels(Value::Object(too_many)),
            "labels",
        ),
    ];
    for (inv, field) in cases {
        let (status, err) = provider
            .put("/v1/orgs/acme/provider/nodes/bad", inv.json())
            .await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(err["error"]["details"]["field"], field, "{err}");
    }
    let (status, _) = provider
        .put(
            "/v1/orgs/acme/provider/nodes/bad",
            Inventory::new("bad").labels(json!({ "rack": 7 })).json(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "label values are strings");
    let (status, _) = provider.get("/v1/nodes/bad").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was registered");

    // Selector labels follow the same rules.
    let w = world(
        db,
        vec![Inventory::new("s1").gpus(2, "H100-SXM5-80GB", 80)],
        json!({ "gpu": 8 }),
        json!({}),
    )
    .await;
    for (labels, key) in [
        (json!({ "rack/": "r1" }), "k-key"),
        (json!({ "rack": "r1!" }), "k-value"),
    ] {
        let ask = w.ask(
            key,
            json!([{ "class": "gpu", "count": 1 }, { "class": "gpu", "count": 1, "selector": { "labels": labels } }]),
        );
        let (status, err) = w.rpc("create", ask).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
        assert_eq!(
            err["error"]["details"]["field"], "devices[1].selector.labels",
            "{err}"
        );
    }
}

async fn label_selectors_match_unit_labels_then_node_labels(db: Db) {
    // a1: gold by unit label on gpu0-1; a2: gold by node label, but gpu3 says silver;
    // a3: no labels at all.
    let nodes = vec![
        Inventory::new("a1")
            .labels(json!({ "rack": "r1" }))
            .gpus(4, "H100-SXM5-80GB", 80)
            .unit_labels(0..2, json!({ "tier": "gold" })),
        Inventory::new("a2")
            .labels(json!({ "rack": "r2", "tier": "gold" }))
            .gpus(4, "H100-SXM5-80GB", 80)
            .unit_labels(3..4, json!({ "tier": "silver" })),
        Inventory::new("a3").gpus(4, "H100-SXM5-80GB", 80),
    ];
    let w = world(db, nodes, json!({ "gpu": 16 }), json!({})).await;
    let units = |r: &Value| -> Vec<String> {
        let mut ids: Vec<String> = r["placement"]["unitIds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let labelled = |key: &str, count: i64, labels: Value| {
        w.ask(
            key,
            json!([{ "class": "gpu", "count": count, "selector": { "labels": labels } }]),
        )
    };
    // Only a2 has three gold units (by its node label); its silver unit is left out.
    let three = w
        .create(labelled("k-three", 3, json!({ "tier": "gold" })))
        .await;
    assert_eq!(three["state"], "placed", "{three}");
    assert_eq!(units(&three), ["a2-gpu0", "a2-gpu1", "a2-gpu2"]);
    // The remaining gold units are a1's, gold by their own labels.
    let two = w
        .create(labelled("k-two", 2, json!({ "tier": "gold" })))
        .await;
    assert_eq!(two["state"], "placed", "{two}");
    assert_eq!(units(&two), ["a1-gpu0", "a1-gpu1"]);
    // Unit label and node label together: the silver unit on rack r2.
    let silver = w
        .create(labelled(
            "k-silver",
            1,
            json!({ "rack": "r2", "tier": "silver" }),
        ))
        .await;
    assert_eq!(silver["state"], "placed", "{silver}");
    assert_eq!(units(&silver), ["a2-gpu3"]);
    // Nothing gold is left, and no node is in rack r3: both wait although a1 and a3
    // have free GPUs.
    let more = w
        .create(labelled("k-more", 1, json!({ "tier": "gold" })))
        .await;
    assert_eq!(more["state"], "pending", "{more}");
    assert_eq!(more["conditions"][0]["type"], "Unschedulable", "{more}");
    let r3 = w.create(labelled("k-r3", 1, json!({ "rack": "r3" }))).await;
    assert_eq!(r3["state"], "pending", "{r3}");
    let r1 = w.create(labelled("k-r1", 2, json!({ "rack": "r1" }))).await;
    assert_eq!(r1["state"], "placed", "{r1}");
    assert_eq!(units(&r1), ["a1-gpu2", "a1-gpu3"]);
    // Releasing gold units lets the waiting gold request take one of them.
    w.call("release", &two["id"]).await;
    let placed = w.eventually(&more["id"], "placed").await;
    let got = units(&placed);
    assert!(
        got == ["a1-gpu0"] || got == ["a1-gpu1"],
        "a gold unit: {placed}"
    );
    assert_eq!(w.call("get", &r3["id"]).await["state"], "pending");
}

async fn a_gang_with_a_label_topology_key_lands_on_nodes_of_one_rack(db: Db) {
    let rack = |prefix: &str, n: usize, rack: Option<&str>| -> Vec<Inventory> {
        h100_nodes(prefix, n, "eu-west-1")
            .into_iter()
            .map(|inv| match rack {
                Some(r) => inv.labels(json!({ "rack": r })),
                None => inv,
            })
            .collect()
    };
    let mut nodes = rack("ra", 2, Some("r1"));
    nodes.extend(rack("rb", 3, Some("r2")));
    nodes.extend(rack("x", 1, None));
    let w = world(db, nodes, json!({ "gpu": 64 }), json!({})).await;
    let racked = |key: &str, gpus: i64, size: i64| {
        let mut ask = gang(&w, key, gpus, size);
        ask["gang"]["topologyKey"] = json!("rack");
        ask
    };
    // r2 has the most free GPUs: the first gang goes there, all in one rack.
    let first = w.create(racked("k-first", 8, 2)).await;
    assert_eq!(first["state"], "placed", "{first}");
    assert!(
        members(&first, 8).iter().all(|n| n.starts_with("rb")),
        "{first}"
    );
    // Now r1 has more: the second gang lands on both of its nodes.
    let second = w.create(racked("k-second", 8, 2)).await;
    assert_eq!(second["state"], "placed", "{second}");
    let mut nodes = members(&second, 8);
    nodes.sort();
    assert_eq!(nodes, ["ra1", "ra2"]);
    // One r2 node and the unlabelled node are free: no rack holds two members, and the
    // node without the label takes no part.
    let third = w.create(racked("k-third", 8, 2)).await;
    assert_eq!(third["state"], "pending", "{third}");
    assert!(
        third["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .contains("in rack"),
        "{third}"
    );
    // Without the key the same gang fits across them.
    let anywhere = w.create(gang(&w, "k-anywhere", 8, 2)).await;
    assert_eq!(anywhere["state"], "placed", "{anywhere}");
    let mut nodes = members(&anywhere, 8);
    nodes.sort();
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[1], "x1", "{anywhere}");
    assert!(nodes[0].starts_with("rb"), "{anywhere}");
    // A key that is no label key is refused.
    let mut bad = gang(&w, "k-bad", 1, 2);
    bad["gang"]["topologyKey"] = json!("rack/");
    let (status, err) = w.rpc("create", bad).await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "INVALID_INPUT");
    assert_eq!(
        err["error"]["details"]["field"], "gang.topologyKey",
        "{err}"
    );
}
