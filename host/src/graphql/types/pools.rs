//! Pools, their offers with quota used and remaining, their policies, and plugins with
//! their decision counts.

use std::collections::BTreeSet;

use async_graphql::connection::Connection;
use async_graphql::{ComplexObject, Context, Json, Result, SimpleObject};

use super::{api_name, json};
use crate::graphql::decisions::{self, DecisionCount, DecisionLatency, FailureCount};
use crate::graphql::{app, caller, limits, page};
use crate::policy::{assignment, registry};
use crate::pools::store;

/// A set of nodes offered together.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct Pool {
    pub id: String,
    pub name: String,
    pub owner_org_id: String,
    pub node_ids: Vec<String>,
    /// The pool's placement and sharing policy, as REST shows it.
    pub policy: Json<serde_json::Value>,
    pub archived: bool,
    pub created_at: String,
    pub updated_at: String,
}

impl From<store::Pool> for Pool {
    fn from(p: store::Pool) -> Self {
        Pool {
            policy: json(&p.policy),
            id: p.id,
            name: p.name,
            owner_org_id: p.owner_org_id,
            node_ids: p.node_ids,
            archived: p.archived,
            created_at: p.created_at,
            updated_at: p.updated_at,
        }
    }
}

#[ComplexObject]
impl Pool {
    /// Its offers by tenant id, a page at a time: all of them for its managers, the
    /// caller's own for a tenant.
    #[graphql(complexity = "limits::connection_cost(first, child_complexity)")]
    async fn offers(
        &self,
        ctx: &Context<'_>,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Offer>> {
        Offer::page(ctx, &self.id, first, after).await
    }

    /// The plugins it runs (absent: the built-in defaults).
    async fn policies(&self, ctx: &Context<'_>) -> Result<PoolPolicies> {
        Ok(assignment::get(app(ctx), caller(ctx)?, &self.id)
            .await?
            .into())
    }

    /// Who decides each policy here — the plugin assigned, or the built-in default — with
    /// its decisions on this server since it started (across every pool it serves).
    async fn deciders(&self, ctx: &Context<'_>) -> Result<Vec<Decider>> {
        let app = app(ctx);
        let policies = assignment::get(app, caller(ctx)?, &self.id).await?;
        let effective = policies
            .effective
            .ok_or_else(|| anyhow::anyhow!("policies without their deciders"))
            .map_err(crate::Error::from)?;
        let mut counts = decisions::by_plugin(&app.metrics);
        Ok(effective
            .by_kind()
            .into_iter()
            .map(|(kind, decider)| {
                let counted = counts.remove(&decider.plugin_id).unwrap_or_default();
                Decider {
                    kind: kind.to_string(),
                    world: decider.world.as_str().to_string(),
                    built_in: decider.built_in,
                    decision_count: counted.iter().map(|d| d.count).sum(),
                    failure_count: counted.iter().filter(|d| d.failed()).map(|d| d.count).sum(),
                    plugin_id: decider.plugin_id.clone(),
                }
            })
            .collect())
    }
}

/// The plugin that decides one kind of policy in a pool.
#[derive(SimpleObject)]
pub struct Decider {
    /// `placement`, `preemption` or `spend-limit`.
    pub kind: String,
    /// The plugin's world: `placer`, `preemptor` or `spend-guard`.
    pub world: String,
    /// `sha256:<hex>` of the component.
    pub plugin_id: String,
    /// The default shipped inside the binary (the pool assigns none).
    pub built_in: bool,
    /// Its decisions on this server since it started.
    pub decision_count: i64,
    /// How many of them failed (trap, deadline, memory cap, invalid answer).
    pub failure_count: i64,
}

/// A pool made available to a tenant.
#[derive(SimpleObject)]
pub struct Offer {
    pub pool_id: String,
    pub tenant_id: String,
    /// Per resource: the limit, what live reservations hold, and what remains.
    pub quota: Vec<QuotaLine>,
    /// Minor currency units per GPU-hour.
    pub price_per_gpu_hour: Option<i64>,
    /// Minor currency units the tenant may spend in this pool.
    pub budget: Option<i64>,
    pub created_at: String,
    pub updated_at: String,
}

/// One resource of an offer's quota.
#[derive(SimpleObject)]
pub struct QuotaLine {
    pub resource: String,
    /// A resource the quota does not name grants 0.
    pub limit: i64,
    pub used: i64,
    pub remaining: i64,
}

impl Offer {
    /// A page of `pool_id`'s offers the caller sees, by tenant id after the tenant `after`.
    pub async fn page(
        ctx: &Context<'_>,
        pool_id: &str,
        first: Option<i32>,
        after: Option<String>,
    ) -> Result<Connection<String, Offer>> {
        let first = page::by_id(first, after.as_deref())?;
        let offers =
            store::list_offers(app(ctx), caller(ctx)?, pool_id, after.as_deref(), first + 1)
                .await?;
        let offers = offers.into_iter().map(Offer::from).collect();
        Ok(page::of_read(
            offers,
            first,
            after.is_some(),
            |o: &Offer| o.tenant_id.clone(),
        ))
    }
}

