//! Tenant IAM policies and confirmation requests.

use std::sync::Arc;

use axum::extract::State;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, PageQuery, page};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path, Query};
use crate::iam::Principal;
use crate::iam::confirmations::{self, Confirmation};
use crate::iam::policy::{self, OrgPolicy};
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(put_policy, get_policy))
        .routes(routes!(list_confirmations))
        .routes(routes!(approve))
        .routes(routes!(deny))
}

/// Set the org's Cedar policy (an empty text removes it).
#[utoipa::path(put, path = "/v1/orgs/{orgId}/iam/policy", tag = "iam", params(("orgId" = String, Path)), request_body = OrgPolicy,
    responses((status = 200, body = OrgPolicy), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn put_policy(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Json(body): Json<OrgPolicy>,
) -> Result<Json<OrgPolicy>> {
    Ok(Json(policy::put(&app, &caller, &org_id, body).await?))
}

/// The org's Cedar policy (empty when it has none).
#[utoipa::path(get, path = "/v1/orgs/{orgId}/iam/policy", tag = "iam", params(("orgId" = String, Path)),
    responses((status = 200, body = OrgPolicy), (status = 404, body = ErrorEnvelope)))]
async fn get_policy(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
) -> Result<Json<OrgPolicy>> {
    Ok(Json(policy::get(&app, &caller, &org_id).await?))
}

/// The org's confirmation requests, newest first, one page at a time.
#[utoipa::path(get, path = "/v1/orgs/{orgId}/confirmations", tag = "iam", params(("orgId" = String, Path), PageQuery),
    responses((status = 200, body = Page<Confirmation>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_confirmations(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<Confirmation>>> {
    let (limit, before) = q.checked()?;
    let found = confirmations::list(&app, &caller, &org_id, before, limit + 1).await?;
    Ok(Json(page(found, limit as i64, |c| c.id.clone())))
}

/// A person approves an agent's request; the agent's retry with the same key continues it.
#[utoipa::path(post, path = "/v1/orgs/{orgId}/confirmations/{id}/approve", tag = "iam", params(("orgId" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = Confirmation), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn approve(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((org_id, id)): Path<(String, String)>,
) -> Result<Json<Confirmation>> {
    Ok(Json(
        confirmations::decide(&app, &caller, &org_id, &id, true).await?,
    ))
}

/// A person denies an agent's request; the agent's retry is `ACCESS_DENIED`.
#[utoipa::path(post, path = "/v1/orgs/{orgId}/confirmations/{id}/deny", tag = "iam", params(("orgId" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = Confirmation), (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn deny(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((org_id, id)): Path<(String, String)>,
) -> Result<Json<Confirmation>> {
    Ok(Json(
        confirmations::decide(&app, &caller, &org_id, &id, false).await?,
    ))
}
