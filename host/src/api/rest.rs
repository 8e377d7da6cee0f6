//! REST `/v1`: one submodule per resource, each contributing its documented routes.

mod agent;
mod audit;
mod earnings;
mod events;
mod iam;
mod node_reservations;
mod nodes;
mod orgs;
mod plugins;
mod pools;
mod spot;

use std::sync::Arc;

use utoipa_axum::router::OpenApiRouter;

use crate::App;

/// Pagination of every REST list: `cursor` in, `cursor` out while more remain.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new()
        .merge(orgs::router())
        .merge(nodes::router())
        .merge(agent::router())
        .merge(node_reservations::router())
        .merge(audit::router())
        .merge(pools::router())
        .merge(earnings::router())
        .merge(plugins::router())
        .merge(iam::router())
        .merge(events::router())
        .merge(spot::router())
        .merge(crate::api::rpc::router())
}

/// Cuts a list fetched with `limit + 1` rows into a page and the cursor of the next one.
pub fn page<T>(mut items: Vec<T>, limit: i64, cursor_of: impl Fn(&T) -> String) -> Page<T> {
    let more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    let cursor = if more {
        items.last().map(cursor_of)
    } else {
        None
    };
    Page { items, cursor }
}
