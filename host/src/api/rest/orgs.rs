//! Orgs and their API keys.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, PageQuery, page};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path, Query};
use crate::iam::Principal;
use crate::iam::keys::{self, ApiKey, CreatedKey, NewKey};
use crate::iam::orgs::{self, NewOrg, Org};
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_org))
        .routes(routes!(get_org))
        .routes(routes!(create_key, list_keys))
        .routes(routes!(revoke_key))
}

/// Create an org (platform admins).
#[utoipa::path(post, path = "/v1/orgs", tag = "orgs", request_body = NewOrg,
    responses((status = 201, body = Org), (status = 409, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn create_org(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<NewOrg>,
) -> Result<(StatusCode, Json<Org>)> {
    Ok((
        StatusCode::CREATED,
        Json(orgs::create(&app, &caller, body).await?),
    ))
}

/// Read an org: its own members, or ops.
#[utoipa::path(get, path = "/v1/orgs/{orgId}", tag = "orgs",
    params(("orgId" = String, Path)),
    responses((status = 200, body = Org), (status = 404, body = ErrorEnvelope)))]
async fn get_org(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
) -> Result<Json<Org>> {
    Ok(Json(orgs::get(&app, &caller, &org_id).await?))
}

/// Create an API key for an org. The secret appears only in this answer.
#[utoipa::path(post, path = "/v1/orgs/{orgId}/api-keys", tag = "orgs",
    params(("orgId" = String, Path)), request_body = NewKey,
    responses((status = 201, body = CreatedKey), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn create_key(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Json(body): Json<NewKey>,
) -> Result<(StatusCode, Json<CreatedKey>)> {
    Ok((
        StatusCode::CREATED,
        Json(keys::create(&app, &caller, &org_id, body).await?),
    ))
}

/// List an org's API keys, without secrets, oldest first (by id), one page at a time.
#[utoipa::path(get, path = "/v1/orgs/{orgId}/api-keys", tag = "orgs",
    params(("orgId" = String, Path), PageQuery),
    responses((status = 200, body = Page<ApiKey>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_keys(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<ApiKey>>> {
    let (limit, after) = q.checked()?;
    let found = keys::list(&app, &caller, &org_id, after, limit + 1).await?;
    Ok(Json(page(found, limit as i64, |k| k.id.clone())))
}

/// Revoke an API key; it stops authenticating at once.
#[utoipa::path(delete, path = "/v1/orgs/{orgId}/api-keys/{keyId}", tag = "orgs",
    params(("orgId" = String, Path), ("keyId" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorEnvelope)))]
async fn revoke_key(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((org_id, key_id)): Path<(String, String)>,
) -> Result<StatusCode> {
    keys::revoke(&app, &caller, &org_id, &key_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
