//! The HTTP surfaces: REST `/v1`, plus `/healthz`, `/metrics` and `/openapi.json`.
//! Handlers are thin: extract, call the domain, answer.

pub mod error;
pub mod extract;
mod openapi;
pub mod rest;
pub mod rpc;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;

use crate::metrics::RequestLabels;
use crate::{App, Error};

/// Largest JSON body any endpoint accepts.
pub const MAX_JSON_BODY: usize = 1 << 20;

#[derive(OpenApi)]
#[openapi(
    info(title = "orl", description = "GPU capacity platform whose policies are WebAssembly."),
    modifiers(&BearerAuth),
    security(("apiKey" = [])),
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "apiKey",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "Authorization: Bearer or_… (legacy vl_… keys still work)",
                    ))
                    .build(),
            ),
        );
    }
}

/// Every route of the server, with its middleware.
pub fn router(app: Arc<App>) -> Router {
    let (rest, openapi) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(rest::router())
        .split_for_parts();
    let openapi = Arc::new(openapi::document(&openapi));
    let rest = if app.clock.is_manual() {
        rest.route("/v1/clock", axum::routing::post(set_clock))
    } else {
        rest
    };
    rest.route(
        "/openapi.json",
        get(move || async move { Json(openapi.as_ref().clone()) }),
    )
    .route("/healthz", get(healthz))
    .route("/metrics", get(metrics))
    .merge(crate::graphql::router(app.clone()))
    .merge(crate::dashboard::router())
    .fallback(|| async { Error::NotFound("no such route".into()) })
    .method_not_allowed_fallback(|| async { error::method_not_allowed() })
    .layer(DefaultBodyLimit::max(MAX_JSON_BODY))
    .layer(middleware::from_fn_with_state(app.clone(), observe))
    .with_state(app)
}

/// Counts and times every request by route template and status, and logs server faults.
async fn observe(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    let status = response.status();
    if let Some(fault) = response.extensions().get::<error::Fault>() {
        tracing::error!(%method, %route, error = %format_args!("{:#}", fault.0), "request failed");
    }
    app.metrics.observe_request(
        RequestLabels {
            method,
            route,
            status: status.as_u16(),
        },
        started.elapsed().as_secs_f64(),
    );
    response
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SetClock {
    now_ms: i64,
}

/// Moves the manual clock (only mounted when the server runs on one; platform admins).
async fn set_clock(
    State(app): State<Arc<App>>,
    caller: crate::iam::Principal,
    extract::Json(body): extract::Json<SetClock>,
) -> crate::Result<Json<serde_json::Value>> {
    caller.require_ops(crate::iam::Permission::OrgsManage, "route")?;
    app.clock.set_ms(body.now_ms);
    // Time moved: let everything time drives catch up before answering.
    crate::reconciler::run_once(&app).await?;
    Ok(Json(serde_json::json!({ "nowMs": app.now_ms() })))
}

async fn healthz(State(app): State<Arc<App>>) -> Response {
    match sqlx::query("SELECT 1").execute(app.store.pool()).await {
        Ok(_) => Json(serde_json::json!({ "status": "ok" })).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "health check: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({ "status": "database unreachable" })),
            )
                .into_response()
        }
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::scrape(&app).await,
    )
        .into_response()
}

/// Every REST and RPC route as `(method, path template)`, read from the same registrations
/// [`router`] mounts: each handler's `#[utoipa::path]` both routes and documents it, so
/// this list is what the server answers. With `manual_clock`, `POST /v1/clock` too. The
/// routes outside the API (`/openapi.json`, `/healthz`, `/metrics`, `/graphql`) are not
/// listed. Tests sweep it.
#[doc(hidden)]
pub fn routes(manual_clock: bool) -> Vec<(String, String)> {
    let (_, openapi) = OpenApiRouter::<Arc<App>>::new()
        .merge(rest::router())
        .split_for_parts();
    let mut routes = Vec::new();
    for (path, item) in &openapi.paths.paths {
        let operations = [
            ("GET", &item.get),
            ("POST", &item.post),
            ("PUT", &item.put),
            ("PATCH", &item.patch),
            ("DELETE", &item.delete),
        ];
        for (method, operation) in operations {
            if operation.is_some() {
                routes.push((method.to_string(), path.clone()));
            }
        }
    }
    if manual_clock {
        routes.push(("POST".to_string(), "/v1/clock".to_string()));
    }
    routes
}
