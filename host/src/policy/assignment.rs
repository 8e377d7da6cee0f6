//! Which plugins a pool runs, and with what deadline, config and failure behaviour. A
//! change is one row write: decisions already running keep the plugin they started with.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::{AnyConnection, Row as _};

use super::placer::WasmPlacer;
use super::{DEFAULT_DEADLINE_MS, Loaded, World, registry};
use crate::App;
use crate::audit::{self, Entry};
use crate::clock::format_ms;
use crate::iam::{Permission, Principal};
use crate::placer::Placer;
use crate::pools::store::Pool;
use crate::settings::Version;
use crate::store::to_json;
use crate::{Error, Result};

/// What a pool does when its plugin fails a decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OnPolicyFailure {
    /// The decision fails with `POLICY_FAILED`.
    #[default]
    Fail,
    /// The built-in default policy decides instead.
    Fallback,
}

/// `PUT /v1/pools/{poolId}/policies` body; also the answer. Absent plugins run the
/// built-in defaults.
#[derive(Clone, Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolPolicies {
    /// Plugin id (`sha256:…`) of a `placer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// Plugin id of a `preemptor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<String>,
    /// Plugin id of a `spend-guard`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend_limit: Option<String>,
    /// JSON the plugins read from `/config/config.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
    /// Time a decision may take, 1-10000 ms (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<i64>,
    #[serde(default)]
    pub on_policy_failure: OnPolicyFailure,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// In an answer: which plugin decides each policy now, the one assigned or the
    /// built-in. Ignored in a request, so an answer can be sent back as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective: Option<Effective>,
}

/// Per policy, the plugin that decides it in a pool.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Effective {
    pub placement: Decider,
    pub preemption: Decider,
    pub spend_limit: Decider,
}

/// The plugin that decides one policy: the one the pool assigns, or the built-in default
/// of its world when it assigns none. (With `onPolicyFailure: fallback` the built-in also
/// decides a decision the assigned plugin failed.)
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decider {
    /// `sha256:<hex>` of the component.
    pub plugin_id: String,
    pub name: String,
    pub world: World,
    pub built_in: bool,
}

impl Effective {
    /// The deciders with the name of the policy each decides (`placement`, `preemption`,
    /// `spend-limit`).
    pub fn by_kind(&self) -> [(&'static str, &Decider); 3] {
        [
            ("placement", &self.placement),
            ("preemption", &self.preemption),
            ("spend-limit", &self.spend_limit),
        ]
    }
}

/// The plugin that decides `world` where the pool assigns `assigned`.
async fn decider(
    app: &App,
    conn: &mut AnyConnection,
    world: World,
    assigned: Option<&str>,
) -> Result<Decider> {
    let plugin = match assigned {
        None => registry::built_in_for(app, world)?,
        Some(id) => registry::find(conn, id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("assigned plugin {id} is missing"))?,
    };
    Ok(Decider {
        plugin_id: plugin.id,
        name: plugin.name,
        world,
        built_in: plugin.built_in,
    })
}

/// `policies` with the plugin that decides each policy filled in.
async fn with_effective(
    app: &App,
    conn: &mut AnyConnection,
    mut policies: PoolPolicies,
) -> Result<PoolPolicies> {
    let effective = Effective {
        placement: decider(app, conn, World::Placer, policies.placement.as_deref()).await?,
        preemption: decider(app, conn, World::Preemptor, policies.preemption.as_deref()).await?,
        spend_limit: decider(
            app,
            conn,
            World::SpendGuard,
            policies.spend_limit.as_deref(),
        )
        .await?,
    };
    policies.effective = Some(effective);
    Ok(policies)
}

/// The pool's policies (defaults when none were assigned).
pub async fn find(conn: &mut AnyConnection, pool_id: &str) -> Result<PoolPolicies> {
    let row = sqlx::query(
        "SELECT placement, preemption, spend_limit, config, deadline_ms, on_policy_failure, updated_at
         FROM pool_policies WHERE pool_id = $1",
    )
    .bind(pool_id)
    .fetch_optional(conn)
    .await?;
    Ok(match row {
        None => PoolPolicies::default(),
        Some(r) => PoolPolicies {
            placement: r.get("placement"),
            preemption: r.get("preemption"),
            spend_limit: r.get("spend_limit"),
            config: r
                .get::<Option<String>, _>("config")
                .and_then(|c| serde_json::from_str(&c).ok()),
            deadline_ms: r.get("deadline_ms"),
            on_policy_failure: if r.get::<String, _>("on_policy_failure") == "fallback" {
                OnPolicyFailure::Fallback
            } else {
                OnPolicyFailure::Fail
            },
            updated_at: Some(format_ms(r.get("updated_at"))),
            effective: None,
        },
    })
}

async fn managed_pool(conn: &mut AnyConnection, caller: &Principal, pool_id: &str) -> Result<Pool> {
    match crate::pools::store::find(conn, pool_id).await? {
        Some(pool)
            if caller.has(Permission::PoolsManage) && caller.acts_for(&pool.owner_org_id) =>
        {
            Ok(pool)
        }
        _ => Err(Error::not_found(format_args!("pool {pool_id}"))),
    }
}

/// `PATCH /v1/pools/{poolId}/policies` body: only the fields it names change. A plugin,
/// `config` or `deadlineMs` given as `null` goes back to its default.
#[derive(Clone, Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PoolPoliciesPatch {
    /// Plugin id of a `placer`; `null` for the built-in default.
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<String>)]
    pub placement: Option<Option<String>>,
    /// Plugin id of a `preemptor`; `null` for the built-in default.
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<String>)]
    pub preemption: Option<Option<String>>,
    /// Plugin id of a `spend-guard`; `null` for the built-in default.
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<String>)]
    pub spend_limit: Option<Option<String>>,
    /// JSON the plugins read from `/config/config.json`; `null` for none.
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<Object>)]
    pub config: Option<Option<Value>>,
    /// Time a decision may take, 1-10000 ms; `null` for the default (50).
    #[serde(default, deserialize_with = "given")]
    #[schema(value_type = Option<i64>)]
    pub deadline_ms: Option<Option<i64>>,
    #[serde(default)]
    pub on_policy_failure: Option<OnPolicyFailure>,
}

