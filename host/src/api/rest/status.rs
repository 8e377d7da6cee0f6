//! `GET /v1/status`: how the platform's servers are doing, for operators.

use std::sync::Arc;

use axum::extract::State;
use serde::Serialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::api::error::ErrorEnvelope;
use crate::api::extract::Json;
use crate::iam::{Permission, Principal};
use crate::replicas::{self, Replica};
use crate::store::Backend;
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(status))
}

/// What `GET /v1/status` answers.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The `orl` version of the replica that answered.
    pub version: String,
    /// `sqlite` or `postgresql`.
    pub database: String,
    /// The id of the replica that answered.
    pub replica: String,
    /// The replicas on this database heard from in the last 30 seconds, oldest first.
    pub replicas: Vec<Replica>,
    pub reconciler: ReconcilerStatus,
    /// The policy plugins that decided on the replica that answered since it started.
    pub plugins: Vec<PluginHealth>,
}

/// The answering replica's reconciler.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReconcilerStatus {
    /// When its last pass ended (wall clock, epoch milliseconds); absent before the first
    /// and on a server whose clock only moves through `POST /v1/clock`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_pass_at: Option<i64>,
    /// Reservations due at the last pass.
    pub due: i64,
    /// How long the oldest of them had been due, in seconds.
    pub lag_seconds: f64,
}

/// One plugin's decisions in one world.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PluginHealth {
    pub plugin_id: String,
    pub world: String,
    pub decisions: i64,
    /// Decisions that failed: a trap, the deadline, the memory cap or an invalid answer.
    pub failures: i64,
}

/// The answering replica's version, database and reconciler, the replicas seen, and how
/// the policy plugins are doing (platform operators).
#[utoipa::path(get, path = "/v1/status", tag = "status",
    responses((status = 200, body = Status), (status = 401, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn status(State(app): State<Arc<App>>, caller: Principal) -> Result<Json<Status>> {
    caller.require_ops(Permission::OrgsManage, "route")?;
    let (last_pass_at, due, lag_seconds) = app.metrics.reconciler();
    let mut plugins: Vec<PluginHealth> = crate::graphql::decisions::by_plugin(&app.metrics)
        .into_iter()
        .flat_map(|(plugin_id, counts)| {
            let mut worlds: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
            for count in counts {
                let entry = worlds.entry(count.world.clone()).or_default();
                entry.0 += count.count;
                entry.1 += if count.failed() { count.count } else { 0 };
            }
            worlds
                .into_iter()
                .map(move |(world, (decisions, failures))| PluginHealth {
                    plugin_id: plugin_id.clone(),
                    world,
                    decisions,
                    failures,
                })
        })
        .collect();
    plugins.sort_by(|a, b| (&a.world, &a.plugin_id).cmp(&(&b.world, &b.plugin_id)));
    Ok(Json(Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        database: match app.store.backend() {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgresql",
        }
        .to_string(),
        replica: app.replica.clone(),
        replicas: replicas::seen(&app).await?,
        reconciler: ReconcilerStatus {
            last_pass_at,
            due,
            lag_seconds,
        },
        plugins,
    }))
}
