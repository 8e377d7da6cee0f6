//! API keys: `or_…` secrets (legacy `vl_…` still authenticate), stored only as digests.
//! A key belongs to one org and carries a role or an explicit permission list.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, AnyPool, Row as _};

use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::key_cache::Lookup;
use crate::iam::{Permission, Principal, Role, parse_permissions};
use crate::ids::{hash_secret, new_id, new_secret};
use crate::store::{flag, is_unique_violation, json_strings, to_json};
use crate::validation;
use crate::{Error, Result};

/// `POST /v1/orgs/{orgId}/api-keys` body. Give a `role` or `permissions`, not both; with
/// neither the key is a `member`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewKey {
    pub name: Option<String>,
    pub role: Option<Role>,
    pub permissions: Option<Vec<String>>,
    /// An automated caller acting for a person.
    #[serde(default)]
    pub agent: bool,
    /// Imports an existing legacy `vl_…` secret instead of generating one (platform admins).
    pub legacy_key: Option<String>,
}

/// A key as listed: never its secret.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKey {
    pub id: String,
    pub org_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub role: Option<Role>,
    /// The effective permissions (the role's, or the explicit list).
    pub permissions: Vec<String>,
    pub agent: bool,
    pub legacy: bool,
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// The answer to a create: the only time the secret is shown.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedKey {
    /// The secret. Shown once; store it now.
    pub key: String,
    #[serde(flatten)]
    pub api_key: ApiKey,
}

/// What a key may do, as decided at creation.
pub struct Grant {
    pub role: Option<Role>,
    pub permissions: BTreeSet<Permission>,
    pub agent: bool,
}

impl Grant {
    pub fn role(role: Role) -> Grant {
        Grant {
            role: Some(role),
            permissions: BTreeSet::new(),
            agent: false,
        }
    }

    fn effective(&self) -> BTreeSet<Permission> {
        self.role
            .map_or_else(|| self.permissions.clone(), Role::permissions)
    }
}

/// Creates a key for `org_id`. A caller cannot grant what it does not hold, and an agent
/// key can only create agent keys.
pub async fn create(
    app: &App,
    caller: &Principal,
    org_id: &str,
    new: NewKey,
) -> Result<CreatedKey> {
    caller.require_for(Permission::KeysManage, org_id, format_args!("org {org_id}"))?;
    validation::opt_text("name", new.name.as_deref(), 200)?;
    let grant = match (new.role, &new.permissions) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                "permissions",
                "give a role or permissions, not both",
            ));
        }
        (None, Some(names)) if names.is_empty() => {
            return Err(Error::invalid(
                "permissions",
                "must name at least one permission",
            ));
        }
        (None, Some(names)) => Grant {
            role: None,
            permissions: parse_permissions("permissions", names)?,
            agent: new.agent,
        },
        (role, None) => Grant {
            agent: new.agent,
            ..Grant::role(role.unwrap_or(Role::Member))
        },
    };
    let beyond: Vec<&str> = grant
        .effective()
        .difference(&caller.permissions)
        .map(|p| p.as_str())
        .collect();
    if !beyond.is_empty() {
        return Err(Error::invalid(
            "permissions",
            format!(
                "cannot grant permissions the calling key does not hold: {}",
                beyond.join(", ")
            ),
        ));
    }
    if caller.agent && !grant.agent {
        return Err(Error::invalid(
            "agent",
            "an agent key can only create agent keys",
        ));
    }
    let secret = match new.legacy_key {
        Some(legacy) => {
            if !caller.is_ops() {
                return Err(Error::invalid(
                    "legacyKey",
                    "only platform admins import legacy keys",
                ));
            }
            if !legacy.starts_with("vl_") || !(20..=200).contains(&legacy.len()) {
                return Err(Error::invalid(
                    "legacyKey",
                    "must be a vl_… key of 20-200 characters",
                ));
            }
            validation::text("legacyKey", &legacy, 200)?;
            legacy
        }
        None => new_secret(),
    };
    if crate::iam::orgs::find(app.store.pool(), org_id)
        .await?
        .is_none()
    {
        return Err(Error::not_found(format_args!("org {org_id}")));
    }
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let api_key = insert(
        &mut tx,
        org_id,
        new.name.as_deref(),
        &grant,
        &secret,
        Some(&caller.key_id),
        now,
    )
    .await
    .map_err(|err| {
        if is_unique_violation(&err) {
            Error::conflict("this secret is already registered", None)
        } else {
            err.into()
        }
    })?;
    audit::record(
        &mut tx,
        caller,
        Entry {
            org_id,
            action: "api-key.create",
            object_type: "api-key",
            object_id: &api_key.id,
            reason: None,
            details: Some(serde_json::json!({
                "role": api_key.role, "permissions": api_key.permissions, "agent": api_key.agent,
            })),
        },
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(CreatedKey {
        key: secret,
        api_key,
    })
}

