//! The reconciler's node-loss pass.

use super::*;

/// The reconciler's node-loss pass: marks watched nodes that stopped reporting as lost,
/// fails what is booked on lost nodes and frees devices held there. Returns the pools
/// whose capacity changed.
pub async fn detect_lost_nodes(app: &App) -> Result<Vec<String>> {
    let now = app.now_ms();
    let silent_since = now.saturating_sub(app.node_lost_after_ms);
    let newly: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT id, org_id, last_seen_at FROM nodes
         WHERE agent_seen_at IS NOT NULL AND lost_at IS NULL AND last_seen_at <= $1",
    )
    .bind(silent_since)
    .fetch_all(app.store.pool())
    .await?;
    for (node, org, last_seen) in newly {
        let mut tx = app.store.begin().await?;
        let marked = sqlx::query(
            "UPDATE nodes SET lost_at = $1 WHERE id = $2 AND lost_at IS NULL AND last_seen_at <= $3",
        )
        .bind(now)
        .bind(&node)
        .bind(silent_since)
        .execute(&mut **tx)
        .await?
        .rows_affected()
            == 1;
        if marked {
            let payload = json!({ "nodeId": node, "orgId": org, "lastSeenAt": last_seen });
            events::emit(
                &mut tx,
                "inventory.node-lost",
                &node,
                &[&org],
                &payload,
                now,
            )
            .await?;
        }
        tx.commit().await?;
    }
    let lost: Vec<String> = sqlx::query_scalar("SELECT id FROM nodes WHERE lost_at IS NOT NULL")
        .fetch_all(app.store.pool())
        .await?;
    let mut pools = Vec::new();
    for node in lost {
        let booked: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT r.id FROM compute_reservations r JOIN bookings b ON b.reservation_id = r.id
             WHERE b.node_id = $1 AND b.active IS TRUE AND r.state IN ('placed', 'binding', 'active')",
        )
        .bind(&node)
        .fetch_all(app.store.pool())
        .await?;
        for id in booked {
            let mut tx = app.store.begin().await?;
            let Some(mut r) = store::find(&mut tx, &id, app.store.for_update()).await? else {
                continue;
            };
            if !r.state.holds_units() {
                continue;
            }
            r.set_condition(
                "NodeLost",
                "NodeStoppedReporting",
                format!("node {node} stopped reporting"),
                now,
            );
            if terminate(&mut tx, &mut r, State::Failed, NODE_LOST, now).await? {
                crate::booking::lifecycle::audit_move(&mut tx, &r, NODE_LOST, now).await?;
                pools.push(r.pool_id.clone());
            }
            tx.commit().await?;
        }
        let held: Vec<String> = sqlx::query_scalar(
            "SELECT reservation_id FROM reservation_bindings WHERE node_id = $1 AND status = $2",
        )
        .bind(&node)
        .bind(BindingStatus::Unbinding.as_str())
        .fetch_all(app.store.pool())
        .await?;
        for id in held {
            let mut tx = app.store.begin().await?;
            let lock = app.store.for_update();
            let (Some(mut r), Some(mut row)) = (
                store::find(&mut tx, &id, lock).await?,
                find_row(&mut tx, &id, lock).await?,
            ) else {
                continue;
            };
            if row.status != BindingStatus::Unbinding {
                continue;
            }
            free_devices(&mut tx, &mut r, &mut row, NODE_LOST, now).await?;
            tx.commit().await?;
            pools.push(r.pool_id.clone());
        }
    }
    Ok(pools)
}
