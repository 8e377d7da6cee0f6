//! Subscriptions: the event outbox as it grows, filtered by the caller's visibility
//! exactly as `GET /v1/events` is.

use async_graphql::{Context, Result, Subscription};
use futures::{Stream, StreamExt as _};

use super::types::Event;
use super::{app, caller};
use crate::events;

pub struct Subscription;

#[Subscription]
impl Subscription {
    /// Changes to compute and node reservations: events after `after` (by default, only
    /// those written from now on), then each new one.
    async fn reservation_events(
        &self,
        ctx: &Context<'_>,
        after: Option<i64>,
    ) -> Result<impl Stream<Item = Result<Event>> + use<>> {
        follow(ctx, after, |kind| {
            kind.starts_with("reservation.") || kind.starts_with("node-reservation.")
        })
        .await
    }

    /// Inventory changes (nodes registered, updated, topology changed), as above.
    async fn inventory_events(
        &self,
        ctx: &Context<'_>,
        after: Option<i64>,
    ) -> Result<impl Stream<Item = Result<Event>> + use<>> {
        follow(ctx, after, |kind| kind.starts_with("inventory.")).await
    }
}

async fn follow(
    ctx: &Context<'_>,
    after: Option<i64>,
    wanted: fn(&str) -> bool,
) -> Result<impl Stream<Item = Result<Event>> + use<>> {
    let app = app(ctx).clone();
    let after = match after {
        Some(after) => after,
        None => events::head(app.store.pool()).await?,
    };
    let stream = events::follow(app, caller(ctx)?, after).await?;
    Ok(stream.filter_map(move |event| async move {
        match event {
            Ok(event) if wanted(&event.kind) => Some(Ok(Event::from(event))),
            Ok(_) => None,
            Err(err) => Some(Err(err.into())),
        }
    }))
}
