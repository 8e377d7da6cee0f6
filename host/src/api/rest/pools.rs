//! Pools and offers.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, PageQuery, page};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path, Query};
use crate::iam::Principal;
use crate::pools::store::{self, NewOffer, NewPool, Offer, Pool, PoolNodes};
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_pool, list_pools))
        .routes(routes!(get_pool))
        .routes(routes!(set_nodes))
        .routes(routes!(archive))
        .routes(routes!(capacity_check))
        .routes(routes!(put_offer, list_offers))
}

/// Create a pool of nodes with a policy.
#[utoipa::path(post, path = "/v1/pools", tag = "pools", request_body = NewPool,
    responses((status = 201, body = Pool), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn create_pool(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<NewPool>,
) -> Result<(StatusCode, Json<Pool>)> {
    Ok((
        StatusCode::CREATED,
        Json(store::create(&app, &caller, body).await?),
    ))
}

/// The pools the caller owns or is offered (all of them, for platform operators), by id,
/// one page at a time.
#[utoipa::path(get, path = "/v1/pools", tag = "pools", params(PageQuery),
    responses((status = 200, body = Page<Pool>), (status = 400, body = ErrorEnvelope)))]
async fn list_pools(
    State(app): State<Arc<App>>,
    caller: Principal,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<Pool>>> {
    let (limit, after) = q.checked()?;
    let pools = store::list(&app, &caller, after, limit + 1).await?;
    Ok(Json(page(pools, limit as i64, |p| p.id.clone())))
}

/// One pool: visible to its owner and to the tenants it is offered to.
#[utoipa::path(get, path = "/v1/pools/{poolId}", tag = "pools", params(("poolId" = String, Path)),
    responses((status = 200, body = Pool), (status = 404, body = ErrorEnvelope)))]
async fn get_pool(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
) -> Result<Json<Pool>> {
    Ok(Json(store::get(&app, &caller, &pool_id).await?))
}

/// Replace the pool's nodes.
#[utoipa::path(put, path = "/v1/pools/{poolId}/nodes", tag = "pools", params(("poolId" = String, Path)), request_body = PoolNodes,
    responses((status = 200, body = Pool), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn set_nodes(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
    Json(body): Json<PoolNodes>,
) -> Result<Json<Pool>> {
    Ok(Json(store::set_nodes(&app, &caller, &pool_id, body).await?))
}

/// Archive a pool: it takes no new reservations.
#[utoipa::path(post, path = "/v1/pools/{poolId}/archive", tag = "pools", params(("poolId" = String, Path)),
    responses((status = 200, body = Pool), (status = 404, body = ErrorEnvelope)))]
async fn archive(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
) -> Result<Json<Pool>> {
    Ok(Json(store::archive(&app, &caller, &pool_id).await?))
}

/// Offer the pool to a tenant with quota, price and budget (replaces an existing offer).
#[utoipa::path(post, path = "/v1/pools/{poolId}/offers", tag = "pools", params(("poolId" = String, Path)), request_body = NewOffer,
    responses((status = 201, body = Offer), (status = 200, body = Offer), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn put_offer(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
    Json(body): Json<NewOffer>,
) -> Result<(StatusCode, Json<Offer>)> {
    let (offer, created) = store::put_offer(&app, &caller, &pool_id, body).await?;
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(offer),
    ))
}

/// The pool's offers with quota used: all for its managers, a tenant's own for a tenant;
/// by tenant id, one page at a time (the cursor is a tenant id).
#[utoipa::path(get, path = "/v1/pools/{poolId}/offers", tag = "pools", params(("poolId" = String, Path), PageQuery),
    responses((status = 200, body = Page<Offer>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_offers(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<Offer>>> {
    let (limit, after) = q.checked()?;
    let offers = store::list_offers(&app, &caller, &pool_id, after, limit + 1).await?;
    Ok(Json(page(offers, limit as i64, |o| o.tenant_id.clone())))
}

/// How this replica's capacity view of a pool compares with the database.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityCheck {
    /// Nodes of the pool compared.
    pub nodes: usize,
    /// Nodes whose units, bookings, host bookings or claims in memory differ from the
    /// database now (empty when the view is current).
    pub stale_node_ids: Vec<String>,
}

/// Compare this replica's in-memory capacity of the pool's nodes with the database
/// (platform operators). A node that stays stale for more than a moment means changes are
/// not reaching this replica.
#[utoipa::path(get, path = "/v1/pools/{poolId}/capacity-check", tag = "pools", params(("poolId" = String, Path)),
    responses((status = 200, body = CapacityCheck), (status = 404, body = ErrorEnvelope)))]
async fn capacity_check(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(pool_id): Path<String>,
) -> Result<Json<CapacityCheck>> {
    caller.require_ops(
        crate::iam::Permission::PoolsManage,
        format_args!("pool {pool_id}"),
    )?;
    let pool = store::get(&app, &caller, &pool_id).await?;
    Ok(Json(CapacityCheck {
        nodes: pool.node_ids.len(),
        stale_node_ids: app.capacity.differences(&pool.node_ids).await?,
    }))
}
