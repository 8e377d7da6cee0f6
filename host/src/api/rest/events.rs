//! The event outbox, read in order.

use std::sync::Arc;

use axum::extract::State;
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::Page;
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Query};
use crate::events::{self, Event};
use crate::iam::{Permission, Principal};
use crate::{App, Error, Result, validation};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(list_events))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Only events after this id (the `cursor` of the previous page).
    after: Option<i64>,
    /// 1-500, default 100.
    limit: Option<i64>,
}

/// Events the caller's org may see, oldest first.
#[utoipa::path(get, path = "/v1/events", tag = "events", params(EventsQuery),
    responses((status = 200, body = Page<Event>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_events(
    State(app): State<Arc<App>>,
    caller: Principal,
    Query(q): Query<EventsQuery>,
) -> Result<Json<Page<Event>>> {
    if !caller.has(Permission::EventsRead) {
        return Err(Error::NotFound("events not found".into()));
    }
    let limit = q.limit.unwrap_or(100);
    validation::range("limit", limit, 1, 500)?;
    let after = q.after.unwrap_or(0);
    validation::range("after", after, 0, i64::MAX)?;
    let items = events::list(app.store.pool(), &caller.org_id, after, limit).await?;
    let cursor = (items.len() as i64 == limit)
        .then(|| items.last().map(|e| e.id.to_string()))
        .flatten();
    Ok(Json(Page { items, cursor }))
}
