//! Policy plugins and their assignment to pools.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, PageQuery, page};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path, Query, RawBody};
use crate::iam::{Permission, Principal};
use crate::policy::assignment::{self, PoolPolicies, PoolPoliciesPatch};
use crate::policy::logs::{LINES_PER_PLUGIN, LogLine};
use crate::policy::registry::{self, MAX_PLUGIN_BYTES, Plugin};
use crate::{App, Error, Result, validation};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(upload, list_plugins))
        .layer(DefaultBodyLimit::max(MAX_PLUGIN_BYTES))
        .routes(routes!(get_plugin, delete_plugin))
        .routes(routes!(plugin_logs))
        .routes(routes!(put_policies, patch_policies, get_policies))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct UploadQuery {
    /// `^[A-Za-z0-9._:-]{1,128}$`
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,128}$", max_length = 128)]
    name: String,
    /// At most 64 characters, e.g. `1.2.0`.
    #[param(max_length = 64)]
    version: String,
}

/// Upload a WebAssembly component (the request body) implementing one of the worlds of
/// `orl:policy@0.1.0`; it is validated before it is stored (platform operators).
#[utoipa::path(post, path = "/v1/plugins", tag = "plugins", params(UploadQuery),
    request_body(content = Vec<u8>, content_type = "application/wasm"),
    responses((status = 201, body = Plugin), (status = 200, description = "Already stored", body = Plugin),
              (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 413, body = ErrorEnvelope)))]
async fn upload(
    State(app): State<Arc<App>>,
    caller: Principal,
    Query(q): Query<UploadQuery>,
    RawBody(body): RawBody,
) -> Result<(StatusCode, Json<Plugin>)> {
    let (plugin, created) =
        registry::upload(&app, &caller, &q.name, &q.version, body.to_vec()).await?;
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(plugin),
    ))
}

/// The built-in and uploaded plugins (`builtIn` tells them apart), with the pools each is
/// assigned to; by id, one page at a time (the cursor is a plugin id).
#[utoipa::path(get, path = "/v1/plugins", tag = "plugins", params(PageQuery),
    responses((status = 200, body = Page<Plugin>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_plugins(
    State(app): State<Arc<App>>,
    caller: Principal,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<Plugin>>> {
    let (limit, after) = q.checked()?;
    let plugins = registry::list(&app, &caller, after, limit + 1).await?;
    Ok(Json(page(plugins, limit as i64, |p| p.id.clone())))
}

/// One plugin, built-in or uploaded.
#[utoipa::path(get, path = "/v1/plugins/{id}", tag = "plugins", params(("id" = String, Path)),
    responses((status = 200, body = Plugin), (status = 404, body = ErrorEnvelope)))]
async fn get_plugin(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(id): Path<String>,
) -> Result<Json<Plugin>> {
    Ok(Json(registry::get(&app, &caller, &id).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct LogsQuery {
    /// 1-200, default 50.
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// The `cursor` of the previous page: the id of its last line.
    #[param(pattern = r"^[0-9]{1,20}$", max_length = 20)]
    cursor: Option<String>,
}

/// The last lines a plugin logged, on the replica that answers, newest first.
///
/// What the plugin logged (WIT `orl:policy/log`), a page at a time (the cursor is a line's
/// id). Each replica keeps, in memory, the last 200 lines of each plugin from the
/// decisions it ran, and loses them when it restarts; another replica has its own. A line
/// past a call's cap (64 lines or 16 KiB) is not kept: one `warn` line says how many were
/// dropped. Readable only by platform operators with `plugins.manage`, who manage plugins:
/// a plugin's lines may describe any pool's requests, so a pool's own managers, who may
/// read the plugin, do not read its lines.
#[utoipa::path(get, path = "/v1/plugins/{id}/logs", tag = "plugins",
    params(("id" = String, Path), LogsQuery),
    responses((status = 200, body = Page<LogLine>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn plugin_logs(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Result<Json<Page<LogLine>>> {
    let limit = q.limit.unwrap_or(50);
    validation::range("limit", limit, 1, LINES_PER_PLUGIN as i64)?;
    let before = q
        .cursor
        .map(|c| {
            c.parse::<u64>()
                .map_err(|_| Error::invalid("cursor", "not a cursor from this API"))
        })
        .transpose()?;
    caller.require_ops(Permission::PluginsManage, "plugin")?;
    let plugin = registry::get(&app, &caller, &id).await?;
    let lines = app
        .policy
        .logs()
        .newest(&plugin.id, before, limit as usize + 1);
    Ok(Json(page(lines, limit, |l| l.id.clone())))
}

/// Delete a plugin; refused (`409 CONFLICT`) while a pool uses it, and for a built-in.
#[utoipa::path(delete, path = "/v1/plugins/{id}", tag = "plugins", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn delete_plugin(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(id): Path<String>,
) -> Result<StatusCode> {
    registry::delete(&app, &caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Assign plugins to a pool, atomically: the body replaces the whole assignment (what it
/// leaves out goes back to its default); decisions already running finish on the plugin
/// they started with.
#[utoipa::path(put, path = "/v1/pools/{poolId}/policies", tag = "plugins", params(("poolId" = String, Path)), request_body = PoolPolicies,
    responses((status = 200, body = PoolPolicies), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn put_policies(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
    Json(body): Json<PoolPolicies>,
) -> Result<Json<PoolPolicies>> {
    Ok(Json(assignment::put(&app, &caller, &pool_id, body).await?))
}

/// Change only the named fields of a pool's assignment, atomically (`null` puts a field
/// back to its default).
#[utoipa::path(patch, path = "/v1/pools/{poolId}/policies", tag = "plugins", params(("poolId" = String, Path)), request_body = PoolPoliciesPatch,
    responses((status = 200, body = PoolPolicies), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn patch_policies(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
    Json(body): Json<PoolPoliciesPatch>,
) -> Result<Json<PoolPolicies>> {
    Ok(Json(
        assignment::patch(&app, &caller, &pool_id, body).await?,
    ))
}

/// The plugins a pool assigns (absent: the built-in defaults), and in `effective` the
/// plugin that decides each policy now.
#[utoipa::path(get, path = "/v1/pools/{poolId}/policies", tag = "plugins", params(("poolId" = String, Path)),
    responses((status = 200, body = PoolPolicies), (status = 404, body = ErrorEnvelope)))]
async fn get_policies(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
) -> Result<Json<PoolPolicies>> {
    Ok(Json(assignment::get(&app, &caller, &pool_id).await?))
}
