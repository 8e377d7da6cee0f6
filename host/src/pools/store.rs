//! Creating, changing and reading pools and offers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::{PoolPolicy, Quota, validate_quota};
use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::{Permission, Principal};
use crate::ids::new_id;
use crate::store::{is_unique_violation, placeholders, to_json};
use crate::validation;
use crate::{Error, Result};

/// A set of nodes offered together.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    pub id: String,
    pub name: String,
    pub owner_org_id: String,
    pub node_ids: Vec<String>,
    pub policy: PoolPolicy,
    pub archived: bool,
    pub created_at: String,
    pub updated_at: String,
}

/// `POST /v1/pools` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewPool {
    pub name: String,
    pub owner_org_id: String,
    #[serde(default)]
    pub node_ids: Vec<String>,
    #[serde(default)]
    pub policy: PoolPolicy,
}

/// `PUT /v1/pools/{poolId}/nodes` body.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolNodes {
    pub node_ids: Vec<String>,
}

/// A pool made available to a tenant.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Offer {
    pub pool_id: String,
    pub tenant_id: String,
    /// Resource → limit. A missing row grants 0.
    pub quota: Quota,
    /// Resource → what the tenant's live reservations hold now.
    pub used: BTreeMap<String, i64>,
    /// Integer minor currency units (e.g. cents) per GPU-hour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price_per_gpu_hour: Option<i64>,
    /// Integer minor currency units the tenant may spend in this pool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<i64>,
    pub created_at: String,
    pub updated_at: String,
}

/// `POST /v1/pools/{poolId}/offers` body: creates the tenant's offer or replaces it.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NewOffer {
    pub tenant_id: String,
    pub quota: Quota,
    /// Integer minor currency units per GPU-hour.
    pub price_per_gpu_hour: Option<i64>,
    /// Integer minor currency units.
    pub budget: Option<i64>,
}

fn validate_node_ids(node_ids: &[String]) -> Result<()> {
    if node_ids.len() > 20_000 {
        return Err(Error::invalid("nodeIds", "at most 20000 nodes"));
    }
    for (i, id) in node_ids.iter().enumerate() {
        validation::id(&format!("nodeIds[{i}]"), id)?;
    }
    Ok(())
}

