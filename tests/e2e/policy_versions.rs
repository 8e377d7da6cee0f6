//! `orl:policy@0.2.0` served beside `0.1.0`: a plugin built against either places, side by
//! side, and a 0.2 placer sees each candidate node's name, region and labels.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{
    Api, Db, Server, component, h100_inventory, on_both_databases, pools_for_tenant_a,
    register_node,
};

on_both_databases!(
    a_0_1_plugin_and_a_0_2_plugin_place_side_by_side,
    a_0_2_placer_sees_each_nodes_name_region_and_labels,
    a_placer_that_refuses_the_nodes_offered_first_is_offered_the_whole_pool,
);

/// Pools `a` (nodes `a1`, `a2`) and `b` (`b1`, `b2`), each of two 8-GPU nodes, offered to
/// `tenant-a`; node `b2` is labelled `prefer=yes`.
struct Pools {
    server: Server,
    provider: Api,
    tenant: Api,
    a: String,
    b: String,
}

async fn pools(db: Db) -> Pools {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    for node in ["a1", "a2", "b1"] {
        register_node(&provider, "acme", node, 8).await;
    }
    label(&provider, "b2", json!({ "prefer": "yes", "rack": "r7" })).await;
    let tenant = server.org_with_key("tenant-a", "member").await;
    let ids = pools_for_tenant_a(&server, &[&["a1", "a2"], &["b1", "b2"]]).await;
    Pools {
        server,
        provider,
        tenant,
        a: ids[0].clone(),
        b: ids[1].clone(),
    }
}

/// Registers (or reports again) 8-GPU node `node` in region `eu-west-1` with `labels`.
async fn label(provider: &Api, node: &str, labels: Value) {
    let mut inventory = h100_inventory(node, 8);
    inventory["labels"] = labels;
    let (status, body) = provider
        .put(&format!("/v1/orgs/acme/provider/nodes/{node}"), inventory)
        .await;
    assert!(status.is_success(), "{status} {body}");
}

impl Pools {
    /// Uploads the built component `file`; answers the plugin.
    async fn upload(&self, file: &str) -> Value {
        let (status, plugin) = self
            .server
            .admin()
            .raw(
                Method::POST,
                &format!("/v1/plugins?name={}&version=1.0.0", file.replace('_', "-")),
                Some(std::fs::read(component(file)).unwrap()),
                Some("application/wasm"),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{plugin}");
        assert_eq!(plugin["world"], "placer", "{plugin}");
        plugin
    }

    async fn assign(&self, pool: &str, plugin: &Value) {
        let (status, answer) = self
            .server
            .admin()
            .put(
                &format!("/v1/pools/{pool}/policies"),
                json!({ "placement": plugin["id"] }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    async fn create(&self, pool: &str, key: &str) -> Value {
        let body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 1 }], "duration": "2h", "idempotencyKey": key });
        let (status, r) = self
            .tenant
            .post("/api/compute/reservations/create", body)
            .await;
        assert_eq!(status, StatusCode::OK, "{r}");
        r
    }
}

async fn a_0_1_plugin_and_a_0_2_plugin_place_side_by_side(db: Db) {
    let p = pools(db).await;
    // Built with wit-bindgen over wit/v0.1 alone; places on the last node with room.
    let old = p.upload("placer_v0_1.wasm").await;
    // Built with the kit (0.2); places on the node labelled prefer=yes.
    let new = p.upload("place_by_label.wasm").await;
    assert_eq!(old["policyVersion"], "orl:policy@0.1.0", "{old}");
    assert_eq!(new["policyVersion"], "orl:policy@0.2.0", "{new}");
    p.assign(&p.a, &old).await;
    p.assign(&p.b, &new).await;
    for round in 0..4 {
        let (key_a, key_b) = (format!("a-{round}"), format!("b-{round}"));
        let (on_a, on_b) = tokio::join!(p.create(&p.a, &key_a), p.create(&p.b, &key_b));
        assert_eq!(on_a["state"], "placed", "{on_a}");
        assert_eq!(on_a["placement"]["placedBy"], old["id"], "{on_a}");
        assert_eq!(on_a["placement"]["nodeId"], "a2", "last-fit: {on_a}");
        assert_eq!(on_b["state"], "placed", "{on_b}");
        assert_eq!(on_b["placement"]["placedBy"], new["id"], "{on_b}");
        assert_eq!(on_b["placement"]["nodeId"], "b2", "labelled: {on_b}");
    }
    // The label moves, and so do the 0.2 plugin's placements; the 0.1 one is unmoved.
    label(&p.provider, "b2", json!({ "rack": "r7" })).await;
    label(&p.provider, "b1", json!({ "prefer": "yes" })).await;
    let (on_a, on_b) = tokio::join!(p.create(&p.a, "a-moved"), p.create(&p.b, "b-moved"));
    assert_eq!(on_a["placement"]["nodeId"], "a2", "{on_a}");
    assert_eq!(on_b["placement"]["nodeId"], "b1", "{on_b}");
}

async fn a_0_2_placer_sees_each_nodes_name_region_and_labels(db: Db) {
    let p = pools(db).await;
    let new = p.upload("place_by_label.wasm").await;
    p.assign(&p.b, &new).await;
    // No node is labelled prefer=yes any more: the plugin refuses, describing every
    // candidate node as it was told about it.
    label(
        &p.provider,
        "b2",
        json!({ "rack": "r7", "gpu-gen": "hopper" }),
    )
    .await;
    let waiting = p.create(&p.b, "nowhere").await;
    assert_eq!(waiting["state"], "pending", "{waiting}");
    let reason = waiting["conditions"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains(
            "no node labelled prefer=yes among b1@eu-west-1{} b2@eu-west-1{gpu-gen=hopper,rack=r7}"
        ),
        "{waiting}"
    );
}

/// A decision on a pool of more than 256 nodes is offered 256 of them first: a placer that
/// refuses those is then offered every node, and places where it wants to.
async fn a_placer_that_refuses_the_nodes_offered_first_is_offered_the_whole_pool(db: Db) {
    let server = Server::start(db).await;
    let provider = server.org_with_key("acme", "provider").await;
    let nodes: Vec<String> = (0..300).map(|n| format!("n{n:03}")).collect();
    let (last, rest) = nodes.split_last().unwrap();
    for node in rest {
        register_node(&provider, "acme", node, 8).await;
    }
    label(&provider, last, json!({ "prefer": "yes" })).await;
    let tenant = server.org_with_key("tenant-a", "member").await;
    let members: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let pool = pools_for_tenant_a(&server, &[&members]).await.remove(0);
    let p = Pools {
        server,
        provider,
        tenant,
        a: pool.clone(),
        b: pool,
    };
    let plugin = p.upload("place_by_label.wasm").await;
    p.assign(&p.a, &plugin).await;
    for key in ["first", "second"] {
        let r = p.create(&p.a, key).await;
        assert_eq!(r["state"], "placed", "{r}");
        assert_eq!(r["placement"]["nodeId"], last.as_str(), "{r}");
        assert_eq!(r["placement"]["placedBy"], plugin["id"], "{r}");
    }
}
