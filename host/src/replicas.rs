//! The replicas serving one database. Each `orl serve` records itself when it starts,
//! says it is alive every [`HEARTBEAT`], and takes its row away when it stops; a replica
//! not heard from for [`SEEN_WITHIN`] is no longer listed (one that crashed), and its row
//! is removed a day later. Times are the machines' wall clocks, not the API's clock.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlx::Row as _;

use crate::{App, Result};

/// How often a replica says it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// How recently a replica must have said so to be listed.
pub const SEEN_WITHIN: Duration = Duration::from_secs(30);
/// When the row of a replica that stopped without taking it away is removed.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(24 * 3600);

/// One replica as `GET /v1/status` lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Replica {
    pub id: String,
    /// The `orl` version it runs.
    pub version: String,
    /// The machine it runs on.
    pub host: String,
    /// Epoch milliseconds.
    pub started_at: i64,
    /// When it last said it was alive, epoch milliseconds.
    pub seen_at: i64,
}

fn wall_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Records this replica ([`App::replica`]) as started now.
pub async fn join(app: &App) -> Result<()> {
    let now = wall_ms();
    let mut tx = app.store.begin().await?;
    sqlx::query(
        "INSERT INTO replicas (id, version, host, started_at, seen_at) VALUES ($1, $2, $3, $4, $4)",
    )
    .bind(&app.replica)
    .bind(env!("CARGO_PKG_VERSION"))
    .bind(host_name())
    .bind(now)
    .execute(&mut **tx)
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Says this replica is alive every [`HEARTBEAT`], and removes rows long forgotten.
pub fn spawn_heartbeat(app: Arc<App>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(HEARTBEAT);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            if let Err(err) = beat(&app).await {
                tracing::warn!(error = %err, "recording that this replica is alive");
            }
        }
    })
}

async fn beat(app: &App) -> Result<()> {
    let now = wall_ms();
    let forgotten = now - FORGOTTEN_AFTER.as_millis() as i64;
    let mut tx = app.store.begin().await?;
    sqlx::query("UPDATE replicas SET seen_at = $1 WHERE id = $2")
        .bind(now)
        .bind(&app.replica)
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM replicas WHERE seen_at < $1")
        .bind(forgotten)
        .execute(&mut **tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Takes this replica's row away (on a graceful stop).
pub async fn leave(app: &App) -> Result<()> {
    let mut tx = app.store.begin().await?;
    sqlx::query("DELETE FROM replicas WHERE id = $1")
        .bind(&app.replica)
        .execute(&mut **tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// The replicas heard from within [`SEEN_WITHIN`], oldest first.
pub async fn seen(app: &App) -> Result<Vec<Replica>> {
    let since = wall_ms() - SEEN_WITHIN.as_millis() as i64;
    let rows = sqlx::query(
        "SELECT id, version, host, started_at, seen_at FROM replicas
         WHERE seen_at >= $1 ORDER BY started_at, id",
    )
    .bind(since)
    .fetch_all(app.store.pool())
    .await?;
    Ok(rows
        .iter()
        .map(|row| Replica {
            id: row.get("id"),
            version: row.get("version"),
            host: row.get("host"),
            started_at: row.get("started_at"),
            seen_at: row.get("seen_at"),
        })
        .collect())
}
