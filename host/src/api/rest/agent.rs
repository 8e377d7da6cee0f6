//! The node agent protocol: what a node must bind or unbind now, and its reports.

use std::sync::Arc;

use axum::extract::State;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path};
use crate::booking::binding::{self, BindingView, Report};
use crate::iam::Principal;
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list_bindings))
        .routes(routes!(report))
}

/// What the node must bind or unbind now (its agent polls this; `inventory.write` for the
/// node's owner). Each call counts as the node reporting.
#[utoipa::path(get, path = "/v1/nodes/{nodeId}/bindings", tag = "node-agent",
    params(("nodeId" = String, Path)),
    responses((status = 200, body = Vec<BindingView>), (status = 404, body = ErrorEnvelope)))]
async fn list_bindings(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(node_id): Path<String>,
) -> Result<Json<Vec<BindingView>>> {
    Ok(Json(
        binding::pending_for_node(&app, &caller, &node_id).await?,
    ))
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
