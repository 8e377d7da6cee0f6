//! The plugin registry: components uploaded by operators, stored by content hash in the
//! database (so every replica can load them), validated against the worlds before they are
//! accepted; and the built-in policies shipped inside the binary, which are listed and read
//! like stored plugins but are never stored, uploaded or deleted.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::json;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row as _};

use super::{BuiltIn, PolicyVersion, World, content_id};
use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::{OPS_ORG, Permission, Principal};
use crate::validation;
use crate::{Error, Result};

/// Largest component accepted (an interpreted-language component is tens of MB).
pub const MAX_PLUGIN_BYTES: usize = 64 << 20;

/// A stored plugin.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Plugin {
    /// `sha256:<hex>` of the component.
    pub id: String,
    pub name: String,
    pub version: String,
    pub world: World,
    /// The version of the `orl:policy` package whose world it implements.
    pub policy_version: PolicyVersion,
    pub size: i64,
    /// When it was uploaded; absent for a built-in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Shipped inside the binary: the default of its world, which decides wherever a pool
    /// assigns no plugin of that world. Never stored, uploaded or deleted.
    pub built_in: bool,
    /// Pools whose policies name it, among those the caller sees (all of them for
    /// platform operators). A built-in is never named: pools run it by assigning none.
    pub assigned_to: Vec<String>,
}

/// The name of the built-in policy `id`, if it is one.
pub fn built_in_name(app: &App, id: &str) -> Option<&'static str> {
    app.policy.built_in(id).map(|b| b.name)
}

/// A built-in policy as a plugin.
fn as_plugin(built_in: &BuiltIn) -> Plugin {
    Plugin {
        id: built_in.loaded.id.clone(),
        name: built_in.name.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        world: built_in.loaded.world,
        policy_version: built_in.loaded.version,
        size: built_in.size as i64,
        created_at: None,
        built_in: true,
        assigned_to: Vec::new(),
    }
}

/// The built-in plugin `id`, if it is one.
fn built_in(app: &App, id: &str) -> Option<Plugin> {
    app.policy.built_in(id).map(as_plugin)
}

/// The built-in plugin of `world`: what a pool that assigns none of it runs.
pub fn built_in_for(app: &App, world: World) -> Result<Plugin> {
    app.policy
        .built_in_of(world)
        .map(as_plugin)
        .ok_or_else(|| anyhow::anyhow!("no built-in {} policy", world.as_str()).into())
}

fn may_read(caller: &Principal) -> bool {
    caller.has(Permission::PluginsManage) || caller.has(Permission::PoolsManage)
}

/// Validates and stores a component (platform operators). Uploading the same bytes again
/// under the same name and version returns the stored plugin (`created` is then false);
/// under another name or version it is a `CONFLICT` naming the stored plugin, since one
/// component is one plugin.
pub async fn upload(
    app: &App,
    caller: &Principal,
    name: &str,
    version: &str,
    bytes: Vec<u8>,
) -> Result<(Plugin, bool)> {
    caller.require_ops(Permission::PluginsManage, "route")?;
    validation::id("name", name)?;
    validation::text("version", version, 64)?;
    if version.trim().is_empty() {
        return Err(Error::invalid("version", "must not be empty"));
    }
    if bytes.is_empty() {
        return Err(Error::invalid(
            "body",
            "send the component's bytes as the request body",
        ));
    }
    let id = content_id(&bytes);
    if let Some(built_in) = built_in(app, &id) {
        return Err(already_there(&built_in));
    }
    if let Some(existing) = find(&mut *app.store.pool().acquire().await?, &id).await? {
        return same_plugin(existing, name, version).map(|p| (p, false));
    }
    let host = app.policy.clone();
    let checked =
        tokio::task::spawn_blocking(move || host.load(&bytes).map(|loaded| (loaded, bytes)))
            .await
            .map_err(|e| anyhow::anyhow!("compiling the component: {e}"))?;
    let (loaded, bytes) = checked.map_err(|failure| Error::invalid("body", failure.message))?;
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    if let Some(existing) = find(&mut tx, &loaded.id).await? {
        app.policy
            .set_name(&existing.id, &existing.name, &existing.version);
        return same_plugin(existing, name, version).map(|p| (p, false));
    }
    // A concurrent upload of the same bytes may have stored them since: then it is theirs.
    let inserted = sqlx::query(
        "INSERT INTO plugins (id, name, version, world, policy_version, size, bytes, created_by, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING",
    )
    .bind(&loaded.id)
    .bind(name)
    .bind(version)
    .bind(loaded.world.as_str())
    .bind(loaded.version.as_str())
    .bind(bytes.len() as i64)
    .bind(bytes)
    .bind(&caller.key_id)
    .bind(now)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if inserted == 0 {
        tx.rollback().await?;
        let mut conn = app.store.pool().acquire().await?;
        let existing = find(&mut conn, &loaded.id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("plugin vanished"))?;
        app.policy
            .set_name(&existing.id, &existing.name, &existing.version);
        return same_plugin(existing, name, version).map(|p| (p, false));
    }
    let entry = Entry {
        org_id: OPS_ORG,
        action: "plugin.upload",
        object_type: "plugin",
        object_id: &loaded.id,
        reason: None,
        details: Some(json!({ "name": name, "version": version, "world": loaded.world })),
    };
    audit::record(&mut tx, caller, entry, now).await?;
    let plugin = find(&mut tx, &loaded.id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("plugin vanished"))?;
    tx.commit().await?;
    app.policy.set_name(&plugin.id, name, version);
    Ok((plugin, true))
}