/// Stores a key under the digest of `secret`.
pub async fn insert(
    conn: &mut AnyConnection,
    org_id: &str,
    name: Option<&str>,
    grant: &Grant,
    secret: &str,
    created_by: Option<&str>,
    now: i64,
) -> sqlx::Result<ApiKey> {
    let id = new_id("key", now);
    let explicit: Vec<&str> = grant.permissions.iter().map(|p| p.as_str()).collect();
    sqlx::query(
        "INSERT INTO api_keys (id, org_id, name, secret_hash, role, permissions, agent, legacy, created_by, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(&id)
    .bind(org_id)
    .bind(name)
    .bind(hash_secret(secret))
    .bind(grant.role.map(Role::as_str))
    .bind(to_json(&explicit))
    .bind(grant.agent)
    .bind(secret.starts_with("vl_"))
    .bind(created_by)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(ApiKey {
        id,
        org_id: org_id.to_string(),
        name: name.map(str::to_string),
        role: grant.role,
        permissions: grant
            .effective()
            .iter()
            .map(|p| p.as_str().to_string())
            .collect(),
        agent: grant.agent,
        legacy: secret.starts_with("vl_"),
        created_at: format_ms(now),
        revoked_at: None,
    })
}

const COLUMNS: &str = "id, org_id, name, role, permissions, agent, legacy, created_at, revoked_at";

fn from_row(r: &AnyRow) -> (ApiKey, BTreeSet<Permission>) {
    let role = r
        .get::<Option<String>, _>("role")
        .and_then(|s| Role::parse(&s));
    let permissions: BTreeSet<Permission> = match role {
        Some(role) => role.permissions(),
        None => json_strings(&r.get::<String, _>("permissions"))
            .iter()
            .filter_map(|p| p.parse().ok())
            .collect(),
    };
    let key = ApiKey {
        id: r.get("id"),
        org_id: r.get("org_id"),
        name: r.get("name"),
        role,
        permissions: permissions.iter().map(|p| p.as_str().to_string()).collect(),
        agent: flag(r, "agent"),
        legacy: flag(r, "legacy"),
        created_at: format_ms(r.get("created_at")),
        revoked_at: r.get::<Option<i64>, _>("revoked_at").map(format_ms),
    };
    (key, permissions)
}

/// The org's keys, revoked ones included, by id (key ids are time-ordered: oldest first),
/// at most `limit` of them after the key `after`.
pub async fn list(
    app: &App,
    caller: &Principal,
    org_id: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<ApiKey>> {
    crate::iam::orgs::require(app, caller, Permission::KeysManage, org_id).await?;
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM api_keys WHERE org_id = $1 AND id > $2 ORDER BY id LIMIT $3"
    ))
    .bind(org_id)
    .bind(after.unwrap_or(""))
    .bind(limit as i64)
    .fetch_all(app.store.pool())
    .await?;
    Ok(rows.iter().map(|r| from_row(r).0).collect())
}

/// Revokes a key; it stops authenticating at once. Revoking a revoked key changes nothing.
pub async fn revoke(app: &App, caller: &Principal, org_id: &str, key_id: &str) -> Result<()> {
    let what = format!("api key {key_id}");
    caller.require_for(Permission::KeysManage, org_id, &what)?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let revoked_at: Option<Option<i64>> =
        sqlx::query_scalar("SELECT revoked_at FROM api_keys WHERE id = $1 AND org_id = $2")
            .bind(key_id)
            .bind(org_id)
            .fetch_optional(&mut **tx)
            .await?;
    match revoked_at {
        None => return Err(Error::not_found(what)),
        Some(Some(_)) => return Ok(()),
        Some(None) => {}
    }
    sqlx::query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2")
        .bind(now)
        .bind(key_id)
        .execute(&mut **tx)
        .await?;
    let entry = Entry {
        org_id,
        action: "api-key.revoke",
        object_type: "api-key",
        object_id: key_id,
        reason: None,
        details: None,
    };
    audit::record(&mut tx, caller, entry, now).await?;
    // On PostgreSQL a trigger announces the revocation to every replica's key cache.
    tx.commit().await?;
    app.keys.forget(key_id);
    Ok(())
}

/// The principal a bearer secret stands for, if it is a live key: from this replica's
/// [`KeyCache`](key_cache::KeyCache), else read from the database (and kept).
pub async fn authenticate(app: &App, secret: &str) -> Result<Option<Principal>> {
    if !(secret.starts_with("or_") || secret.starts_with("vl_")) {
        return Ok(None);
    }
    let digest = hash_secret(secret);
    let generation = match app.keys.get(&digest) {
        Lookup::Known(principal) => return Ok(Some(principal)),
        Lookup::Unknown(generation) => generation,
    };
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM api_keys WHERE secret_hash = $1 AND revoked_at IS NULL"
    ))
    .bind(&digest)
    .fetch_optional(app.store.pool())
    .await?;
    let Some(row) = row else { return Ok(None) };
    let (key, permissions) = from_row(&row);
    let principal = Principal {
        key_id: key.id,
        org_id: key.org_id,
        permissions,
        agent: key.agent,
    };
    app.keys.keep(digest, principal.clone(), generation);
    Ok(Some(principal))
}

/// Whether the key with `key_id` still authenticates (it exists and is not revoked). A
/// long-lived stream asks this to end once its key is revoked.
pub async fn is_live(pool: &AnyPool, key_id: &str) -> Result<bool> {
    let live: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM api_keys WHERE id = $1 AND revoked_at IS NULL")
            .bind(key_id)
            .fetch_one(pool)
            .await?;
    Ok(live > 0)
}
