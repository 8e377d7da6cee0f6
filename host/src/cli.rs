//! The `orl` command-line client: every command is one API call, shown as a table (or as
//! the API's JSON with `--json`).

mod client;
mod compute;
mod graphql;
mod iam;
mod nodes;
mod plugin_test;
mod plugins;
mod pools;
pub mod profile;
mod provider;
mod render;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

pub use client::Client;
pub use compute::{ComputeCommand, ComputeReservationsCommand};
pub use iam::{ConfirmationsCommand, IamCommand, PolicyCommand};
pub use plugins::{PluginsCommand, PoliciesCommand};
pub use pools::PoolsCommand;
pub use provider::ProviderCommand;

/// An API answer and how to show it as a table.
type Shown = (Value, fn(&Value) -> String);

/// One page of a list whose cursor is the id of the last item of the page before.
#[derive(Debug, Clone, Args)]
pub struct Paging {
    /// How many items (1-200; the server's default is 50).
    #[arg(long)]
    limit: Option<u32>,
    /// Where the page starts: the `more: --cursor` of the previous page.
    #[arg(long)]
    cursor: Option<String>,
}

impl Paging {
    /// `path` with the page's query parameters.
    fn on(&self, path: String) -> String {
        let query: Vec<String> = [
            ("limit", self.limit.map(|l| l.to_string())),
            ("cursor", self.cursor.clone()),
        ]
        .into_iter()
        .filter_map(|(name, v)| v.map(|v| format!("{name}={v}")))
        .collect();
        match (query.is_empty(), path.contains('?')) {
            (true, _) => path,
            (false, false) => format!("{path}?{}", query.join("&")),
            (false, true) => format!("{path}&{}", query.join("&")),
        }
    }
}

/// Where and as whom the client talks to the server: a flag, else the environment, else
/// the profile file (see [`profile`]).
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Base URL of the orl server [default: the profile's `url`, else http://127.0.0.1:8080].
    #[arg(long, global = true, env = "ORL_URL")]
    pub url: Option<String>,
    /// API key (`or_…`) [default: the profile's `key` or `key_file`].
    #[arg(long, global = true, env = "ORL_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// The `[profiles.NAME]` table of ~/.config/orl/config.toml (under `XDG_CONFIG_HOME` when
    /// set) to take the URL and key from; without it, the file's top-level settings.
    #[arg(long, global = true, env = "ORL_PROFILE")]
    pub profile: Option<String>,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// Print only this field of the API's answer, e.g. `id`, `placement.nodeId` or
    /// `items.0.id` (a dotted path; numbers index lists): a string as it is, anything
    /// else as JSON. A missing field is an error.
    #[arg(long, global = true, value_name = "PATH", conflicts_with = "json")]
    pub field: Option<String>,
}

impl Connection {
    /// The server's URL and the key: each from its flag or environment variable when given,
    /// otherwise from the profile file (not read when both are given and no profile named).
    pub fn resolve(&self) -> anyhow::Result<(String, Option<String>)> {
        let given = self.url.is_some() && self.key.is_some() && self.profile.is_none();
        let from_profile = if given {
            profile::Profile::default()
        } else {
            profile::load(profile::path().as_deref(), self.profile.as_deref())?
        };
        let url = (self.url.clone())
            .or(from_profile.url)
            .unwrap_or_else(|| profile::DEFAULT_URL.to_string());
        Ok((url, self.key.clone().or(from_profile.key)))
    }
}

