//! Node reservations (exclusive rights over GPU units for orgs) and the catalog.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, PageQuery};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, JsonOrEmpty, Path, Query};
use crate::catalog::{self, Catalog};
use crate::iam::Principal;
use crate::node_reservations::actions::{
    self, Because, NewNodeReservation, ReclaimUnits, ReleaseUnits,
};
use crate::node_reservations::free::{self, FreeNode, FreeQuery};
use crate::node_reservations::queries::{self, NodeReservation, parse_status};
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create_node_reservation, list_for_node))
        .routes(routes!(get_one))
        .routes(routes!(release_units))
        .routes(routes!(reclaim))
        .routes(routes!(end))
        .routes(routes!(reaffirm))
        .routes(routes!(list_for_org))
        .routes(routes!(catalog))
        .routes(routes!(free_nodes))
}

/// Nodes with at least `unitCount` units that no booking and no node reservation holds at
/// any time over the term (platform operators): where to reserve. By node id, a page at a
/// time; a page looks at no more than 5,000 nodes and carries a cursor while more remain.
#[utoipa::path(get, path = "/v1/nodes/availability", tag = "node-reservations",
    params(FreeQuery),
    responses((status = 200, body = Page<FreeNode>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn free_nodes(
    State(app): State<Arc<App>>,
    caller: Principal,
    Query(query): Query<FreeQuery>,
) -> Result<Json<Page<FreeNode>>> {
    let (items, cursor) = free::free_nodes(&app, &caller, &query).await?;
    Ok(Json(Page { items, cursor }))
}

/// Reserve GPU units of a node for orgs (platform admin). Overlap with an existing
/// reservation is rejected atomically.
#[utoipa::path(post, path = "/v1/nodes/{nodeId}/reservations", tag = "node-reservations",
    params(("nodeId" = String, Path)), request_body = NewNodeReservation,
    responses((status = 201, body = NodeReservation), (status = 400, body = ErrorEnvelope),
              (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn create_node_reservation(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(node_id): Path<String>,
    Json(body): Json<NewNodeReservation>,
) -> Result<(StatusCode, Json<NodeReservation>)> {
    Ok((
        StatusCode::CREATED,
        Json(actions::create(&app, &caller, &node_id, body).await?),
    ))
}

/// The reservations on a node: every one for platform operators and the node's owner; for
/// an org managing an active reservation on it, the reservations it manages.
#[utoipa::path(get, path = "/v1/nodes/{nodeId}/reservations", tag = "node-reservations",
    params(("nodeId" = String, Path)),
    responses((status = 200, body = Vec<NodeReservation>), (status = 404, body = ErrorEnvelope)))]
async fn list_for_node(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(node_id): Path<String>,
) -> Result<Json<Vec<NodeReservation>>> {
    Ok(Json(queries::list_for_node(&app, &caller, &node_id).await?))
}

/// One reservation on a node, readable by the same orgs as the list: a managing org reads
/// only a reservation it manages.
#[utoipa::path(get, path = "/v1/nodes/{nodeId}/reservations/{id}", tag = "node-reservations",
    params(("nodeId" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = NodeReservation), (status = 404, body = ErrorEnvelope)))]
async fn get_one(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((node_id, id)): Path<(String, String)>,
) -> Result<Json<NodeReservation>> {
    Ok(Json(queries::get(&app, &caller, &node_id, &id).await?))
}

