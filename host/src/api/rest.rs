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
mod status;

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
        .merge(status::router())
        .merge(crate::api::rpc::router())
}

/// `limit` and `cursor` of a list whose cursor is the id of the last item of a page.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// 1-200, default 50.
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// The `cursor` of the previous page.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,128}$", max_length = 128)]
    cursor: Option<String>,
}

impl PageQuery {
    /// The page's length and the id it starts after, checked.
    pub fn checked(&self) -> crate::Result<(usize, Option<&str>)> {
        let limit = self.limit.unwrap_or(50);
        crate::validation::range("limit", limit, 1, 200)?;
        if let Some(cursor) = &self.cursor {
            crate::validation::id("cursor", cursor)?;
        }
        Ok((limit as usize, self.cursor.as_deref()))
    }
}

/// Cuts a list fetched with `limit + 1` rows into a page and the cursor of the next one.
pub fn page<T>(mut items: Vec<T>, limit: i64, cursor_of: impl Fn(&T) -> String) -> Page<T> {
    let cursor = if crate::store::cut(&mut items, limit as usize) {
        items.last().map(cursor_of)
    } else {
        None
    };
    Page { items, cursor }
}
