//! Where to reserve: nodes with enough units that nothing books and no node reservation
//! claims over a term, read from the capacity view (`GET /v1/nodes/availability`, platform
//! operators), so an admin finds the units before reserving them.

use serde::{Deserialize, Serialize};

use super::Term;
use super::queries::parse_instant;
use crate::iam::{Permission, Principal};
use crate::{App, Result, validation};

/// How many nodes one page may look at: a page that finds fewer than its limit within them
/// still carries a cursor, and the next page goes on from there.
const SCAN: usize = 5_000;
/// How many node ids one read of the node list takes.
const BATCH: i64 = 500;

/// `GET /v1/nodes/availability` query.
#[derive(Clone, Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct FreeQuery {
    /// How many units a node must have free (1-1024).
    #[param(minimum = 1, maximum = 1024)]
    pub unit_count: i64,
    /// RFC 3339; defaults to now.
    pub from: Option<String>,
    /// RFC 3339; without it, from `from` on, for good.
    pub to: Option<String>,
    /// Only units of this model.
    #[param(max_length = 128)]
    pub model: Option<String>,
    /// 1-200, default 50.
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// The `cursor` of the previous page.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,128}$", max_length = 128)]
    pub cursor: Option<String>,
}

/// A node with units free over the term.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FreeNode {
    pub node_id: String,
    pub org_id: String,
    /// The sellable units of the model asked for that no booking and no node reservation
    /// holds at any time in the term.
    pub free_unit_ids: Vec<String>,
}

/// A page of nodes with at least `unitCount` free units over the term, by node id, and the
/// cursor to go on from (set while nodes remain to look at).
pub async fn free_nodes(
    app: &App,
    caller: &Principal,
    query: &FreeQuery,
) -> Result<(Vec<FreeNode>, Option<String>)> {
    caller.require_ops(Permission::ReservationManage, "nodes")?;
    validation::range("unitCount", query.unit_count, 1, 1024)?;
    let limit = query.limit.unwrap_or(50);
    validation::range("limit", limit, 1, 200)?;
    if let Some(cursor) = &query.cursor {
        validation::id("cursor", cursor)?;
    }
    if let Some(model) = &query.model {
        validation::text("model", model, 128)?;
    }
    let now = app.now_ms();
    let starts_at = match &query.from {
        Some(from) => parse_instant("from", from)?,
        None => now,
    };
    let ends_at = query
        .to
        .as_deref()
        .map(|t| parse_instant("to", t))
        .transpose()?;
    if ends_at.is_some_and(|end| end <= starts_at) {
        return Err(crate::Error::invalid("to", "must be after from"));
    }
    let term = Term { starts_at, ends_at };
    let mut found = Vec::new();
    let mut after = query.cursor.clone();
    let mut scanned = 0;
    loop {
        let ids = node_ids(app, after.as_deref()).await?;
        if ids.is_empty() {
            return Ok((found, None));
        }
        for capacity in app.capacity.nodes(&ids).await? {
            scanned += 1;
            after = Some(capacity.node.id.clone());
            if capacity.is_lost() {
                continue;
            }
            let free = free_units(&capacity, &term, query.model.as_deref());
            if free.len() >= query.unit_count as usize {
                found.push(FreeNode {
                    node_id: capacity.node.id.clone(),
                    org_id: capacity.node.org_id.clone(),
                    free_unit_ids: free,
                });
                if found.len() == limit as usize {
                    return Ok((found, after));
                }
            }
            if scanned == SCAN {
                return Ok((found, after));
            }
        }
    }
}

/// The next [`BATCH`] node ids after `after`, in order.
async fn node_ids(app: &App, after: Option<&str>) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT id FROM nodes WHERE ($1 IS NULL OR id > $1) ORDER BY id LIMIT $2",
    )
    .bind(after)
    .bind(BATCH)
    .fetch_all(app.store.pool())
    .await?)
}

/// The sellable units of `model` (any without one) of a node that no booking and no node
/// reservation holds at any time in `term`.
fn free_units(
    capacity: &crate::capacity::NodeCapacity,
    term: &Term,
    model: Option<&str>,
) -> Vec<String> {
    let held = |unit: &str| {
        capacity.bookings.iter().any(|b| {
            b.unit_id == unit
                && Term {
                    starts_at: b.start_ms,
                    ends_at: Some(b.end_ms),
                }
                .overlaps(term)
        }) || (capacity.claims.iter())
            .any(|c| c.unit_ids.iter().any(|u| u == unit) && c.term.overlaps(term))
    };
    (capacity.node.units.iter())
        .filter(|u| u.sellable && model.is_none_or(|m| u.model == m) && !held(&u.id))
        .map(|u| u.id.clone())
        .collect()
}
