//! The audit trail: who did what to which object, when, and why. Every mutation writes its
//! entry inside its own transaction, so an entry exists exactly when the change does.

use serde::Serialize;
use serde_json::Value;
use sqlx::{AnyConnection, AnyPool, Row as _};

use crate::Result;
use crate::clock::format_ms;
use crate::iam::Principal;
use crate::store::{Batch, to_json};

/// What a mutation records about itself.
pub struct Entry<'a> {
    /// The org the object belongs to (scopes who may read the entry).
    pub org_id: &'a str,
    /// Dotted verb, e.g. `org.create`, `node-reservation.release`.
    pub action: &'a str,
    pub object_type: &'a str,
    pub object_id: &'a str,
    /// The caller's stated reason, when the API takes one.
    pub reason: Option<&'a str>,
    pub details: Option<Value>,
}

/// Writes `entry` as done by `actor` at `now_ms`, inside the caller's transaction.
pub async fn record(
    conn: &mut AnyConnection,
    actor: &Principal,
    entry: Entry<'_>,
    now_ms: i64,
) -> Result<()> {
    let mut batch = Batch::on(conn);
    push(&mut batch, actor, entry, now_ms);
    batch.execute(conn).await?;
    Ok(())
}

/// Adds the write of `entry`, done by `actor` at `now_ms`, to `batch`.
pub fn push(batch: &mut Batch, actor: &Principal, entry: Entry<'_>, now_ms: i64) {
    batch.push(
        "INSERT INTO audit_log (at, actor_key_id, actor_org_id, org_id, action, object_type, object_id, reason, details)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        vec![
            now_ms.into(),
            (&actor.key_id).into(),
            (&actor.org_id).into(),
            entry.org_id.into(),
            entry.action.into(),
            entry.object_type.into(),
            entry.object_id.into(),
            entry.reason.into(),
            entry.details.as_ref().map(to_json).into(),
        ],
    );
}

/// One audit entry as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    pub id: String,
    pub at: String,
    pub actor_key_id: Option<String>,
    pub actor_org_id: Option<String>,
    pub org_id: Option<String>,
    pub action: String,
    pub object_type: String,
    pub object_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

/// Entries newest first, optionally of one org, strictly older than the `before` cursor.
pub async fn list(
    pool: &AnyPool,
    org_id: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<AuditEntry>> {
    let rows = sqlx::query(
        "SELECT seq, at, actor_key_id, actor_org_id, org_id, action, object_type, object_id, reason, details
         FROM audit_log
         WHERE ($1 IS NULL OR org_id = $1) AND ($2 IS NULL OR seq < $2)
         ORDER BY seq DESC LIMIT $3",
    )
    .bind(org_id)
    .bind(before)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| AuditEntry {
            id: r.get::<i64, _>("seq").to_string(),
            at: format_ms(r.get("at")),
            actor_key_id: r.get("actor_key_id"),
            actor_org_id: r.get("actor_org_id"),
            org_id: r.get("org_id"),
            action: r.get("action"),
            object_type: r.get("object_type"),
            object_id: r.get("object_id"),
            reason: r.get("reason"),
            details: r
                .get::<Option<String>, _>("details")
                .and_then(|d| serde_json::from_str(&d).ok()),
        })
        .collect())
}