/// Release GPU units to the spot market (double sell): they stay the reservation's, and
/// anyone may buy them at tier=spot only.
#[utoipa::path(post, path = "/v1/nodes/{nodeId}/reservations/{id}/release", tag = "node-reservations",
    params(("nodeId" = String, Path), ("id" = String, Path)), request_body = ReleaseUnits,
    responses((status = 200, body = NodeReservation), (status = 400, body = ErrorEnvelope),
              (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn release_units(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((node_id, id)): Path<(String, String)>,
    Json(body): Json<ReleaseUnits>,
) -> Result<Json<NodeReservation>> {
    Ok(Json(
        actions::release(&app, &caller, &node_id, &id, body).await?,
    ))
}

/// Reclaim released GPU units from spot: they return to the reservation's exclusive use and
/// the spot workloads on them are terminated, in one call. `dryRun` reports what would be
/// terminated (`wouldTerminate`, `wouldSkip`) and changes nothing.
#[utoipa::path(post, path = "/v1/nodes/{nodeId}/reservations/{id}/reclaim", tag = "node-reservations",
    params(("nodeId" = String, Path), ("id" = String, Path)), request_body = ReclaimUnits,
    responses((status = 200, body = NodeReservation), (status = 400, body = ErrorEnvelope),
              (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn reclaim(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((node_id, id)): Path<(String, String)>,
    Json(body): Json<ReclaimUnits>,
) -> Result<Json<NodeReservation>> {
    Ok(Json(
        actions::reclaim(&app, &caller, &node_id, &id, body).await?,
    ))
}

/// End a reservation now (platform admin): its units return to the public pool at once;
/// workloads already running keep running.
#[utoipa::path(post, path = "/v1/nodes/{nodeId}/reservations/{id}/end", tag = "node-reservations",
    params(("nodeId" = String, Path), ("id" = String, Path)), request_body(content = Option<Because>),
    responses((status = 200, body = NodeReservation), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn end(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((node_id, id)): Path<(String, String)>,
    JsonOrEmpty(body): JsonOrEmpty<Because>,
) -> Result<Json<NodeReservation>> {
    Ok(Json(
        actions::end(&app, &caller, &node_id, &id, body).await?,
    ))
}

/// Re-affirm a `needs-review` reservation against the node's current topology (platform
/// admin); refused if its units no longer exist.
#[utoipa::path(post, path = "/v1/nodes/{nodeId}/reservations/{id}/reaffirm", tag = "node-reservations",
    params(("nodeId" = String, Path), ("id" = String, Path)), request_body(content = Option<Because>),
    responses((status = 200, body = NodeReservation), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn reaffirm(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((node_id, id)): Path<(String, String)>,
    JsonOrEmpty(body): JsonOrEmpty<Because>,
) -> Result<Json<NodeReservation>> {
    Ok(Json(
        actions::reaffirm(&app, &caller, &node_id, &id, body).await?,
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct StatusQuery {
    /// Only reservations in this status.
    #[param(pattern = "^(pending|active|expired|cancelled|needs-review)$")]
    status: Option<String>,
}

/// What GPU capacity is reserved to this org, and until when.
#[utoipa::path(get, path = "/v1/orgs/{orgId}/reservations", tag = "node-reservations",
    params(("orgId" = String, Path), StatusQuery),
    responses((status = 200, body = Vec<NodeReservation>), (status = 404, body = ErrorEnvelope)))]
async fn list_for_org(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Query(q): Query<StatusQuery>,
) -> Result<Json<Vec<NodeReservation>>> {
    let status = parse_status(q.status.as_deref())?;
    Ok(Json(
        queries::list_for_org(&app, &caller, &org_id, status).await?,
    ))
}

/// The units an org could place on now, per node, on the nodes of the pools it owns or is
/// offered: reserved units only for their audience, released units to everyone as
/// spot-only, needs-review units to no one; a unit a compute reservation holds now is
/// `booked`. One page of nodes by id; `cursor` continues it while nodes remain.
#[utoipa::path(get, path = "/v1/orgs/{orgId}/catalog", tag = "node-reservations",
    params(("orgId" = String, Path), PageQuery),
    responses((status = 200, body = Catalog), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn catalog(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Catalog>> {
    let (limit, after) = q.checked()?;
    Ok(Json(
        catalog::page(&app, &caller, &org_id, after, limit).await?,
    ))
}
