//! GraphQL at `/graphql`, for dashboards: queries over inventory, reservations, pools,
//! provider earnings, plugins, events and the audit trail; mutations for the main
//! reservation actions; and subscriptions to the event outbox over WebSocket
//! (`graphql-transport-ws` or `graphql-ws`).
//!
//! It is another surface over the same domain functions REST calls, so the same key
//! authenticates the same [`Principal`] and the same visibility rules apply; a domain error
//! carries its REST code as `extensions.code`. Depth, complexity and page sizes are capped
//! ([`limits`]), so are size, nesting and fan-out before parsing and validation
//! ([`guard`]), and per-node data loads in batches ([`loaders`]).

pub(crate) mod decisions;
mod error;
mod guard;
mod http;
mod limits;
mod loaders;
mod mutation;
mod page;
mod query;
mod session;
mod subscription;
mod types;

use std::sync::Arc;

use async_graphql::{Context, Schema, SchemaBuilder};

pub use http::router;

use crate::iam::Principal;
use crate::{App, Error};

/// The schema every request runs against.
pub type OrlSchema = Schema<query::Query, mutation::Mutation, subscription::Subscription>;

fn builder() -> SchemaBuilder<query::Query, mutation::Mutation, subscription::Subscription> {
    Schema::build(query::Query, mutation::Mutation, subscription::Subscription)
        .limit_depth(limits::MAX_DEPTH)
        .limit_complexity(limits::MAX_COMPLEXITY)
        .extension(guard::Guard)
        .extension(session::Session)
}

/// The schema serving `app`.
pub fn schema(app: Arc<App>) -> OrlSchema {
    builder().data(app).finish()
}

/// The schema in the GraphQL schema definition language.
pub fn sdl() -> String {
    builder().finish().sdl()
}

/// The application the request runs in.
fn app<'a>(ctx: &Context<'a>) -> &'a Arc<App> {
    ctx.data_unchecked::<Arc<App>>()
}

/// The authenticated caller (every operation carries one; see [`http`]).
fn caller<'a>(ctx: &Context<'a>) -> async_graphql::Result<&'a Principal> {
    ctx.data::<Principal>().map_err(|_| {
        Error::Unauthenticated("missing Authorization: Bearer <API key>".into()).into()
    })
}
