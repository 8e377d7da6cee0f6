//! The audit trail.

use std::sync::Arc;

use axum::extract::State;
use serde::Deserialize;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::{Page, page};
use crate::api::error::ErrorEnvelope;
use crate::api::extract::{Json, Query};
use crate::audit::{self, AuditEntry};
use crate::iam::{Permission, Principal};
use crate::{App, Error, Result, validation};

pub fn router() -> OpenApiRouter<Arc<App>> {
    OpenApiRouter::new().routes(routes!(list_audit))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// Only entries about this org's objects. Required unless the caller is a platform operator.
    #[param(pattern = r"^[A-Za-z0-9._:-]{1,128}$", max_length = 128)]
    org_id: Option<String>,
    /// 1-200, default 50.
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// The `cursor` of the previous page.
    #[param(pattern = r"^-?[0-9]{1,19}$")]
    cursor: Option<String>,
}

/// Audit entries, newest first: ops see every org's, an org admin its own org's.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, body = Page<AuditEntry>), (status = 400, body = ErrorEnvelope), (status = 404, body = ErrorEnvelope)))]
async fn list_audit(
    State(app): State<Arc<App>>,
    caller: Principal,
    Query(q): Query<AuditQuery>,
) -> Result<Json<Page<AuditEntry>>> {
    let limit = q.limit.unwrap_or(50);
    validation::range("limit", limit, 1, 200)?;
    let org_id = match q.org_id {
        Some(org) => {
            validation::id("orgId", &org)?;
            Some(org)
        }
        None if caller.is_ops() => None,
        None => Some(caller.org_id.clone()),
    };
    let scope = org_id.as_deref().unwrap_or(crate::iam::OPS_ORG);
    caller.require_for(
        Permission::AuditRead,
        scope,
        format_args!("audit trail of {scope}"),
    )?;
    let before = q
        .cursor
        .map(|c| {
            c.parse::<i64>()
                .map_err(|_| Error::invalid("cursor", "not a cursor from this API"))
        })
        .transpose()?;
    let items = audit::list(app.store.pool(), org_id.as_deref(), before, limit + 1).await?;
    Ok(Json(page(items, limit, |e| e.id.clone())))
}
