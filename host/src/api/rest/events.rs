//! The event outbox, read in order: a page at a time, or as a Server-Sent Events stream.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{self, KeepAlive, Sse};
use futures::{Stream, StreamExt as _};
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::Page;
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Query};
use crate::events::{self, Event};
use crate::iam::Principal;
use crate::{App, Error, Result};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .routes(routes!(list_events))
        .routes(routes!(stream_events))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Only events after this id (the `cursor` of the previous page).
    #[param(minimum = 0)]
    after: Option<i64>,
    /// 1-500, default 100.
    #[param(minimum = 1, maximum = 500)]
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
    let limit = q.limit.unwrap_or(100);
    let (items, more) = events::read(&app, &caller, q.after.unwrap_or(0), limit).await?;
    let cursor = more
        .then(|| items.last().map(|e| e.id.to_string()))
        .flatten();
    Ok(Json(Page { items, cursor }))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct StreamQuery {
    /// Start after this event id; a `Last-Event-ID` header takes precedence.
    after: Option<i64>,
}

/// The events the caller's org may see as Server-Sent Events: those after the resume
/// point, then each new one as it is written. Each message has the event id as `id`, its
/// type as `event` and the event as JSON `data`; a client that reconnects with
/// `Last-Event-ID` (or `?after=`) misses nothing, across server restarts too.
#[utoipa::path(get, path = "/v1/events/stream", tag = "events",
    params(StreamQuery, ("Last-Event-ID" = Option<i64>, Header, description = "The id of the last event received.")),
    responses((status = 200, content_type = "text/event-stream", body = Event, description = "One message per event"),
              (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn stream_events(
    State(app): State<Arc<App>>,
    caller: Principal,
    headers: HeaderMap,
    Query(q): Query<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<sse::Event, axum::Error>>>> {
    let after = match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<i64>().ok())
            .ok_or_else(|| Error::invalid("Last-Event-ID", "must be an event id"))?,
        None => q.after.unwrap_or(0),
    };
    let stream = events::follow(app, &caller, after).await?.map(|event| {
        let event = event.map_err(|err| {
            tracing::error!(error = %err, "event stream failed");
            axum::Error::new(err)
        })?;
        sse::Event::default()
            .id(event.id.to_string())
            .event(&event.kind)
            .json_data(&event)
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