/// A field that is present, `null` or not: `Some(None)` for `null`.
fn given<'de, T: Deserialize<'de>, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

impl PoolPoliciesPatch {
    /// `current` with the fields this patch names replaced.
    fn apply(self, mut current: PoolPolicies) -> PoolPolicies {
        fn set<T>(field: &mut Option<T>, value: Option<Option<T>>) {
            if let Some(value) = value {
                *field = value;
            }
        }
        set(&mut current.placement, self.placement);
        set(&mut current.preemption, self.preemption);
        set(&mut current.spend_limit, self.spend_limit);
        set(&mut current.config, self.config);
        set(&mut current.deadline_ms, self.deadline_ms);
        if let Some(on_failure) = self.on_policy_failure {
            current.on_policy_failure = on_failure;
        }
        current.updated_at = None;
        current.effective = None;
        current
    }
}

/// Assigns plugins to a pool, atomically: `body` replaces the whole assignment (what it
/// leaves out goes back to its default).
pub async fn put(
    app: &App,
    caller: &Principal,
    pool_id: &str,
    body: PoolPolicies,
) -> Result<PoolPolicies> {
    assign(app, caller, pool_id, "pool.assign-policies", |_| body).await
}

/// Changes only the fields `patch` names of a pool's assignment, atomically.
pub async fn patch(
    app: &App,
    caller: &Principal,
    pool_id: &str,
    patch: PoolPoliciesPatch,
) -> Result<PoolPolicies> {
    assign(app, caller, pool_id, "pool.patch-policies", |current| {
        patch.apply(current)
    })
    .await
}