#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Orgs (platform admins create them).
    #[command(subcommand)]
    Orgs(OrgsCommand),
    /// API keys of an org.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Provider nodes and their inventory.
    #[command(subcommand)]
    Nodes(NodesCommand),
    /// Node reservations: exclusive rights over GPU units of a node for orgs.
    #[command(subcommand)]
    Reservations(ReservationsCommand),
    /// Pools of nodes, their offers to tenants and the policy plugins they run.
    #[command(subcommand)]
    Pools(PoolsCommand),
    /// Policy plugins: WebAssembly components that place, preempt and guard spending.
    #[command(subcommand)]
    Plugins(PluginsCommand),
    /// A provider org's earnings and payouts.
    #[command(subcommand)]
    Provider(ProviderCommand),
    /// Compute reservations: a tenant's claim on devices of one pool for a time window.
    #[command(subcommand)]
    Compute(ComputeCommand),
    /// An org's IAM policy (Cedar).
    #[command(subcommand)]
    Iam(IamCommand),
    /// Agents' requests waiting for a person of the org to approve or deny them.
    #[command(subcommand)]
    Confirmations(ConfirmationsCommand),
    /// The GraphQL API's schema.
    #[command(subcommand)]
    Graphql(graphql::GraphqlCommand),
    /// The units an org could place on now, per node, a page of nodes at a time.
    Catalog {
        org: String,
        #[command(flatten)]
        page: Paging,
    },
    /// The audit trail, newest first.
    Audit {
        #[arg(long)]
        org: Option<String>,
        #[command(flatten)]
        page: Paging,
    },
    /// How the platform's servers are doing: version, database, the replicas seen,
    /// the reconciler's lag and the policy plugins' failures (platform operators).
    Status,
    /// Events the caller's org may see, oldest first.
    Events {
        /// Only events after this id (the `more: --after` of the previous page).
        #[arg(long)]
        after: Option<i64>,
        /// 1-500; the server's default is 100.
        #[arg(long)]
        limit: Option<i64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum OrgsCommand {
    Create {
        id: String,
        #[arg(long)]
        name: String,
    },
    Get {
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key; its secret is printed once.
    Create {
        org: String,
        #[arg(long)]
        name: Option<String>,
        /// admin, operator, provider, member or viewer.
        #[arg(long, conflicts_with = "permissions")]
        role: Option<String>,
        /// Explicit permissions instead of a role, comma-separated.
        #[arg(long, value_delimiter = ',')]
        permissions: Option<Vec<String>>,
        /// The key is an automated caller acting for a person.
        #[arg(long)]
        agent: bool,
    },
    /// The org's keys, oldest first, a page at a time; secrets are never shown.
    List {
        org: String,
        #[command(flatten)]
        page: Paging,
    },
    Revoke {
        org: String,
        key_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// Register a node or replace its inventory from a JSON file (`-` for stdin).
    Put {
        org: String,
        node_id: String,
        #[arg(long)]
        file: PathBuf,
    },
    /// Register or replace many nodes from one JSON file (`-` for stdin): an object whose
    /// keys are node ids and whose values are inventories as `put` takes them. Shows a
    /// progress bar on a terminal; the first refusal stops it, naming the node.
    Import {
        /// The provider org that owns the nodes.
        org: String,
        /// The nodes file.
        #[arg(long)]
        file: PathBuf,
        /// How many nodes are sent at once.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
        parallel: u16,
    },
    /// The nodes an org owns, by id, a page at a time.
    List {
        org: String,
        #[command(flatten)]
        page: Paging,
    },
    Get {
        node_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReservationsCommand {
    /// Reserve units of a node for an audience (platform admin).
    Create {
        node_id: String,
        #[arg(long, value_delimiter = ',', required = true)]
        unit_ids: Vec<String>,
        #[arg(long, value_delimiter = ',', required = true)]
        allowed_org_ids: Vec<String>,
        #[arg(long, value_delimiter = ',')]
        managing_org_ids: Option<Vec<String>>,
        /// RFC 3339; defaults to now.
        #[arg(long)]
        starts_at: Option<String>,
        /// RFC 3339; omit for open-ended.
        #[arg(long)]
        ends_at: Option<String>,
        #[arg(long)]
        contract_ref: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Every reservation on a node.
    List {
        node_id: String,
    },
    Get {
        node_id: String,
        id: String,
    },
    /// Put reserved units on the spot market (same as `unit release`).
    Release(UnitRelease),
    /// Operations on units of a reservation.
    #[command(subcommand)]
    Unit(UnitCommand),
    /// End a reservation now (platform admin).
    End {
        node_id: String,
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Re-affirm a needs-review reservation against the node's current topology.
    Reaffirm {
        node_id: String,
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// What capacity is reserved to an org.
    Org {
        org_id: String,
        #[arg(long)]
        status: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum UnitCommand {
    /// Put reserved units on the spot market (double sell).
    Release(UnitRelease),
    /// Return released units to the reservation and terminate the spot work on them.
    Reclaim(UnitReclaim),
}

#[derive(Debug, Args)]
pub struct UnitReclaim {
    node_id: String,
    id: String,
    #[arg(long, value_delimiter = ',', required = true)]
    unit_ids: Vec<String>,
    #[arg(long)]
    reason: Option<String>,
    /// Report what would be terminated, and change nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
pub struct UnitRelease {
    node_id: String,
    id: String,
    #[arg(long, value_delimiter = ',', required = true)]
    unit_ids: Vec<String>,
    #[arg(long)]
    reason: Option<String>,
}

pub async fn run(conn: Connection, command: ClientCommand) -> anyhow::Result<()> {
    if let ClientCommand::Graphql(command) = command {
        return graphql::run(command);
    }
    if let ClientCommand::Plugins(PluginsCommand::Test(args)) = command {
        // Plugin calls are driven to completion on their own thread, never an async task.
        let json = conn.json;
        return tokio::task::spawn_blocking(move || plugin_test::run(args, json))
            .await
            .map_err(|e| anyhow::anyhow!("the plugin test stopped: {e}"))?;
    }
    let (url, key) = conn.resolve()?;
    let client = Client::new(&url, key.as_deref())?;
    let (value, view): Shown = match command {
        ClientCommand::Graphql(_) => unreachable!("answered without a server"),
        ClientCommand::Orgs(OrgsCommand::Create { id, name }) => (
            client
                .post("/v1/orgs", &json!({ "id": id, "name": name }))
                .await?,
            render::object,
        ),
        ClientCommand::Orgs(OrgsCommand::Get { id }) => {
            (client.get(&format!("/v1/orgs/{id}")).await?, render::object)
        }
        ClientCommand::Keys(KeysCommand::Create {
            org,
            name,
            role,
            permissions,
            agent,
        }) => {
            let body =
                json!({ "name": name, "role": role, "permissions": permissions, "agent": agent });
            let body = render::without_nulls(body);
            (
                client
                    .post(&format!("/v1/orgs/{org}/api-keys"), &body)
                    .await?,
                render::object,
            )
        }
        ClientCommand::Keys(KeysCommand::List { org, page }) => (
            client
                .get(&page.on(format!("/v1/orgs/{org}/api-keys")))
                .await?,
            render::keys,
        ),
        ClientCommand::Keys(KeysCommand::Revoke { org, key_id }) => {
            client
                .delete(&format!("/v1/orgs/{org}/api-keys/{key_id}"))
                .await?;
            (json!({ "revoked": key_id }), render::object)
        }
        ClientCommand::Nodes(NodesCommand::Put { org, node_id, file }) => {
            let body = read_json(&file, "the inventory file")?;
            let path = format!("/v1/orgs/{org}/provider/nodes/{node_id}");
            (client.put(&path, &body).await?, render::node)
        }
        ClientCommand::Nodes(NodesCommand::Import {
            org,
            file,
            parallel,
        }) => (
            nodes::import(&client, &org, &file, parallel.into()).await?,
            render::nodes,
        ),
        ClientCommand::Nodes(NodesCommand::List { org, page }) => (
            client
                .get(&page.on(format!("/v1/orgs/{org}/provider/nodes")))
                .await?,
            render::nodes,
        ),
        ClientCommand::Nodes(NodesCommand::Get { node_id }) => (
            client.get(&format!("/v1/nodes/{node_id}")).await?,
            render::node,
        ),
        ClientCommand::Reservations(command) => reservations(&client, command).await?,
        ClientCommand::Pools(command) => pools::run(&client, command).await?,
        ClientCommand::Plugins(command) => plugins::run_plugins(&client, command).await?,
        ClientCommand::Provider(command) => provider::run(&client, command).await?,
        ClientCommand::Compute(ComputeCommand::Reservations(command)) => {
            compute::run(&client, command).await?
        }
        ClientCommand::Iam(command) => {
            iam::run_iam(&client, command, !conn.json && conn.field.is_none()).await?
        }
        ClientCommand::Confirmations(command) => iam::run_confirmations(&client, command).await?,
        ClientCommand::Status => (client.get("/v1/status").await?, render::status),
        ClientCommand::Catalog { org, page } => (
            client
                .get(&page.on(format!("/v1/orgs/{org}/catalog")))
                .await?,
            render::catalog,
        ),
        ClientCommand::Audit { org, page } => {
            let path = match org {
                Some(org) => format!("/v1/audit?orgId={org}"),
                None => "/v1/audit".to_string(),
            };
            (client.get(&page.on(path)).await?, render::audit)
        }
        ClientCommand::Events { after, limit } => {
            let query: Vec<String> = [("after", after), ("limit", limit)]
                .into_iter()
                .filter_map(|(name, v)| v.map(|v| format!("{name}={v}")))
                .collect();
            let path = if query.is_empty() {
                "/v1/events".to_string()
            } else {
                format!("/v1/events?{}", query.join("&"))
            };
            (client.get(&path).await?, render::events)
        }
    };
    let shown = match &conn.field {
        Some(path) => field(&value, path)?,
        None if conn.json => serde_json::to_string_pretty(&value)?,
        None => view(&value),
    };
    // A view may show nothing (an org without a policy), and then prints nothing at all.
    if !shown.is_empty() {
        println!("{}", shown.strip_suffix('\n').unwrap_or(&shown));
    }
    Ok(())
}

/// The field of `value` at the dotted `path`: a string as it is, anything else as JSON.
fn field(value: &Value, path: &str) -> anyhow::Result<String> {
    let found = path.split('.').try_fold(value, |at, step| match at {
        Value::Array(items) => step.parse::<usize>().ok().and_then(|i| items.get(i)),
        Value::Object(fields) => fields.get(step),
        _ => None,
    });
    match found {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(other) => Ok(other.to_string()),
        None => Err(anyhow::anyhow!("the answer has no field {path:?}")),
    }
}

/// The text of `path`, or of stdin for `-`.
fn read_input(path: &Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        Ok(std::io::read_to_string(std::io::stdin())?)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// The JSON document in `path` (or stdin for `-`); `what` names it in the error.
fn read_json(path: &Path, what: &str) -> anyhow::Result<Value> {
    serde_json::from_str(&read_input(path)?).with_context(|| format!("{what} is not JSON"))
}

async fn reservations(client: &Client, command: ReservationsCommand) -> anyhow::Result<Shown> {
    let base = |node: &str| format!("/v1/nodes/{node}/reservations");
    Ok(match command {
        ReservationsCommand::Create {
            node_id,
            unit_ids,
            allowed_org_ids,
            managing_org_ids,
            starts_at,
            ends_at,
            contract_ref,
            reason,
        } => {
            let body = render::without_nulls(json!({
                "unitIds": unit_ids, "allowedOrgIds": allowed_org_ids, "managingOrgIds": managing_org_ids,
                "startsAt": starts_at, "endsAt": ends_at, "contractRef": contract_ref, "reason": reason,
            }));
            (client.post(&base(&node_id), &body).await?, render::object)
        }
        ReservationsCommand::List { node_id } => (
            client.get(&base(&node_id)).await?,
            render::node_reservations,
        ),
        ReservationsCommand::Get { node_id, id } => (
            client.get(&format!("{}/{id}", base(&node_id))).await?,
            render::object,
        ),
        ReservationsCommand::Release(release)
        | ReservationsCommand::Unit(UnitCommand::Release(release)) => {
            let body = render::without_nulls(
                json!({ "unitIds": release.unit_ids, "reason": release.reason }),
            );
            let path = format!("{}/{}/release", base(&release.node_id), release.id);
            (client.post(&path, &body).await?, render::object)
        }
        ReservationsCommand::Unit(UnitCommand::Reclaim(reclaim)) => {
            let body = render::without_nulls(json!({
                "unitIds": reclaim.unit_ids, "reason": reclaim.reason, "dryRun": reclaim.dry_run,
            }));
            let path = format!("{}/{}/reclaim", base(&reclaim.node_id), reclaim.id);
            (client.post(&path, &body).await?, render::object)
        }
        ReservationsCommand::End {
            node_id,
            id,
            reason,
        } => {
            let body = render::without_nulls(json!({ "reason": reason }));
            (
                client
                    .post(&format!("{}/{id}/end", base(&node_id)), &body)
                    .await?,
                render::object,
            )
        }
        ReservationsCommand::Reaffirm {
            node_id,
            id,
            reason,
        } => {
            let body = render::without_nulls(json!({ "reason": reason }));
            (
                client
                    .post(&format!("{}/{id}/reaffirm", base(&node_id)), &body)
                    .await?,
                render::object,
            )
        }
        ReservationsCommand::Org { org_id, status } => {
            let mut path = format!("/v1/orgs/{org_id}/reservations");
            if let Some(status) = status {
                path.push_str(&format!("?status={status}"));
            }
            (client.get(&path).await?, render::node_reservations)
        }
    })
}
