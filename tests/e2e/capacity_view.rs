//! Each replica's capacity view against the database: after random sequences of creates,
//! releases, cancels, extends, gangs, spot work and its preemption, node reservations
//! (create, release, reclaim, end), inventory changes and the clock moving, every replica's
//! view of the pool equals what the database holds, within a second.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::invariants;
use crate::races::{Fleet, fleet, rpc};
use crate::support::{Db, T0, h100_inventory, on_both_databases};

const MIN: i64 = 60_000;

on_both_databases!(
    every_replicas_view_matches_the_database_after_random_changes,
    a_change_through_one_replica_reaches_every_replicas_view_within_a_second
);

/// Waits until every replica's view of the pool matches the database (at most 2 s).
async fn assert_views_current(f: &Fleet, step: usize) {
    assert_views_current_within(f, step, Duration::from_secs(2)).await;
}

async fn assert_views_current_within(f: &Fleet, step: usize, within: Duration) {
    for (i, server) in f.servers.iter().enumerate() {
        let path = format!("/v1/pools/{}/capacity-check", f.pool);
        let deadline = Instant::now() + within;
        loop {
            let (status, check) = server.admin().get(&path).await;
            assert_eq!(status, StatusCode::OK, "{check}");
            if check["staleNodeIds"] == json!([]) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "step {step}: replica {i} still differs from the database: {check}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn every_replicas_view_matches_the_database_after_random_changes(db: Db) {
    let f = fleet(db, 4, 1_000, json!({})).await;
    let admin = f.servers[0].admin();
    f.servers[0].org_with_key("anchor", "member").await;
    let mut rng = StdRng::seed_from_u64(17);
    let mut live: Vec<Value> = Vec::new();
    let mut node_reservations: Vec<(String, String)> = Vec::new();
    let mut nodes = 4;
    let mut now = T0;
    for step in 0..80 {
        let replica = rng.random_range(0..f.servers.len());
        match rng.random_range(0..10) {
            0..=3 => {
                let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
                let mut ask = f.ask(&format!("k-{step}"), gpus, None);
                if rng.random_bool(0.3) {
                    ask["spot"] = json!(true);
                }
                if rng.random_bool(0.2) {
                    ask["start"] = json!(now + 30 * MIN);
                }
                if rng.random_bool(0.1) {
                    ask["gang"] = json!({ "size": 2 });
                }
                let (status, r) = rpc(&f.tenant(replica), "create", ask).await;
                assert_eq!(status, StatusCode::OK, "{r}");
                live.push(r);
            }
            4 if !live.is_empty() => {
                let r = live.swap_remove(rng.random_range(0..live.len()));
                let method = if rng.random_bool(0.5) {
                    "release"
                } else {
                    "cancel"
                };
                let (status, body) = rpc(
                    &f.tenant(replica),
                    method,
                    json!({ "tenantId": "tenant-a", "reservationId": r["id"] }),
                )
                .await;
                assert!(!status.is_server_error(), "{body}");
            }
            5 if !live.is_empty() => {
                let r = &live[rng.random_range(0..live.len())];
                let body = json!({ "tenantId": "tenant-a", "reservationId": r["id"], "by": "30m", "idempotencyKey": format!("x-{step}") });
                let (status, body) = rpc(&f.tenant(replica), "extend", body).await;
                assert!(!status.is_server_error(), "{body}");
            }
            6 => {
                let node = format!("n{}", rng.random_range(1..=nodes));
                let g = rng.random_range(0..7);
                let units = [format!("{node}-gpu{g}"), format!("{node}-gpu{}", g + 1)];
                let (status, nr) = f.servers[replica]
                    .admin()
                    .post(
                        &format!("/v1/nodes/{node}/reservations"),
                        json!({ "unitIds": units, "allowedOrgIds": ["anchor"] }),
                    )
                    .await;
                assert!(!status.is_server_error(), "{nr}");
                if let Some(id) = nr["id"].as_str() {
                    node_reservations.push((node, id.to_string()));
                }
            }
            7 if !node_reservations.is_empty() => {
                let (node, id) = &node_reservations[rng.random_range(0..node_reservations.len())];
                let (_, nr) = admin
                    .get(&format!("/v1/nodes/{node}/reservations/{id}"))
                    .await;
                let units = nr["reservedUnitIds"].clone();
                let action = ["release", "reclaim", "end"][rng.random_range(0..3)];
                let body = if action == "end" {
                    json!({})
                } else {
                    json!({ "unitIds": units })
                };
                let (status, body) = f.servers[replica]
                    .admin()
                    .post(
                        &format!("/v1/nodes/{node}/reservations/{id}/{action}"),
                        body,
                    )
                    .await;
                assert!(!status.is_server_error(), "{action}: {body}");
            }
            8 => {
                // The provider relabels a node, or adds one to the pool.
                if rng.random_bool(0.5) {
                    let node = format!("n{}", rng.random_range(1..=nodes));
                    let mut inventory = h100_inventory(&node, 8);
                    inventory["labels"] = json!({ "rack": format!("r{step}") });
                    let (status, body) = f
                        .provider
                        .put(&format!("/v1/orgs/acme/provider/nodes/{node}"), inventory)
                        .await;
                    assert!(status.is_success(), "{body}");
                } else {
                    nodes += 1;
                    let node = format!("n{nodes}");
                    let (status, body) = f
                        .provider
                        .put(
                            &format!("/v1/orgs/acme/provider/nodes/{node}"),
                            h100_inventory(&node, 8),
                        )
                        .await;
                    assert!(status.is_success(), "{body}");
                    let ids: Vec<String> = (1..=nodes).map(|n| format!("n{n}")).collect();
                    let (status, body) = admin
                        .put(
                            &format!("/v1/pools/{}/nodes", f.pool),
                            json!({ "nodeIds": ids }),
                        )
                        .await;
                    assert!(status.is_success(), "{body}");
                }
            }
            _ => {
                now += 20 * MIN;
                f.set_clocks(now).await;
            }
        }
        if step % 8 == 7 {
            assert_views_current(&f, step).await;
        }
    }
    assert_views_current(&f, 80).await;
    invariants::check(&f.servers[0]).await;
}

/// A placement or a release through one replica reaches every other replica's view (which
/// holds the nodes already) within a second: on PostgreSQL three replicas, each writing in
/// turn while the others are checked.
async fn a_change_through_one_replica_reaches_every_replicas_view_within_a_second(db: Db) {
    let f = fleet(db, 2, 64, json!({})).await;
    assert_views_current(&f, 0).await;
    let mut live: Vec<Value> = Vec::new();
    for step in 1..=9 {
        let writer = step % f.servers.len();
        if step % 3 == 0 {
            let r = live.remove(0);
            let body = json!({ "tenantId": "tenant-a", "reservationId": r["id"] });
            let (status, body) = rpc(&f.tenant(writer), "release", body).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        } else {
            let r = f.create(writer, f.ask(&format!("k-{step}"), 2, None)).await;
            assert_eq!(r["state"], "placed", "{r}");
            live.push(r);
        }
        assert_views_current_within(&f, step, Duration::from_secs(1)).await;
    }
    invariants::check(&f.servers[0]).await;
}
