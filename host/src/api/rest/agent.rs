//! The node agent protocol: what a node must bind or unbind now, and its reports.

use std::sync::Arc;

use axum::extract::State;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, PageQuery, page};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path, Query};
use crate::booking::binding::{self, BindingView, Report};
use crate::iam::Principal;
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list_bindings))
        .routes(routes!(report))
}

/// What the node must bind or unbind now, oldest request first, one page at a time (the
/// cursor is a reservation id; its agent polls this, `inventory.write` for the node's
/// owner). Each call counts as the node reporting.
#[utoipa::path(get, path = "/v1/nodes/{nodeId}/bindings", tag = "node-agent",
    params(("nodeId" = String, Path), PageQuery),
    responses((status = 200, body = Page<BindingView>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_bindings(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(node_id): Path<String>,
    Query(q): Query<PageQuery>,
) -> Result<Json<Page<BindingView>>> {
    let (limit, after) = q.checked()?;
    let views = binding::pending_for_node(&app, &caller, &node_id, after, limit + 1).await?;
    Ok(Json(page(views, limit as i64, |b| {
        b.reservation_id.clone()
    })))
}

/// The node reports on one reservation: `bound` (it becomes active), `failed` (it ends
/// failed, its quota refunded) or `allocation-released` (after an unbind: no pod holds the
/// devices any more, their bookings end now). Answers the reservation's binding.
#[utoipa::path(post, path = "/v1/nodes/{nodeId}/bindings/{reservationId}", tag = "node-agent",
    params(("nodeId" = String, Path), ("reservationId" = String, Path)), request_body = Report,
    responses((status = 200, body = BindingView), (status = 400, body = ErrorEnvelope),
              (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn report(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((node_id, reservation_id)): Path<(String, String)>,
    Json(body): Json<Report>,
) -> Result<Json<BindingView>> {
    Ok(Json(
        binding::report(&app, &caller, &node_id, &reservation_id, body).await?,
    ))
}
