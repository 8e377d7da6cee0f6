//! `orl iam policy …` and `orl confirmations …`: an org's Cedar policy, and the agents'
//! requests it sends to a person.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::{Client, Shown, read_input, render};

#[derive(Debug, Subcommand)]
pub enum IamCommand {
    /// The org's Cedar policy, decided on every compute reservation request.
    #[command(subcommand)]
    Policy(PolicyCommand),
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Set the org's policy from a Cedar file (`-` for stdin); an empty file removes it.
    Set {
        org: String,
        #[arg(long)]
        file: PathBuf,
    },
    /// Print the org's policy (as Cedar text, ready to edit and set again).
    Get { org: String },
}

#[derive(Debug, Subcommand)]
pub enum ConfirmationsCommand {
    /// The org's confirmation requests, newest first.
    List { org: String },
    /// Approve a pending request; the agent's retry with the same key continues it.
    Approve { org: String, id: String },
    /// Deny a pending request; the agent's retry is refused.
    Deny { org: String, id: String },
}

pub(super) async fn run_iam(client: &Client, command: IamCommand) -> anyhow::Result<Shown> {
    let path = |org: &str| format!("/v1/orgs/{org}/iam/policy");
    Ok(match command {
        IamCommand::Policy(PolicyCommand::Set { org, file }) => {
            let body = json!({ "policy": read_input(&file)? });
            (client.put(&path(&org), &body).await?, render::policy)
        }
        IamCommand::Policy(PolicyCommand::Get { org }) => {
            (client.get(&path(&org)).await?, render::policy)
        }
    })
}

pub(super) async fn run_confirmations(
    client: &Client,
    command: ConfirmationsCommand,
) -> anyhow::Result<Shown> {
    let base = |org: &str| format!("/v1/orgs/{org}/confirmations");
    Ok(match command {
        ConfirmationsCommand::List { org } => {
            (client.get(&base(&org)).await?, render::confirmations)
        }
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
