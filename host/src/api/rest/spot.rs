//! Provider-side spot control: terminating spot workloads on a node for capacity.

use std::sync::Arc;

use axum::extract::State;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, JsonOrEmpty, Path};
use crate::iam::Principal;
use crate::spot::{self, ReclaimOutcome, ReclaimSpot};
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(reclaim_spot))
}

/// Terminate spot workloads on a node your org owns, or on the released units of
/// reservations it manages there while each is active and inside its term. Non-spot
/// workloads are never touched; every termination is audited and the workload records
/// reason `capacity-reclaim`.
#[utoipa::path(post, path = "/v1/orgs/{orgId}/provider/nodes/{nodeId}/reclaim-spot", tag = "provider",
    params(("orgId" = String, Path), ("nodeId" = String, Path)), request_body(content = Option<ReclaimSpot>),
    responses((status = 200, body = ReclaimOutcome), (status = 400, body = ErrorEnvelope),
              (status = 404, body = ErrorEnvelope)))]
async fn reclaim_spot(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path((org_id, node_id)): Path<(String, String)>,
    JsonOrEmpty(body): JsonOrEmpty<ReclaimSpot>,
) -> Result<Json<ReclaimOutcome>> {
    Ok(Json(
        spot::provider_reclaim(&app, &caller, &org_id, &node_id, body).await?,
    ))
}