/// The stored plugin `existing` when an upload of its bytes names it as it is stored; a
/// `CONFLICT` naming it otherwise.
fn same_plugin(existing: Plugin, name: &str, version: &str) -> Result<Plugin> {
    if existing.name == name && existing.version == version {
        return Ok(existing);
    }
    Err(already_there(&existing))
}

/// The `CONFLICT` of an upload whose bytes are `existing` already: one component is one
/// plugin, and a built-in is one already.
fn already_there(existing: &Plugin) -> Error {
    let there = if existing.built_in {
        "built into orl as plugin"
    } else {
        "already stored as plugin"
    };
    Error::conflict(
        format!(
            "these bytes are {there} {} ({} {}); one component is one plugin",
            existing.id, existing.name, existing.version
        ),
        Some(json!({
            "pluginId": existing.id, "name": existing.name, "version": existing.version,
            "builtIn": existing.built_in,
        })),
    )
}

const COLUMNS: &str = "id, name, version, world, policy_version, size, created_at";

async fn from_row(conn: &mut AnyConnection, r: &AnyRow) -> Result<Plugin> {
    let id: String = r.get("id");
    let world: String = r.get("world");
    let policy_version: String = r.get("policy_version");
    let assigned_to = sqlx::query_scalar(
        "SELECT pool_id FROM pool_policies WHERE placement = $1 OR preemption = $1 OR spend_limit = $1 ORDER BY pool_id",
    )
    .bind(&id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Plugin {
        world: World::parse(&world).ok_or_else(|| anyhow::anyhow!("stored world {world:?}"))?,
        policy_version: PolicyVersion::parse(&policy_version)
            .ok_or_else(|| anyhow::anyhow!("stored policy version {policy_version:?}"))?,
        id,
        name: r.get("name"),
        version: r.get("version"),
        size: r.get("size"),
        created_at: Some(format_ms(r.get("created_at"))),
        built_in: false,
        assigned_to,
    })
}

/// The plugin with `id`, whoever asks.
pub async fn find(conn: &mut AnyConnection, id: &str) -> Result<Option<Plugin>> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM plugins WHERE id = $1"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    match row {
        Some(row) => Ok(Some(from_row(conn, &row).await?)),
        None => Ok(None),
    }
}

/// The name, version and component bytes of a stored plugin.
pub async fn stored(
    conn: &mut AnyConnection,
    id: &str,
) -> Result<Option<(String, String, Vec<u8>)>> {
    let row = sqlx::query("SELECT name, version, bytes FROM plugins WHERE id = $1")
        .bind(id)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(|r| (r.get("name"), r.get("version"), r.get("bytes"))))
}

