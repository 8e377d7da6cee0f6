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

/// One event as the API shows it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Position in the outbox; pass it as `after` to read on.
    pub id: i64,
    #[serde(rename = "type")]
    pub kind: String,
    pub at: String,
    pub object_id: String,
    pub payload: Value,
}

/// Events after `after` in outbox order that `org` may see (all of them for the ops org),
/// at most `limit`.
pub async fn list(pool: &sqlx::AnyPool, org: &str, after: i64, limit: i64) -> Result<Vec<Event>> {
    use sqlx::Row as _;
    let everything = org == crate::iam::OPS_ORG;
    let pattern = format!("%\"{org}\"%");
    let rows = sqlx::query(
        "SELECT seq, at, type, object_id, org_ids, payload FROM events
         WHERE seq > $1 AND ($2 OR org_ids LIKE $3) ORDER BY seq LIMIT $4",
    )
    .bind(after)
    .bind(everything)
    .bind(&pattern)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .filter(|r| {
            everything
                || crate::store::json_strings(&r.get::<String, _>("org_ids"))
                    .iter()
                    .any(|o| o == org)
        })
        .map(|r| Event {
            id: r.get("seq"),
            kind: r.get("type"),
            at: crate::clock::format_ms(r.get("at")),
            object_id: r.get("object_id"),
            payload: serde_json::from_str(&r.get::<String, _>("payload")).unwrap_or(Value::Null),
        })
        .collect())
}
