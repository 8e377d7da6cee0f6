//! The reconciler's carry pass for devices a Kubernetes node still holds.

use super::*;

/// The reconciler's carry pass: held `kubernetes` bookings past their end are carried in
/// 5-minute steps, unbilled, for at most 24 hours and never over another booking. Returns
/// the pools whose capacity freed.
pub async fn carry_held(app: &App) -> Result<Vec<String>> {
    let now = app.now_ms();
    let due: Vec<(String, String, Option<i64>, Option<i64>)> = sqlx::query_as(
        "SELECT rb.reservation_id, rb.node_id, CAST(MAX(b.end_ms) AS BIGINT), CAST(MIN(b.billable_end_ms) AS BIGINT)
         FROM reservation_bindings rb JOIN bookings b ON b.reservation_id = rb.reservation_id
         WHERE rb.status = $1 AND b.active = $2
         GROUP BY rb.reservation_id, rb.node_id
         HAVING MAX(b.end_ms) <= $3",
    )
    .bind(BindingStatus::Unbinding.as_str())
    .bind(true)
    .bind(now)
    .fetch_all(app.store.pool())
    .await?;
    let mut pools = Vec::new();
    for (id, node, end, billable) in due {
        let Some(end) = end else { continue };
        let original = billable.unwrap_or(end);
        let mut tx = app.store.begin().await?;
        let Some(mut r) = store::find(&mut tx, &id, app.store.for_update()).await? else {
            continue;
        };
        let units: Vec<String> = sqlx::query_scalar(
            "SELECT unit_id FROM bookings WHERE reservation_id = $1 AND active = $2 ORDER BY unit_id",
        )
        .bind(&id)
        .bind(true)
        .fetch_all(&mut **tx)
        .await?;
        let target = carry_target(end, now, original);
        let next = if units.is_empty() || target <= end {
            None
        } else {
            store::next_booking_start(&mut tx, &id, &node, &units, end, target).await?
        };
        let step = carry_step(end, now, original, next);
        let (to, stop) = match step {
            Carry::Keep => continue,
            Carry::Extend(to) => (to, false),
            Carry::Stop(to) => (to, true),
        };
        let mut reached = end;
        if to > end {
            sqlx::query(
                "UPDATE bookings SET billable_end_ms = $1 WHERE reservation_id = $2 AND active = $3 AND billable_end_ms IS NULL",
            )
            .bind(original)
            .bind(&id)
            .bind(true)
            .execute(&mut **tx)
            .await?;
            let mut savepoint = sqlx::Connection::begin(&mut **tx).await?;
            match store::extend_bookings(&mut savepoint, &id, to).await {
                Ok(()) => {
                    savepoint.commit().await?;
                    reached = to;
                }
                Err(err) if violates(&err, "bookings_no_overlap") => {
                    savepoint.rollback().await?;
                }
                Err(err) => return Err(err.into()),
            }
        }
        let stop = stop || reached == end;
        let newly_stuck: bool = sqlx::query(
            "UPDATE reservation_bindings SET stuck_since = $1, updated_at = $2
             WHERE reservation_id = $3 AND stuck_since IS NULL",
        )
        .bind(original)
        .bind(now)
        .bind(&id)
        .execute(&mut **tx)
        .await?
        .rows_affected()
            == 1;
        if newly_stuck {
            let org: Option<String> = sqlx::query_scalar("SELECT org_id FROM nodes WHERE id = $1")
                .bind(&node)
                .fetch_optional(&mut **tx)
                .await?;
            let org = org.unwrap_or_default();
            let payload = json!({ "nodeId": node, "condition": "KubernetesReleaseStuck", "reservationId": id, "since": original });
            events::emit(
                &mut tx,
                "inventory.node-condition",
                &node,
                &[&org],
                &payload,
                now,
            )
            .await?;
        }
        if stop {
            store::release_bookings(&mut tx, &id, reached).await?;
            let (reason, message) = if reached >= original.saturating_add(CARRY_MAX_MS) {
                (
                    "CarryLimitReached",
                    "the booking was carried for 24 hours past its end and ended; the node still reports the devices held",
                )
            } else {
                (
                    "NextBookingStarted",
                    "another booking of the devices started; the node still reports the devices held",
                )
            };
            r.set_condition("DevicesHeld", reason, message.into(), now);
            r.operate("carry-ended", now);
            store::update(&mut tx, &mut r).await?;
            pools.push(r.pool_id.clone());
        }
        tx.commit().await?;
    }
    Ok(pools)
}
