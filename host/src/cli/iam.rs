//! `orl iam policy …` and `orl confirmations …`: an org's Cedar policy, and the agents'
//! requests it sends to a person.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::{Client, Paging, Shown, read_input, render};

#[derive(Debug, Subcommand)]
pub enum IamCommand {
    /// The org's Cedar policy, decided on every compute reservation request.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Set the org's policy from a Cedar file (`-` for stdin); an empty file removes it.
    /// The server refuses a policy that names an entity type, action or attribute that orl
    /// never sends.
    Set {
        /// The org whose policy it is.
        org: String,
        /// The Cedar file.
        #[arg(long)]
        file: PathBuf,
    },
    /// Print the org's policy exactly as it was set (nothing when it has none), ready to
    /// edit and set again; when it was set goes to stderr (not with `--json` or `--field`,
    /// which print the answer alone).
    Get {
        /// The org whose policy it is.
        org: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfirmationsCommand {
    /// The org's confirmation requests, newest first, a page at a time.
    List {
        org: String,
        #[command(flatten)]
        page: Paging,
    },
    /// Approve a pending request; the agent's retry with the same key continues it.
    Approve { org: String, id: String },
    /// Deny a pending request; the agent's retry is refused.
    Deny { org: String, id: String },
}

/// Runs an `orl iam` command; `note` says whether a human reads the output, who is then
/// told on stderr when the policy was set.
pub(super) async fn run_iam(
    client: &Client,
    command: IamCommand,
    note: bool,
) -> anyhow::Result<Shown> {
    let path = |org: &str| format!("/v1/orgs/{org}/iam/policy");
    Ok(match command {
        IamCommand::Policy(PolicyCommand::Set { org, file }) => {
            let body = json!({ "policy": read_input(&file)? });
            (client.put(&path(&org), &body).await?, render::policy)
        }
        IamCommand::Policy(PolicyCommand::Get { org }) => {
            let policy = client.get(&path(&org)).await?;
            // On stderr, so that what stdout prints can be set again as it is.
            match policy["updatedAt"].as_str() {
                _ if !note => {}
                Some(at) => eprintln!("orl: {org}'s policy, set {at}"),
                None => eprintln!("orl: {org} has no policy: holding a permission allows"),
            }
            (policy, render::policy)
        }
    })
}

pub(super) async fn run_confirmations(
    client: &Client,
    command: ConfirmationsCommand,
) -> anyhow::Result<Shown> {
    let base = |org: &str| format!("/v1/orgs/{org}/confirmations");
    Ok(match command {
        ConfirmationsCommand::List { org, page } => (
            client.get(&page.on(base(&org))).await?,
            render::confirmations,
        ),
        ConfirmationsCommand::Approve { org, id } => (
            client
                .post(&format!("{}/{id}/approve", base(&org)), &json!({}))
                .await?,
            render::confirmation,
        ),
        ConfirmationsCommand::Deny { org, id } => (
            client
                .post(&format!("{}/{id}/deny", base(&org)), &json!({}))
                .await?,
            render::confirmation,
        ),
    })
}
