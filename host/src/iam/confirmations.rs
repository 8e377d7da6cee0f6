//! Confirmation requests: when an agent's request is refused but a person may approve it,
//! the request waits (at most 30 minutes) for a non-agent key of the org to approve or deny.

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::{Permission, Principal};
use crate::ids::new_id;
use crate::store::to_json;
use crate::{Error, Result};

/// How long a confirmation request waits for a person.
pub const CONFIRMATION_WINDOW_MS: i64 = 30 * 60 * 1000;

/// `pending`, `approved`, `denied` or `expired`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Confirmation {
    pub id: String,
    pub org_id: String,
    pub reservation_id: String,
    /// The agent key that asked.
    pub requested_by: String,
    pub action: String,
    pub attributes: Value,
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    pub created_at: String,
    pub expires_at: String,
}

/// Opens a confirmation request for an agent's refused `action` on `reservation_id`.
pub async fn open(
    conn: &mut AnyConnection,
    caller: &Principal,
    reservation_id: &str,
    action: &str,
    attributes: &Value,
    now: i64,
) -> Result<Confirmation> {
    let id = new_id("cfm", now);
    sqlx::query(
        "INSERT INTO confirmations (id, org_id, reservation_id, requested_by, action, attributes, state, created_at, expires_at)
         VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8)",
    )
    .bind(&id)
    .bind(&caller.org_id)
    .bind(reservation_id)
    .bind(&caller.key_id)
    .bind(action)
    .bind(to_json(attributes))
    .bind(now)
    .bind(now + CONFIRMATION_WINDOW_MS)
    .execute(&mut *conn)
    .await?;
    find(conn, &id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("confirmation {id} vanished").into())
}

const COLUMNS: &str = "id, org_id, reservation_id, requested_by, action, attributes, state, decided_by, created_at, expires_at";

fn from_row(r: &AnyRow) -> Confirmation {
    Confirmation {
        id: r.get("id"),
        org_id: r.get("org_id"),
        reservation_id: r.get("reservation_id"),
        requested_by: r.get("requested_by"),
        action: r.get("action"),
        attributes: serde_json::from_str(&r.get::<String, _>("attributes")).unwrap_or(Value::Null),
        state: r.get("state"),
        decided_by: r.get("decided_by"),
        created_at: format_ms(r.get("created_at")),
        expires_at: format_ms(r.get("expires_at")),
    }
}

pub async fn find(conn: &mut AnyConnection, id: &str) -> Result<Option<Confirmation>> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM confirmations WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(conn)
    .await?;
    Ok(row.as_ref().map(from_row))
}

/// The org's confirmation requests newest first (by id, which is time-ordered), at most
/// `limit` of them older than the request `before`.
pub async fn list(
    app: &App,
    caller: &Principal,
    org_id: &str,
    before: Option<&str>,
    limit: usize,
) -> Result<Vec<Confirmation>> {
    caller.require_for(
        Permission::ComputeRead,
        org_id,
        format_args!("org {org_id}"),
    )?;
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM confirmations WHERE org_id = $1 AND ($2 = '' OR id < $2)
         ORDER BY id DESC LIMIT $3"
    ))
    .bind(org_id)
    .bind(before.unwrap_or(""))
    .bind(limit as i64)
    .fetch_all(app.store.pool())
    .await?;
    Ok(rows.iter().map(from_row).collect())
}

/// A person of the org approves or denies a pending request. Agents cannot decide.
pub async fn decide(
    app: &App,
    caller: &Principal,
    org_id: &str,
    id: &str,
    approve: bool,
) -> Result<Confirmation> {
    let what = format!("confirmation {id}");
    caller.require_for(Permission::ComputeCreate, org_id, &what)?;
    if caller.agent {
        return Err(Error::AccessDenied(
            "an agent key cannot decide a confirmation request; a person must".into(),
        ));
    }
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let confirmation = find(&mut tx, id)
        .await?
        .filter(|c| c.org_id == org_id)
        .ok_or_else(|| Error::not_found(&what))?;
    let expires: i64 = sqlx::query_scalar("SELECT expires_at FROM confirmations WHERE id = $1")
        .bind(id)
        .fetch_one(&mut **tx)
        .await?;
    if confirmation.state != "pending" || expires <= now {
        return Err(Error::InvalidState(format!(
            "{what} is {}",
            if confirmation.state == "pending" {
                "expired"
            } else {
                &confirmation.state
            }
        )));
    }
    let state = if approve { "approved" } else { "denied" };
    sqlx::query("UPDATE confirmations SET state = $1, decided_by = $2, decided_at = $3 WHERE id = $4 AND state = 'pending'")
        .bind(state)
        .bind(&caller.key_id)
        .bind(now)
        .bind(id)
        .execute(&mut **tx)
        .await?;
    let entry = Entry {
        org_id,
        action: if approve {
            "confirmation.approve"
        } else {
            "confirmation.deny"
        },
        object_type: "confirmation",
        object_id: id,
        reason: None,
        details: Some(json!({ "reservationId": confirmation.reservation_id })),
    };
    audit::record(&mut tx, caller, entry, now).await?;
    let decided = find(&mut tx, id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{what} vanished"))?;
    tx.commit().await?;
    Ok(decided)
}