/// The pools the caller sees (those its org owns or is offered), or `None` for platform
/// operators, who see every pool.
async fn visible_pools(
    conn: &mut AnyConnection,
    caller: &Principal,
) -> Result<Option<HashSet<String>>> {
    if caller.is_ops() {
        return Ok(None);
    }
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM pools WHERE owner_org_id = $1
         OR id IN (SELECT pool_id FROM offers WHERE tenant_id = $1)",
    )
    .bind(&caller.org_id)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Some(ids.into_iter().collect()))
}

/// `plugin` as the caller may see it: `assignedTo` names only the pools it sees.
fn as_seen(mut plugin: Plugin, visible: Option<&HashSet<String>>) -> Plugin {
    if let Some(visible) = visible {
        plugin.assigned_to.retain(|pool| visible.contains(pool));
    }
    plugin
}

/// The built-in and stored plugins by id, at most `limit` of those after the plugin
/// `after` (REST's `GET /v1/plugins` and GraphQL's `plugins` page with it), each naming the pools it is assigned to that the caller sees. Stored plugins
/// are read a page at a time; the few built-ins are merged into it.
pub async fn list(
    app: &App,
    caller: &Principal,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<Plugin>> {
    if !may_read(caller) {
        return Err(Error::NotFound("plugins not found".into()));
    }
    let after = after.unwrap_or("");
    let mut conn = app.store.pool().acquire().await?;
    let visible = visible_pools(&mut conn, caller).await?;
    // Read as many more as there are built-ins: a component stored before it became a
    // built-in is listed once, as the built-in.
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM plugins WHERE id > $1 ORDER BY id LIMIT $2"
    ))
    .bind(after)
    .bind(
        limit
            .saturating_add(app.policy.built_ins().len())
            .min(i64::MAX as usize) as i64,
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut plugins: Vec<Plugin> = (app.policy.built_ins().iter())
        .filter(|b| b.loaded.id.as_str() > after)
        .map(as_plugin)
        .collect();
    for row in &rows {
        if built_in_name(app, &row.get::<String, _>("id")).is_none() {
            plugins.push(as_seen(from_row(&mut conn, row).await?, visible.as_ref()));
        }
    }
    plugins.sort_by(|a, b| a.id.cmp(&b.id));
    plugins.truncate(limit);
    Ok(plugins)
}

/// One plugin, built-in or stored, naming the pools it is assigned to that the caller sees.
pub async fn get(app: &App, caller: &Principal, id: &str) -> Result<Plugin> {
    if let Some(built_in) = built_in(app, id).filter(|_| may_read(caller)) {
        return Ok(built_in);
    }
    let mut conn = app.store.pool().acquire().await?;
    match find(&mut conn, id).await? {
        Some(plugin) if may_read(caller) => {
            let visible = visible_pools(&mut conn, caller).await?;
            Ok(as_seen(plugin, visible.as_ref()))
        }
        _ => Err(Error::not_found(format_args!("plugin {id}"))),
    }
}

/// Deletes a plugin; refused while any pool's policies name it, and always for a built-in.
pub async fn delete(app: &App, caller: &Principal, id: &str) -> Result<()> {
    caller.require_ops(Permission::PluginsManage, format_args!("plugin {id}"))?;
    if let Some(name) = built_in_name(app, id) {
        return Err(Error::conflict(
            format!("plugin {id} is the built-in {name}, shipped inside orl; it cannot be deleted"),
            Some(json!({ "pluginId": id, "name": name, "builtIn": true })),
        ));
    }
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let plugin = find(&mut tx, id)
        .await?
        .ok_or_else(|| Error::not_found(format_args!("plugin {id}")))?;
    if !plugin.assigned_to.is_empty() {
        return Err(Error::conflict(
            format!("plugin {id} is assigned to pools; assign another policy first"),
            Some(json!({ "pools": plugin.assigned_to })),
        ));
    }
    sqlx::query("DELETE FROM plugins WHERE id = $1")
        .bind(id)
        .execute(&mut **tx)
        .await?;
    let entry = Entry {
        org_id: OPS_ORG,
        action: "plugin.delete",
        object_type: "plugin",
        object_id: id,
        reason: None,
        details: None,
    };
    audit::record(&mut tx, caller, entry, now).await?;
    tx.commit().await?;
    app.policy.logs().forget(id);
    Ok(())
}
