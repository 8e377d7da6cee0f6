//! The event outbox. A state change writes its event in the same transaction as the change;
//! readers and streams take them from the table in `seq` order.

use serde_json::Value;
use sqlx::AnyConnection;

use crate::Result;
use crate::store::to_json;

/// Appends an event of `kind` about `object_id`, visible to the members of `org_ids`
/// (and to platform operators).
pub async fn emit(
    conn: &mut AnyConnection,
    kind: &str,
    object_id: &str,
    org_ids: &[&str],
    payload: &Value,
    now_ms: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO events (at, type, object_id, org_ids, payload) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(now_ms)
    .bind(kind)
    .bind(object_id)
    .bind(to_json(org_ids))
    .bind(to_json(payload))
    .execute(conn)
    .await?;
    Ok(())
}
