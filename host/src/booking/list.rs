//! `list`: the tenant's reservations newest first, one page at a time.

use serde::{Deserialize, Serialize};

use super::engine::{READ, attributes};
use super::store::{self, ComputeReservation};
use super::{State, check_reservation_id, check_tenant_id};
use crate::iam::policy::{self, Decision};
use crate::iam::{Permission, Principal};
use crate::{App, Error, Result};

/// Input of `list`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListInput {
    pub tenant_id: String,
    #[serde(default)]
    pub scope: Option<Scope>,
    #[serde(default)]
    pub state: Option<State>,
    #[serde(default)]
    pub pool_id: Option<String>,
    #[serde(default)]
    pub limit: Option<i64>,
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Mine,
    All,
}

/// A page of reservations.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ReservationPage {
    pub items: Vec<ComputeReservation>,
    /// The id to pass as `cursor` for the next page, while more remain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// `list`: the tenant's reservations newest first, drafts skipped; `scope: all` checks each
/// one as `compute:reservations:read`.
pub async fn list(app: &App, caller: &Principal, input: ListInput) -> Result<ReservationPage> {
    check_tenant_id(&input.tenant_id)?;
    if let Some(pool) = &input.pool_id {
        super::check_pool_id(pool)?;
    }
    if let Some(cursor) = &input.cursor {
        check_reservation_id("cursor", cursor)?;
    }
    let limit = input.limit.unwrap_or(50);
    crate::validation::range("limit", limit, 1, 200)?;
    if !(caller.has(Permission::ComputeRead) && caller.acts_for(&input.tenant_id)) {
        return Err(Error::not_found(format_args!("tenant {}", input.tenant_id)));
    }
    let scope = input.scope.unwrap_or(Scope::Mine);
    let mut conn = app.store.pool().acquire().await?;
    let mine = (scope == Scope::Mine).then_some(caller.key_id.as_str());
    let policy_text = policy::find(&mut conn, &input.tenant_id).await?;
    let mut items = Vec::new();
    let mut cursor = input.cursor.clone();
    // Items the read decision refuses are skipped, so fetch until the page is full.
    loop {
        let batch = store::page(
            &mut conn,
            &input.tenant_id,
            input.state,
            input.pool_id.as_deref(),
            mine,
            cursor.as_deref(),
            limit + 1,
        )
        .await?;
        let exhausted = batch.len() as i64 <= limit;
        for r in batch.into_iter().take(limit as usize) {
            cursor = Some(r.id.clone());
            let allowed = scope == Scope::Mine || {
                let attrs = attributes(&r.request, &r, "");
                policy::decide(
                    policy_text.as_deref(),
                    caller,
                    READ,
                    (&r.id, &r.tenant_id),
                    &attrs,
                )? == Decision::Allow
            };
            if allowed {
                items.push(r.view());
                if items.len() as i64 == limit {
                    break;
                }
            }
        }
        if exhausted || items.len() as i64 == limit {
            let more = !exhausted
                || items.len() as i64 == limit && {
                    let next = store::page(
                        &mut conn,
                        &input.tenant_id,
                        input.state,
                        input.pool_id.as_deref(),
                        mine,
                        items.last().map(|i| i.id.as_str()),
                        1,
                    )
                    .await?;
                    !next.is_empty()
                };
            let cursor = if more {
                items.last().map(|i| i.id.clone())
            } else {
                None
            };
            return Ok(ReservationPage { items, cursor });
        }
    }
}
