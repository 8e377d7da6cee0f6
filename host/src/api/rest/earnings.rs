//! Provider earnings and payouts.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Path};
use crate::earnings::{self, Earnings, NewPayout, Payout};
use crate::iam::Principal;
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(get_earnings))
        .routes(routes!(create_payout))
}

/// What a provider org earned from GPU time on its nodes, what is available for payout,
/// breakdowns by node, GPU model and UTC day, and its recent payouts. Integer minor units,
/// each per-day part of a booking rounded down (see the `earnings` module). For the org's
/// members holding `provider.read`, and platform operators.
#[utoipa::path(get, path = "/v1/orgs/{orgId}/provider/earnings", tag = "provider",
    params(("orgId" = String, Path)),
    responses((status = 200, body = Earnings), (status = 404, body = ErrorEnvelope)))]
async fn get_earnings(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
) -> Result<Json<Earnings>> {
    Ok(Json(earnings::get(&app, &caller, &org_id).await?))
}

/// Record a payout to a provider org (platform operators). Refused with `INVALID_STATE`
/// when the amount exceeds what is available at that moment.
#[utoipa::path(post, path = "/v1/orgs/{orgId}/provider/payouts", tag = "provider",
    params(("orgId" = String, Path)), request_body = NewPayout,
    responses((status = 201, body = Payout), (status = 400, body = ErrorEnvelope),
              (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn create_payout(
    State(app): State<Arc<App>>,
    caller: Principal,
    Path(org_id): Path<String>,
    Json(body): Json<NewPayout>,
) -> Result<(StatusCode, Json<Payout>)> {
    Ok((
        StatusCode::CREATED,
        Json(earnings::pay_out(&app, &caller, &org_id, body).await?),
    ))
}
