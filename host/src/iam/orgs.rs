//! Orgs: tenants, providers, or both. Created by platform admins.

use serde::{Deserialize, Serialize};
use sqlx::{AnyConnection, AnyPool, Row as _};

use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::{Permission, Principal};
use crate::store::is_unique_violation;
use crate::validation;
use crate::{Error, Result};

/// An organization.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Org {
    pub id: String,
    pub name: String,
    pub created_at: String,
}

/// `POST /v1/orgs` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewOrg {
    /// `^[A-Za-z0-9._:-]{1,128}$`
    pub id: String,
    /// At most 200 characters.
    pub name: String,
}

/// Creates an org (platform admins only).
pub async fn create(app: &App, caller: &Principal, new: NewOrg) -> Result<Org> {
    caller.require_ops(Permission::OrgsManage, "resource")?;
    validation::id("id", &new.id)?;
    validation::text("name", &new.name, 200)?;
    if new.name.trim().is_empty() {
        return Err(Error::invalid("name", "must not be empty"));
    }
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    if let Err(err) = insert(&mut tx, &new.id, &new.name, now).await {
        return Err(if is_unique_violation(&err) {
            Error::conflict(
                format!("org {} already exists", new.id),
                Some(serde_json::json!({ "orgId": new.id })),
            )
        } else {
            err.into()
        });
    }
    audit::record(
        &mut tx,
        caller,
        Entry {
            org_id: &new.id,
            action: "org.create",
            object_type: "org",
            object_id: &new.id,
            reason: None,
            details: Some(serde_json::json!({ "name": new.name })),
        },
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(Org {
        id: new.id,
        name: new.name,
        created_at: format_ms(now),
    })
}

/// Inserts an org row; fails with a unique violation when the id is taken.
pub async fn insert(conn: &mut AnyConnection, id: &str, name: &str, now: i64) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO orgs (id, name, created_at) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(name)
        .bind(now)
        .execute(conn)
        .await?;
    Ok(())
}

/// Reads an org the caller belongs to (or any, for ops).
pub async fn get(app: &App, caller: &Principal, org_id: &str) -> Result<Org> {
    if !caller.acts_for(org_id) {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    find(app.store.pool(), org_id)
        .await?
        .ok_or_else(|| Error::not_found(format_args!("org {org_id}")))
}

/// Checks that `caller` holds `permission` for `org_id` and that the org exists: `NOT_FOUND`
/// either way, so a caller without the permission cannot tell.
pub async fn require(
    app: &App,
    caller: &Principal,
    permission: crate::iam::Permission,
    org_id: &str,
) -> Result<()> {
    caller.require_for(permission, org_id, format_args!("org {org_id}"))?;
    match find(app.store.pool(), org_id).await? {
        Some(_) => Ok(()),
        None => Err(Error::not_found(format_args!("org {org_id}"))),
    }
}

/// The org with `id`, if any.
pub async fn find(pool: &AnyPool, id: &str) -> Result<Option<Org>> {
    let row = sqlx::query("SELECT id, name, created_at FROM orgs WHERE id = $1")
        .bind(id)
        .fetch_optional(pool)
        .await?;
    Ok(row.map(|r| Org {
        id: r.get("id"),
        name: r.get("name"),
        created_at: format_ms(r.get("created_at")),
    }))
}
