//! `orl pools …`: pools of nodes and their offers to tenants.

use std::path::PathBuf;

use anyhow::bail;
use clap::Subcommand;
use serde_json::{Map, Value, json};

use super::plugins::{self, PoliciesCommand};
use super::{Client, Paging, Shown, read_json, render};

#[derive(Debug, Subcommand)]
pub enum PoolsCommand {
    /// Create a pool of an org's nodes with a policy (`pools.manage`).
    Create {
        #[arg(long)]
        name: String,
        /// The org that owns the pool (and, unless a platform operator asks, its nodes).
        #[arg(long)]
        owner: String,
        #[arg(long, value_delimiter = ',')]
        node_ids: Vec<String>,
        /// The policy document as JSON, e.g. '{"placer":"pool-lease","budgetCheck":true}'.
        #[arg(long, conflicts_with = "policy_file")]
        policy: Option<String>,
        /// The policy document from a JSON file (`-` for stdin).
        #[arg(long)]
        policy_file: Option<PathBuf>,
        /// Sets `placer` in the policy.
        #[arg(long, value_parser = ["default", "pool-lease"])]
        placer: Option<String>,
    },
    /// The pools the caller owns or is offered (every pool, for platform operators), by
    /// id, a page at a time.
    List {
        #[command(flatten)]
        page: Paging,
    },
    Get {
        /// The pool: its id (`pool_…`) or its name.
        pool_id: String,
    },
    /// Replace the pool's nodes.
    SetNodes {
        /// The pool: its id (`pool_…`) or its name.
        pool_id: String,
        #[arg(long, value_delimiter = ',', required = true)]
        node_ids: Vec<String>,
    },
    /// Archive a pool: it takes no new reservations; existing ones run their course.
    Archive {
        /// The pool: its id (`pool_…`) or its name.
        pool_id: String,
    },
    /// Offer the pool to a tenant, or replace the tenant's offer.
    Offer {
        /// The pool: its id (`pool_…`) or its name.
        pool_id: String,
        #[arg(long)]
        tenant: String,
        /// Resource limits, e.g. `gpu=8,vcpu=64,memoryGiB=512`. A resource not named grants 0.
        #[arg(long, value_delimiter = ',', value_parser = quota_row, required = true)]
        quota: Vec<(String, i64)>,
        /// Integer minor currency units (e.g. cents) per GPU-hour.
        #[arg(long)]
        price_per_gpu_hour: Option<i64>,
        /// Integer minor currency units the tenant may spend in the pool.
        #[arg(long)]
        budget: Option<i64>,
    },
    /// The pool's offers with what each tenant uses of its quota, by tenant, a page at a
    /// time.
    Offers {
        /// The pool: its id (`pool_…`) or its name.
        pool_id: String,
        #[command(flatten)]
        page: Paging,
    },
    /// The policy plugins a pool runs (placement, preemption, spend guard).
    #[command(subcommand)]
    Policies(PoliciesCommand),
}

impl PoolsCommand {
    /// The command with its pool, given by name, named by id.
    async fn with_pool_ids(mut self, client: &Client) -> anyhow::Result<PoolsCommand> {
        let pool_id = match &mut self {
            PoolsCommand::Get { pool_id }
            | PoolsCommand::SetNodes { pool_id, .. }
            | PoolsCommand::Archive { pool_id }
            | PoolsCommand::Offer { pool_id, .. }
            | PoolsCommand::Offers { pool_id, .. } => pool_id,
            PoolsCommand::Policies(command) => command.pool_id(),
            PoolsCommand::Create { .. } | PoolsCommand::List { .. } => return Ok(self),
        };
        *pool_id = client.pool_id(pool_id).await?;
        Ok(self)
    }
}

/// One `resource=limit` of `--quota`.
fn quota_row(text: &str) -> Result<(String, i64), String> {
    let (resource, limit) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not resource=limit, e.g. gpu=8"))?;
    let limit = limit
        .trim()
        .parse()
        .map_err(|_| format!("the limit of {resource} must be an integer"))?;
    Ok((resource.trim().to_string(), limit))
}

pub(super) async fn run(client: &Client, command: PoolsCommand) -> anyhow::Result<Shown> {
    let command = command.with_pool_ids(client).await?;
    Ok(match command {
        PoolsCommand::Create {
            name,
            owner,
            node_ids,
            policy,
            policy_file,
            placer,
        } => {
            let mut policy = match (policy, policy_file) {
                (Some(text), _) => {
                    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("--policy: {e}"))?
                }
                (None, Some(file)) => read_json(&file, "the policy file")?,
                (None, None) => Value::Object(Map::new()),
            };
            let Some(fields) = policy.as_object_mut() else {
                bail!("the policy must be a JSON object");
            };
            if let Some(placer) = placer {
                fields.insert("placer".into(), Value::String(placer));
            }
            let body =
                json!({ "name": name, "ownerOrgId": owner, "nodeIds": node_ids, "policy": policy });
            (client.post("/v1/pools", &body).await?, render::pool)
        }
        PoolsCommand::List { page } => (
            client.get(&page.on("/v1/pools".to_string())).await?,
            render::pools,
        ),
        PoolsCommand::Get { pool_id } => (
            client.get(&format!("/v1/pools/{pool_id}")).await?,
            render::pool,
        ),
        PoolsCommand::SetNodes { pool_id, node_ids } => (
            client
                .put(
                    &format!("/v1/pools/{pool_id}/nodes"),
                    &json!({ "nodeIds": node_ids }),
                )
                .await?,
            render::pool,
        ),
        PoolsCommand::Archive { pool_id } => (
            client
                .post(&format!("/v1/pools/{pool_id}/archive"), &json!({}))
                .await?,
            render::pool,
        ),
        PoolsCommand::Offer {
            pool_id,
            tenant,
            quota,
            price_per_gpu_hour,
            budget,
        } => {
            let quota: Map<String, Value> = quota
                .into_iter()
                .map(|(resource, limit)| (resource, limit.into()))
                .collect();
            let body = render::without_nulls(json!({
                "tenantId": tenant, "quota": quota,
                "pricePerGpuHour": price_per_gpu_hour, "budget": budget,
            }));
            (
                client
                    .post(&format!("/v1/pools/{pool_id}/offers"), &body)
                    .await?,
                render::offer,
            )
        }
        PoolsCommand::Offers { pool_id, page } => (
            client
                .get(&page.on(format!("/v1/pools/{pool_id}/offers")))
                .await?,
            render::offers,
        ),
        PoolsCommand::Policies(command) => plugins::run_policies(client, command).await?,
    })
}