impl From<store::Offer> for Offer {
    fn from(o: store::Offer) -> Self {
        let resources: BTreeSet<&String> = o.quota.keys().chain(o.used.keys()).collect();
        let quota = resources
            .into_iter()
            .map(|resource| {
                let limit = o.quota.get(resource).copied().unwrap_or(0);
                let used = o.used.get(resource).copied().unwrap_or(0);
                QuotaLine {
                    resource: resource.clone(),
                    limit,
                    used,
                    remaining: (limit - used).max(0),
                }
            })
            .collect();
        Offer {
            quota,
            pool_id: o.pool_id,
            tenant_id: o.tenant_id,
            price_per_gpu_hour: o.price_per_gpu_hour,
            budget: o.budget,
            created_at: o.created_at,
            updated_at: o.updated_at,
        }
    }
}

/// The plugins a pool runs, by plugin id.
#[derive(SimpleObject)]
pub struct PoolPolicies {
    pub placement: Option<String>,
    pub preemption: Option<String>,
    pub spend_limit: Option<String>,
    pub config: Option<Json<serde_json::Value>>,
    pub deadline_ms: Option<i64>,
    /// `fail` or `fallback`.
    pub on_policy_failure: String,
    pub updated_at: Option<String>,
}

impl From<assignment::PoolPolicies> for PoolPolicies {
    fn from(p: assignment::PoolPolicies) -> Self {
        PoolPolicies {
            on_policy_failure: api_name(&p.on_policy_failure),
            placement: p.placement,
            preemption: p.preemption,
            spend_limit: p.spend_limit,
            config: p.config.map(Json),
            deadline_ms: p.deadline_ms,
            updated_at: p.updated_at,
        }
    }
}

/// A stored policy plugin.
#[derive(SimpleObject)]
#[graphql(complex)]
pub struct Plugin {
    /// `sha256:<hex>` of the component.
    pub id: String,
    pub name: String,
    pub version: String,
    /// `placer`, `preemptor` or `spend-guard`.
    pub world: String,
    /// The version of the `orl:policy` package whose world it implements, e.g.
    /// `orl:policy@0.2.0`.
    pub policy_version: String,
    pub size: i64,
    /// When it was uploaded; null for a built-in.
    pub created_at: Option<String>,
    /// Shipped inside the binary: the default of its world, never stored or deleted.
    pub built_in: bool,
    /// Pools whose policies name it.
    pub assigned_to: Vec<String>,
}

impl From<registry::Plugin> for Plugin {
    fn from(p: registry::Plugin) -> Self {
        Plugin {
            world: p.world.as_str().to_string(),
            policy_version: p.policy_version.as_str().to_string(),
            id: p.id,
            name: p.name,
            version: p.version,
            size: p.size,
            created_at: p.created_at,
            built_in: p.built_in,
            assigned_to: p.assigned_to,
        }
    }
}

impl Plugin {
    fn counted(&self, ctx: &Context<'_>) -> Vec<DecisionCount> {
        decisions::of_plugin(&app(ctx).metrics, &self.id).decisions
    }
}

// Its figures on this server since it started, read from what `/metrics` exposes for it
// (`orl_policy_decisions_total`, `orl_policy_failures_total`,
// `orl_policy_decision_duration_seconds`, labelled with its id, name and version).
#[ComplexObject]
impl Plugin {
    /// Its decisions by world and outcome.
    async fn decisions(&self, ctx: &Context<'_>) -> Vec<DecisionCount> {
        self.counted(ctx)
    }

    /// Its failed calls by world and kind (`trap`, `deadline`, `memory`,
    /// `invalid-answer`).
    async fn failures(&self, ctx: &Context<'_>) -> Vec<FailureCount> {
        decisions::of_plugin(&app(ctx).metrics, &self.id).failures
    }

    /// How long its calls took, per world: count, sum, p50 and p99 (estimated from the
    /// buckets) and the buckets themselves. Empty before its first call.
    async fn latency(&self, ctx: &Context<'_>) -> Vec<DecisionLatency> {
        decisions::of_plugin(&app(ctx).metrics, &self.id).latency
    }

    /// How many decisions it made on this server since it started.
    async fn decision_count(&self, ctx: &Context<'_>) -> i64 {
        self.counted(ctx).iter().map(|d| d.count).sum()
    }

    /// How many of them failed (trap, deadline, memory cap, invalid answer).
    async fn failure_count(&self, ctx: &Context<'_>) -> i64 {
        self.counted(ctx)
            .iter()
            .filter(|d| d.failed())
            .map(|d| d.count)
            .sum()
    }
}
