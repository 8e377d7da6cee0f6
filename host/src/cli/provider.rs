//! `orl provider …`: what a provider org runs and earns, and its spot workloads. Each subcommand is one variant of
//! [`ProviderCommand`] with its own arguments and one arm in [`run`].

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use serde_json::{Value, json};

use super::render::{self, cell};
use super::{Client, Shown};

#[derive(Debug, Subcommand)]
pub enum ProviderCommand {
    /// What the org earned from GPU time on its nodes, what is available for payout, and
    /// its recent payouts. Amounts are integer minor currency units.
    Earnings(EarningsArgs),
    /// Record a payout to a provider org (platform operators).
    Payout(PayoutArgs),
    /// Spot workloads on the org's nodes.
    #[command(subcommand)]
    SpotWorkload(SpotWorkloadCommand),
}

#[derive(Debug, Subcommand)]
pub enum SpotWorkloadCommand {
    /// Terminate the spot workloads on a node the org owns, or on the released units of
    /// reservations it manages there. Non-spot workloads are never touched.
    Reclaim(ReclaimArgs),
}

#[derive(Debug, Args)]
pub struct ReclaimArgs {
    node_id: String,
    /// The org acting; defaults to the org of the API key.
    #[arg(long)]
    org: Option<String>,
    /// Limit to these units.
    #[arg(long, value_delimiter = ',')]
    unit_ids: Option<Vec<String>>,
    /// Recorded in the audit trail.
    #[arg(long)]
    reason: Option<String>,
    /// Report what would be terminated, and terminate nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
pub struct EarningsArgs {
    /// The provider org; defaults to the org of the API key.
    #[arg(long)]
    org: Option<String>,
}

#[derive(Debug, Args)]
pub struct PayoutArgs {
    /// The provider org paid.
    org_id: String,
    /// The amount, a positive integer of minor currency units.
    #[arg(long)]
    amount_minor: i64,
    /// The transfer's reference (bank or ledger id).
    #[arg(long)]
    reference: Option<String>,
}

pub(super) async fn run(client: &Client, command: ProviderCommand) -> anyhow::Result<Shown> {
    Ok(match command {
        ProviderCommand::Earnings(args) => {
            let org = match args.org {
                Some(org) => org,
                None => own_org(client).await?,
            };
            (
                client
                    .get(&format!("/v1/orgs/{org}/provider/earnings"))
                    .await?,
                earnings,
            )
        }
        ProviderCommand::SpotWorkload(SpotWorkloadCommand::Reclaim(args)) => {
            let org = match args.org {
                Some(org) => org,
                None => own_org(client).await?,
            };
            let body = render::without_nulls(json!({
                "unitIds": args.unit_ids, "reason": args.reason, "dryRun": args.dry_run,
            }));
            let path = format!(
                "/v1/orgs/{org}/provider/nodes/{}/reclaim-spot",
                args.node_id
            );
            (client.post(&path, &body).await?, render::object)
        }
        ProviderCommand::Payout(args) => {
            let body = render::without_nulls(json!({
                "amountMinor": args.amount_minor, "reference": args.reference,
            }));
            let path = format!("/v1/orgs/{}/provider/payouts", args.org_id);
            (client.post(&path, &body).await?, render::object)
        }
    })
}

/// The org of the caller's API key, as the GraphQL `viewer` reports it.
async fn own_org(client: &Client) -> anyhow::Result<String> {
    let answer = client
        .post("/graphql", &json!({ "query": "{ viewer { orgId } }" }))
        .await
        .context("finding the org of the API key")?;
    if let Some(errors) = answer.get("errors") {
        bail!("finding the org of the API key: {errors}");
    }
    answer["data"]["viewer"]["orgId"]
        .as_str()
        .map(str::to_string)
        .context("finding the org of the API key: no viewer in the answer")
}

fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    table.to_string()
}

/// A breakdown (`byNode`, `byModel`, `byDay`) keyed by `key`.
fn breakdown(value: &Value, list: &str, key: &str) -> String {
    let rows = value[list].as_array().into_iter().flatten().map(|row| {
        [key, "grossMinor", "earnedMinor", "gpuSeconds"]
            .iter()
            .map(|f| cell(&row[*f]))
            .collect()
    });
    table(&[key, "gross", "earned", "GPU seconds"], rows)
}

/// The earnings view: totals, then each breakdown, then the recent payouts.
pub fn earnings(value: &Value) -> String {
    let totals = [
        ("org", "orgId"),
        ("as of", "asOf"),
        ("currency", "currency"),
        ("gross", "grossMinor"),
        ("earned", "earnedMinor"),
        ("paid out", "paidOutMinor"),
        ("available", "availableMinor"),
        ("provider share (bps)", "providerShareBps"),
        ("GPU seconds", "gpuSeconds"),
        ("active rentals", "activeRentals"),
    ]
    .iter()
    .map(|(label, field)| vec![(*label).to_string(), cell(&value[*field])]);
    let payouts = value["recentPayouts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            ["id", "amountMinor", "reference", "createdAt"]
                .iter()
                .map(|f| cell(&p[*f]))
                .collect()
        });
    [
        table(&["", ""], totals),
        breakdown(value, "byNode", "nodeId"),
        breakdown(value, "byModel", "model"),
        breakdown(value, "byDay", "day"),
        table(&["payout", "amount", "reference", "created"], payouts),
    ]
    .join("\n")
}