/// Checks every node exists and, unless a platform operator asks, belongs to `owner`.
async fn check_nodes(
    conn: &mut AnyConnection,
    caller: &Principal,
    owner: &str,
    node_ids: &[String],
) -> Result<()> {
    if node_ids.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "SELECT id, org_id FROM nodes WHERE id IN ({})",
        placeholders(1, node_ids.len())
    );
    let mut query = sqlx::query(&sql);
    for id in node_ids {
        query = query.bind(id);
    }
    let rows = query.fetch_all(conn).await?;
    let found: BTreeMap<String, String> = rows
        .iter()
        .map(|r| (r.get("id"), r.get("org_id")))
        .collect();
    for (i, id) in node_ids.iter().enumerate() {
        match found.get(id) {
            None => {
                return Err(Error::invalid(
                    format!("nodeIds[{i}]"),
                    format!("unknown node {id}"),
                ));
            }
            Some(org) if org != owner && !caller.is_ops() => {
                return Err(Error::invalid(
                    format!("nodeIds[{i}]"),
                    format!("unknown node {id}"),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

async fn replace_nodes(conn: &mut AnyConnection, pool_id: &str, node_ids: &[String]) -> Result<()> {
    sqlx::query("DELETE FROM pool_nodes WHERE pool_id = $1")
        .bind(pool_id)
        .execute(&mut *conn)
        .await?;
    let mut seen = Vec::new();
    for id in node_ids {
        if !seen.contains(&id) {
            sqlx::query("INSERT INTO pool_nodes (pool_id, node_id) VALUES ($1, $2)")
                .bind(pool_id)
                .bind(id)
                .execute(&mut *conn)
                .await?;
            seen.push(id);
        }
    }
    Ok(())
}

/// Creates a pool owned by `ownerOrgId`, of its nodes (any nodes, for platform operators).
pub async fn create(app: &App, caller: &Principal, new: NewPool) -> Result<Pool> {
    caller.require_for(
        Permission::PoolsManage,
        &new.owner_org_id,
        format_args!("org {}", new.owner_org_id),
    )?;
    validation::text("name", &new.name, 200)?;
    if new.name.trim().is_empty() {
        return Err(Error::invalid("name", "must not be empty"));
    }
    validation::id("ownerOrgId", &new.owner_org_id)?;
    validate_node_ids(&new.node_ids)?;
    new.policy.validate()?;
    let now = app.now_ms();
    let id = new_id("pool", now);
    let mut tx = app.store.begin().await?;
    if crate::iam::orgs::find(app.store.pool(), &new.owner_org_id)
        .await?
        .is_none()
    {
        return Err(Error::not_found(format_args!("org {}", new.owner_org_id)));
    }
    check_nodes(&mut tx, caller, &new.owner_org_id, &new.node_ids).await?;
    sqlx::query(
        "INSERT INTO pools (id, name, owner_org_id, policy, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5)",
    )
    .bind(&id)
    .bind(&new.name)
    .bind(&new.owner_org_id)
    .bind(to_json(&new.policy))
    .bind(now)
    .execute(&mut **tx)
    .await?;
    replace_nodes(&mut tx, &id, &new.node_ids).await?;
    let details = json!({ "name": new.name, "nodeIds": new.node_ids, "policy": new.policy });
    audit_pool(
        &mut tx,
        caller,
        &new.owner_org_id,
        "pool.create",
        &id,
        details,
        now,
    )
    .await?;
    let pool = find(&mut tx, &id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("pool {id} vanished"))?;
    tx.commit().await?;
    Ok(pool)
}

async fn audit_pool(
    conn: &mut AnyConnection,
    caller: &Principal,
    org: &str,
    action: &str,
    id: &str,
    details: serde_json::Value,
    now: i64,
) -> Result<()> {
    let entry = Entry {
        org_id: org,
        action,
        object_type: "pool",
        object_id: id,
        reason: None,
        details: Some(details),
    };
    audit::record(conn, caller, entry, now).await
}

/// A pool the caller may manage (its owner's `pools.manage`, or a platform operator's).
async fn managed(conn: &mut AnyConnection, caller: &Principal, pool_id: &str) -> Result<Pool> {
    match find(conn, pool_id).await? {
        Some(pool)
            if caller.has(Permission::PoolsManage) && caller.acts_for(&pool.owner_org_id) =>
        {
            Ok(pool)
        }
        _ => Err(Error::not_found(format_args!("pool {pool_id}"))),
    }
}

/// Replaces the pool's nodes.
pub async fn set_nodes(
    app: &App,
    caller: &Principal,
    pool_id: &str,
    body: PoolNodes,
) -> Result<Pool> {
    validate_node_ids(&body.node_ids)?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let pool = managed(&mut tx, caller, pool_id).await?;
    check_nodes(&mut tx, caller, &pool.owner_org_id, &body.node_ids).await?;
    replace_nodes(&mut tx, pool_id, &body.node_ids).await?;
    sqlx::query("UPDATE pools SET updated_at = $1 WHERE id = $2")
        .bind(now)
        .bind(pool_id)
        .execute(&mut **tx)
        .await?;
    audit_pool(
        &mut tx,
        caller,
        &pool.owner_org_id,
        "pool.set-nodes",
        pool_id,
        json!({ "nodeIds": body.node_ids }),
        now,
    )
    .await?;
    let pool = find(&mut tx, pool_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("pool {pool_id} vanished"))?;
    tx.commit().await?;
    Ok(pool)
}

/// Archives a pool: no new reservations; existing ones run their course.
pub async fn archive(app: &App, caller: &Principal, pool_id: &str) -> Result<Pool> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let pool = managed(&mut tx, caller, pool_id).await?;
    if !pool.archived {
        sqlx::query("UPDATE pools SET archived_at = $1, updated_at = $1 WHERE id = $2")
            .bind(now)
            .bind(pool_id)
            .execute(&mut **tx)
            .await?;
        audit_pool(
            &mut tx,
            caller,
            &pool.owner_org_id,
            "pool.archive",
            pool_id,
            json!({}),
            now,
        )
        .await?;
    }
    let pool = find(&mut tx, pool_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("pool {pool_id} vanished"))?;
    tx.commit().await?;
    Ok(pool)
}

const POOL_COLUMNS: &str = "id, name, owner_org_id, policy, archived_at, created_at, updated_at";

fn pool_from_row(r: &AnyRow, node_ids: Vec<String>) -> Result<Pool> {
    let policy: String = r.get("policy");
    Ok(Pool {
        id: r.get("id"),
        name: r.get("name"),
        owner_org_id: r.get("owner_org_id"),
        node_ids,
        policy: serde_json::from_str(&policy)
            .map_err(|e| anyhow::anyhow!("stored pool policy: {e}"))?,
        archived: r.get::<Option<i64>, _>("archived_at").is_some(),
        created_at: format_ms(r.get("created_at")),
        updated_at: format_ms(r.get("updated_at")),
    })
}

/// The pool with `id` without its member list (`node_ids` is empty): for placements,
/// which read a pool's nodes from the capacity view ([`crate::capacity::View::pool`]).
pub async fn find_settings(conn: &mut AnyConnection, id: &str) -> Result<Option<Pool>> {
    let row = sqlx::query(&format!("SELECT {POOL_COLUMNS} FROM pools WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(|row| pool_from_row(&row, Vec::new())).transpose()
}

/// The pool with `id`, whoever asks.
pub async fn find(conn: &mut AnyConnection, id: &str) -> Result<Option<Pool>> {
    let Some(row) = sqlx::query(&format!("SELECT {POOL_COLUMNS} FROM pools WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let node_ids =
        sqlx::query_scalar("SELECT node_id FROM pool_nodes WHERE pool_id = $1 ORDER BY node_id")
            .bind(id)
            .fetch_all(&mut *conn)
            .await?;
    Ok(Some(pool_from_row(&row, node_ids)?))
}

/// Whether `org` sees `pool`: its owner, a tenant it is offered to, or the ops org.
pub async fn visible_to(conn: &mut AnyConnection, pool: &Pool, org: &str) -> Result<bool> {
    if org == pool.owner_org_id || org == crate::iam::OPS_ORG {
        return Ok(true);
    }
    Ok(find_terms(conn, &pool.id, org).await?.is_some())
}

/// One pool the caller sees.
pub async fn get(app: &App, caller: &Principal, pool_id: &str) -> Result<Pool> {
    let mut conn = app.store.pool().acquire().await?;
    match find(&mut conn, pool_id).await? {
        Some(pool) if visible_to(&mut conn, &pool, &caller.org_id).await? => Ok(pool),
        _ => Err(Error::not_found(format_args!("pool {pool_id}"))),
    }
}

/// The pools the caller sees (every pool for platform operators), by id, at most `limit`
/// of them after the pool `after`. Pool ids are time-ordered, so this is oldest first.
pub async fn list(
    app: &App,
    caller: &Principal,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<Pool>> {
    let mut conn = app.store.pool().acquire().await?;
    let ids: Vec<String> = if caller.is_ops() {
        sqlx::query_scalar("SELECT id FROM pools WHERE id > $1 ORDER BY id LIMIT $2")
            .bind(after.unwrap_or(""))
            .bind(limit as i64)
            .fetch_all(&mut *conn)
            .await?
    } else {
        sqlx::query_scalar(
            "SELECT id FROM pools WHERE (owner_org_id = $1
             OR id IN (SELECT pool_id FROM offers WHERE tenant_id = $1))
             AND id > $2 ORDER BY id LIMIT $3",
        )
        .bind(&caller.org_id)
        .bind(after.unwrap_or(""))
        .bind(limit as i64)
        .fetch_all(&mut *conn)
        .await?
    };
    let mut pools = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(pool) = find(&mut conn, &id).await? {
            pools.push(pool);
        }
    }
    Ok(pools)
}

/// Every pool the caller sees, by id: for summaries that cover all of them (the fleet
/// counts, GraphQL's `pools`), which read each pool anyway.
pub async fn every(app: &App, caller: &Principal) -> Result<Vec<Pool>> {
    list(app, caller, None, i64::MAX as usize).await
}

/// Creates or replaces the offer of a pool to a tenant (the pool's managers).
pub async fn put_offer(
    app: &App,
    caller: &Principal,
    pool_id: &str,
    new: NewOffer,
) -> Result<(Offer, bool)> {
    validation::id("tenantId", &new.tenant_id)?;
    validate_quota(&new.quota)?;
    if let Some(price) = new.price_per_gpu_hour {
        validation::range("pricePerGpuHour", price, 0, 1 << 40)?;
    }
    if let Some(budget) = new.budget {
        validation::range("budget", budget, 0, 1 << 50)?;
    }
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let pool = managed(&mut tx, caller, pool_id).await?;
    if crate::iam::orgs::find(app.store.pool(), &new.tenant_id)
        .await?
        .is_none()
    {
        return Err(Error::invalid(
            "tenantId",
            format!("unknown org {}", new.tenant_id),
        ));
    }
    let existed = find_terms(&mut tx, pool_id, &new.tenant_id)
        .await?
        .is_some();
    let result = if existed {
        sqlx::query(
            "UPDATE offers SET quota = $1, price_per_gpu_hour_minor = $2, budget_minor = $3, updated_at = $4
             WHERE pool_id = $5 AND tenant_id = $6",
        )
        .bind(to_json(&new.quota))
        .bind(new.price_per_gpu_hour)
        .bind(new.budget)
        .bind(now)
        .bind(pool_id)
        .bind(&new.tenant_id)
        .execute(&mut **tx)
        .await
    } else {
        sqlx::query(
            "INSERT INTO offers (pool_id, tenant_id, quota, price_per_gpu_hour_minor, budget_minor, created_at, updated_at)
             VALUES ($1, $2, $3, $4, $5, $6, $6)",
        )
        .bind(pool_id)
        .bind(&new.tenant_id)
        .bind(to_json(&new.quota))
        .bind(new.price_per_gpu_hour)
        .bind(new.budget)
        .bind(now)
        .execute(&mut **tx)
        .await
    };
    if let Err(err) = result {
        return Err(if is_unique_violation(&err) {
            Error::conflict("the offer was created concurrently; retry", None)
        } else {
            err.into()
        });
    }
    let details = json!({ "tenantId": new.tenant_id, "quota": new.quota, "pricePerGpuHour": new.price_per_gpu_hour, "budget": new.budget });
    let action = if existed {
        "offer.update"
    } else {
        "offer.create"
    };
    audit_pool(
        &mut tx,
        caller,
        &pool.owner_org_id,
        action,
        pool_id,
        details,
        now,
    )
    .await?;
    let offer = find_offer(&mut tx, pool_id, &new.tenant_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("offer vanished"))?;
    tx.commit().await?;
    Ok((offer, !existed))
}

/// The pool's offers: all of them for its managers, the caller's own for a tenant; by
/// tenant id, at most `limit` of them after the tenant `after`.
pub async fn list_offers(
    app: &App,
    caller: &Principal,
    pool_id: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<Offer>> {
    let pool = get(app, caller, pool_id).await?;
    let mut conn = app.store.pool().acquire().await?;
    // A tenant that does not manage the pool sees its own offer only.
    let only = (!caller.acts_for(&pool.owner_org_id)).then_some(caller.org_id.as_str());
    let tenants: Vec<String> = sqlx::query_scalar(
        "SELECT tenant_id FROM offers WHERE pool_id = $1 AND tenant_id > $2
         AND ($3 = '' OR tenant_id = $3) ORDER BY tenant_id LIMIT $4",
    )
    .bind(pool_id)
    .bind(after.unwrap_or(""))
    .bind(only.unwrap_or(""))
    .bind(limit as i64)
    .fetch_all(&mut *conn)
    .await?;
    let mut offers = Vec::with_capacity(tenants.len());
    for tenant in &tenants {
        if let Some(offer) = find_offer(&mut conn, pool_id, tenant).await? {
            offers.push(offer);
        }
    }
    Ok(offers)
}

/// Every offer of the pool the caller sees, by tenant id (GraphQL's pool `offers`).
pub async fn every_offer(app: &App, caller: &Principal, pool_id: &str) -> Result<Vec<Offer>> {
    list_offers(app, caller, pool_id, None, i64::MAX as usize).await
}

/// The offer of `pool_id` to `tenant_id`, with what the tenant uses of it now.
pub async fn find_offer(
    conn: &mut AnyConnection,
    pool_id: &str,
    tenant_id: &str,
) -> Result<Option<Offer>> {
    let Some(mut offer) = find_terms(conn, pool_id, tenant_id).await? else {
        return Ok(None);
    };
    offer.used = quota_used(conn, pool_id, tenant_id).await?;
    Ok(Some(offer))
}

/// The offer of `pool_id` to `tenant_id` as the pool's manager set it: its `used` is empty.
pub async fn find_terms(
    conn: &mut AnyConnection,
    pool_id: &str,
    tenant_id: &str,
) -> Result<Option<Offer>> {
    let Some(r) = sqlx::query(
        "SELECT pool_id, tenant_id, quota, price_per_gpu_hour_minor, budget_minor, created_at, updated_at
         FROM offers WHERE pool_id = $1 AND tenant_id = $2",
    )
    .bind(pool_id)
    .bind(tenant_id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let quota: String = r.get("quota");
    Ok(Some(Offer {
        pool_id: r.get("pool_id"),
        tenant_id: r.get("tenant_id"),
        quota: serde_json::from_str(&quota).map_err(|e| anyhow::anyhow!("stored quota: {e}"))?,
        used: BTreeMap::new(),
        price_per_gpu_hour: r.get("price_per_gpu_hour_minor"),
        budget: r.get("budget_minor"),
        created_at: format_ms(r.get("created_at")),
        updated_at: format_ms(r.get("updated_at")),
    }))
}

/// What a tenant holds of each quota resource in a pool.
pub async fn quota_used(
    conn: &mut AnyConnection,
    pool_id: &str,
    tenant_id: &str,
) -> Result<BTreeMap<String, i64>> {
    let rows = sqlx::query(
        "SELECT resource, used FROM quota_usage WHERE pool_id = $1 AND tenant_id = $2 AND used > 0",
    )
    .bind(pool_id)
    .bind(tenant_id)
    .fetch_all(conn)
    .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get("resource"), r.get("used")))
        .collect())
}
