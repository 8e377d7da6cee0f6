//! The reservation RPC: `POST /api/compute/reservations/{method}` with a JSON body.

use std::sync::Arc;

use axum::extract::State;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::api::error::ErrorEnvelope;
use crate::api::extract::Json;
use crate::booking::CreateRequest;
use crate::booking::availability::{self, Availability, AvailabilityRequest};
use crate::booking::create;
use crate::booking::extend::{self, ExtendInput, Extended};
use crate::booking::lifecycle::{self, ReservationRef};
use crate::booking::list::{self, ListInput, ReservationPage};
use crate::booking::plan::{self, Plan};
use crate::booking::store::ComputeReservation;
use crate::iam::Principal;
use crate::{App, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(create))
        .routes(routes!(get))
        .routes(routes!(list))
        .routes(routes!(release))
        .routes(routes!(cancel))
        .routes(routes!(extend))
        .routes(routes!(renew))
        .routes(routes!(availability))
        .routes(routes!(plan))
}

/// Books devices of one pool for a time window after one IAM decision on the draft;
/// returns the reservation, `placed` or `pending`.
#[utoipa::path(post, path = "/api/compute/reservations/create", operation_id = "compute_reservations_create", tag = "compute-reservations", request_body = CreateRequest,
    responses((status = 200, body = ComputeReservation), (status = 400, body = ErrorEnvelope), (status = 402, body = ErrorEnvelope),
              (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope),
              (status = 502, body = ErrorEnvelope)))]
async fn create(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<CreateRequest>,
) -> Result<Json<ComputeReservation>> {
    Ok(Json(create::create(&app, &caller, body).await?))
}

/// One reservation of the tenant; drafts are `NOT_FOUND`.
#[utoipa::path(post, path = "/api/compute/reservations/get", operation_id = "compute_reservations_get", tag = "compute-reservations", request_body = ReservationRef,
    responses((status = 200, body = ComputeReservation), (status = 404, body = ErrorEnvelope)))]
async fn get(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<ReservationRef>,
) -> Result<Json<ComputeReservation>> {
    Ok(Json(lifecycle::get(&app, &caller, body).await?))
}

/// The tenant's reservations newest first, drafts skipped, one page at a time.
#[utoipa::path(post, path = "/api/compute/reservations/list", operation_id = "compute_reservations_list", tag = "compute-reservations", request_body = ListInput,
    responses((status = 200, body = ReservationPage), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<ListInput>,
) -> Result<Json<ReservationPage>> {
    Ok(Json(list::list(&app, &caller, body).await?))
}

/// Ends a reservation now: bookings released, quota refunded, `released` (a pending one is
/// `cancelled`).
#[utoipa::path(post, path = "/api/compute/reservations/release", operation_id = "compute_reservations_release", tag = "compute-reservations", request_body = ReservationRef,
    responses((status = 200, body = ComputeReservation), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn release(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<ReservationRef>,
) -> Result<Json<ComputeReservation>> {
    Ok(Json(lifecycle::release(&app, &caller, body).await?))
}

/// Withdraws a reservation that has not started (`pending` or `placed`).
#[utoipa::path(post, path = "/api/compute/reservations/cancel", operation_id = "compute_reservations_cancel", tag = "compute-reservations", request_body = ReservationRef,
    responses((status = 200, body = ComputeReservation), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn cancel(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<ReservationRef>,
) -> Result<Json<ComputeReservation>> {
    Ok(Json(lifecycle::cancel(&app, &caller, body).await?))
}

/// Moves the end of a placed, binding or active reservation later, all or nothing.
#[utoipa::path(post, path = "/api/compute/reservations/extend", operation_id = "compute_reservations_extend", tag = "compute-reservations", request_body = ExtendInput,
    responses((status = 200, body = Extended), (status = 400, body = ErrorEnvelope), (status = 402, body = ErrorEnvelope),
              (status = 403, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope),
              (status = 502, body = ErrorEnvelope)))]
async fn extend(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<ExtendInput>,
) -> Result<Json<Extended>> {
    Ok(Json(extend::extend(&app, &caller, body).await?))
}

/// Moves the lease deadline to now plus `leaseSeconds`.
#[utoipa::path(post, path = "/api/compute/reservations/renew", operation_id = "compute_reservations_renew", tag = "compute-reservations", request_body = ReservationRef,
    responses((status = 200, body = ComputeReservation), (status = 404, body = ErrorEnvelope), (status = 409, body = ErrorEnvelope)))]
async fn renew(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<ReservationRef>,
) -> Result<Json<ComputeReservation>> {
    Ok(Json(lifecycle::renew(&app, &caller, body).await?))
}

/// The earliest starts in a window at which a request fits, with the nodes and units it
/// would get, and whether quota and budget would take it now. Writes nothing.
#[utoipa::path(post, path = "/api/compute/reservations/availability", operation_id = "compute_reservations_availability", tag = "compute-reservations", request_body = AvailabilityRequest,
    responses((status = 200, body = Availability), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
              (status = 502, body = ErrorEnvelope)))]
async fn availability(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<AvailabilityRequest>,
) -> Result<Json<Availability>> {
    Ok(Json(availability::availability(&app, &caller, body).await?))
}

/// What `create` would do with the request now, step by step: the IAM decision, the quota
/// charge, the spend-guard's answer, the placement and any spot work preempted. Writes
/// nothing.
#[utoipa::path(post, path = "/api/compute/reservations/plan", operation_id = "compute_reservations_plan", tag = "compute-reservations", request_body = CreateRequest,
    responses((status = 200, body = Plan), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope),
              (status = 409, body = ErrorEnvelope), (status = 502, body = ErrorEnvelope)))]
async fn plan(
    State(app): State<Arc<App>>,
    caller: Principal,
    Json(body): Json<CreateRequest>,
) -> Result<Json<Plan>> {
    Ok(Json(plan::plan(&app, &caller, body).await?))
}