/// Writes the assignment `change` makes of the pool's current one, in one transaction that
/// holds the pool's row, so two changes of one pool never lose each other's fields.
async fn assign(
    app: &App,
    caller: &Principal,
    pool_id: &str,
    action: &str,
    change: impl FnOnce(PoolPolicies) -> PoolPolicies,
) -> Result<PoolPolicies> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let pool = managed_pool(&mut tx, caller, pool_id).await?;
    sqlx::query(&format!(
        "SELECT id FROM pools WHERE id = $1{}",
        app.store.for_update()
    ))
    .bind(pool_id)
    .fetch_optional(&mut **tx)
    .await?;
    let body = PoolPolicies {
        effective: None,
        ..change(find(&mut tx, pool_id).await?)
    };
    if let Some(deadline) = body.deadline_ms {
        crate::validation::range("deadlineMs", deadline, 1, 10_000)?;
    }
    if body
        .config
        .as_ref()
        .is_some_and(|c| to_json(c).len() > 64 * 1024)
    {
        return Err(Error::invalid("config", "at most 64 KiB of JSON"));
    }
    for (field, id, world) in [
        ("placement", &body.placement, World::Placer),
        ("preemption", &body.preemption, World::Preemptor),
        ("spendLimit", &body.spend_limit, World::SpendGuard),
    ] {
        let Some(id) = id else { continue };
        if let Some(name) = registry::built_in_name(app, id) {
            return Err(Error::invalid(
                field,
                format!("plugin {id} is the built-in {name}; leave {field} out to run it"),
            ));
        }
        match registry::find(&mut tx, id).await? {
            None => return Err(Error::invalid(field, format!("unknown plugin {id}"))),
            Some(plugin) if plugin.world != world => {
                return Err(Error::invalid(
                    field,
                    format!(
                        "plugin {id} implements {}, not {}",
                        plugin.world.as_str(),
                        world.as_str()
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    sqlx::query("DELETE FROM pool_policies WHERE pool_id = $1")
        .bind(pool_id)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "INSERT INTO pool_policies (pool_id, placement, preemption, spend_limit, config, deadline_ms, on_policy_failure, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(pool_id)
    .bind(&body.placement)
    .bind(&body.preemption)
    .bind(&body.spend_limit)
    .bind(body.config.as_ref().map(to_json))
    .bind(body.deadline_ms)
    .bind(if body.on_policy_failure == OnPolicyFailure::Fallback { "fallback" } else { "fail" })
    .bind(now)
    .execute(&mut **tx)
    .await?;
    let entry = Entry {
        org_id: &pool.owner_org_id,
        action,
        object_type: "pool",
        object_id: pool_id,
        reason: None,
        details: Some(json!(body)),
    };
    audit::record(&mut tx, caller, entry, now).await?;
    let stored = find(&mut tx, pool_id).await?;
    let stored = with_effective(app, &mut tx, stored).await?;
    tx.commit().await?;
    Ok(stored)
}

/// The pool's policies with the plugin that decides each, for those who manage or see the
/// pool.
pub async fn get(app: &App, caller: &Principal, pool_id: &str) -> Result<PoolPolicies> {
    crate::pools::store::get(app, caller, pool_id).await?;
    let mut conn = app.store.pool().acquire().await?;
    let policies = find(&mut conn, pool_id).await?;
    with_effective(app, &mut conn, policies).await
}

/// A pool's plugin of one world, as resolved when a decision starts.
#[derive(Clone)]
pub struct Resolved {
    pub loaded: Arc<Loaded>,
    pub config: Option<Value>,
    pub deadline_ms: u64,
    /// On a plugin failure, decide with the built-in default instead of failing.
    pub fallback: bool,
}

/// The plugin of `world` a decision for `pool_id` runs: the pool's assigned plugin, or the
/// built-in default component, as of settings version `at` or later. Resolved once per
/// decision, so a swap never changes a decision already running.
pub async fn resolve(
    app: &App,
    conn: &mut AnyConnection,
    at: Version,
    pool_id: &str,
    world: World,
) -> Result<Resolved> {
    let load = resolve_now(app, &mut *conn, pool_id, world);
    app.settings.plugin(at, pool_id, world, load).await
}

async fn resolve_now(
    app: &App,
    conn: &mut AnyConnection,
    pool_id: &str,
    world: World,
) -> Result<Resolved> {
    let policies = find(conn, pool_id).await?;
    let assigned = match world {
        World::Placer => &policies.placement,
        World::Preemptor => &policies.preemption,
        World::SpendGuard => &policies.spend_limit,
    };
    let loaded = match assigned {
        None => app
            .policy
            .default_for(world)
            .ok_or_else(|| anyhow::anyhow!("no built-in {} policy", world.as_str()))?,
        // Compiled plugins are kept by id: a decision reads and hashes a plugin's bytes only
        // the first time this process runs it.
        Some(id) => match app.policy.cached(id) {
            Some(loaded) => loaded,
            None => {
                let (name, version, bytes) = registry::stored(conn, id)
                    .await?
                    .ok_or_else(|| anyhow::anyhow!("assigned plugin {id} is missing"))?;
                let host = app.policy.clone();
                let loaded = tokio::task::spawn_blocking(move || host.load(&bytes))
                    .await
                    .map_err(|e| anyhow::anyhow!("loading a plugin: {e}"))?
                    .map_err(Error::PolicyFailed)?;
                app.policy.set_name(&loaded.id, &name, &version);
                loaded
            }
        },
    };
    Ok(Resolved {
        loaded,
        config: policies.config,
        deadline_ms: policies
            .deadline_ms
            .map_or(DEFAULT_DEADLINE_MS, |d| d as u64),
        fallback: policies.on_policy_failure == OnPolicyFailure::Fallback,
    })
}

/// The placer a decision for `pool` runs.
pub async fn placer_for(
    app: &App,
    conn: &mut AnyConnection,
    at: Version,
    pool: &Pool,
) -> Result<Box<dyn Placer>> {
    let resolved = resolve(app, conn, at, &pool.id, World::Placer).await?;
    Ok(Box::new(WasmPlacer {
        host: app.policy.clone(),
        loaded: resolved.loaded,
        config: resolved.config,
        deadline_ms: resolved.deadline_ms,
        fallback: resolved.fallback,
        metrics: app.metrics.clone(),
    }))
}
