//! Provider nodes and their inventory.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, PageQuery, page};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path, Query};
use crate::iam::Principal;
use crate::inventory::NodeInventory;
use crate::inventory::nodes::{self, Change, Node};
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(put_node))
        .routes(routes!(list_nodes))
        .routes(routes!(get_node))
}

/// Register a node owned by `orgId`, or replace its inventory (with optional node and unit
/// `labels`). The same inventory again changes nothing; a topology change bumps
/// `topologyGen`, a change of labels alone does not.
#[utoipa::path(put, path = "/v1/orgs/{orgId}/provider/nodes/{nodeId}", tag = "nodes",
    params(("orgId" = String, Path), ("nodeId" = String, Path)), request_body = NodeInventory,
    responses((status = 201, description = "Registered", body = Node), (status = 200, description = "Updated or unchanged", body = Node),
              (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn put_node(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((org_id, node_id)): Path<(String, String)>,
    Json(body): Json<NodeInventory>,
) -> Result<(StatusCode, Json<Node>)> {
    let (node, change) = nodes::register(&app, &caller, &org_id, &node_id, body).await?;
    let status = if change == Change::Registered {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(node)))
}

/// The nodes an org owns, by id, one page at a time.
#[utoipa::path(get, path = "/v1/orgs/{orgId}/provider/nodes", tag = "nodes",
    params(("orgId" = String, Path), PageQuery),
    responses((status = 200, body = Page<Node>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_nodes(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<Node>>> {
    let (limit, after) = q.checked()?;
    let nodes = nodes::list(&app, &caller, &org_id, after, limit + 1).await?;
    Ok(Json(page(nodes, limit as i64, |n| n.id.clone())))
}

/// One node: readable by ops and the owning org.
#[utoipa::path(get, path = "/v1/nodes/{nodeId}", tag = "nodes",
    params(("nodeId" = String, Path)),
    responses((status = 200, body = Node), (status = 404, body = ErrorEnvelope)))]
async fn get_node(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(node_id): Path<String>,
) -> Result<Json<Node>> {
    Ok(Json(nodes::get(&app, &caller, &node_id).await?))
}
