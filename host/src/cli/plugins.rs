//! `orl plugins …` and `orl pools policies …`: policy plugins (WebAssembly components) and
//! which of them a pool runs.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Subcommand;
use serde_json::{Map, Value, json};

use super::{Client, Paging, Shown, read_json, render};

#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// Upload a WebAssembly component implementing the placer, preemptor or spend-guard
    /// world; the server validates it before storing it. Uploading the same bytes again
    /// answers the plugin already stored.
    Upload {
        /// The component, e.g. `target/wasm32-wasip2/release/my_placer.wasm`.
        file: PathBuf,
        /// The plugin's name (letters, digits, `.`, `_`, `:`, `-`; at most 128); defaults to
        /// the file's name without `.wasm`, other characters made `-`.
        #[arg(long)]
        name: Option<String>,
        /// The plugin's version, e.g. `1.2.0` (at most 64 characters).
        #[arg(long, default_value = "unversioned")]
        version: String,
    },
    /// The built-in and uploaded plugins by id, a page at a time, with the pools each is
    /// assigned to (of those the caller sees).
    List {
        #[command(flatten)]
        page: Paging,
    },
    /// One plugin.
    Get {
        /// The plugin's id, `sha256:<hex>`.
        id: String,
    },
    /// Delete a plugin; refused while a pool's policies name it.
    Delete {
        /// The plugin's id, `sha256:<hex>`.
        id: String,
    },
    /// The last lines a plugin logged, newest first, as kept by the server that answers:
    /// each server (replica) keeps the last 200 lines of each plugin in memory, from the
    /// decisions it ran, until it restarts.
    Logs {
        /// The plugin: its id (`sha256:<hex>`) or its name (e.g. `placer-default`).
        plugin: String,
        #[command(flatten)]
        page: Paging,
    },
    /// Run a plugin on this machine, without a server, against built-in scenarios (an
    /// 8-GPU node with two NVLink domains, a pool of MIG instances and NIC VFs, an almost
    /// full pool; two budgets for a spend-guard) and optionally a scenario file. Prints
    /// each decision, its time and the plugin's log lines, checks each answer as the
    /// server would, and exits non-zero when an answer is invalid or the plugin fails.
    Test(super::plugin_test::TestArgs),
}

impl PoliciesCommand {
    /// The pool the command is about.
    pub(super) fn pool_id(&mut self) -> &mut String {
        match self {
            PoliciesCommand::Get { pool_id } | PoliciesCommand::Set { pool_id, .. } => pool_id,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum PoliciesCommand {
    /// The plugins a pool runs, its plugins' config, deadline and failure behaviour.
    Get {
        /// The pool: its id (`pool_…`) or its name.
        pool_id: String,
    },
    /// Change a pool's policies. The current policies are read first and written back
    /// with only the flags given changed, so what is not named stays as it is. A plugin id
    /// of `default` goes back to the built-in default for that decision.
    Set {
        /// The pool: its id (`pool_…`) or its name.
        pool_id: String,
        /// Plugin id (`sha256:…`) of a placer, or `default`.
        #[arg(long)]
        placement: Option<String>,
        /// Plugin id of a preemptor, or `default`.
        #[arg(long)]
        preemption: Option<String>,
        /// Plugin id of a spend-guard, or `default`.
        #[arg(long)]
        spend_guard: Option<String>,
        /// A JSON file (`-` for stdin) the pool's plugins read as `/config/config.json`.
        #[arg(long, conflicts_with = "no_config")]
        config_file: Option<PathBuf>,
        /// Remove the plugins' config.
        #[arg(long)]
        no_config: bool,
        /// How long one decision may take, 1-10000 ms (50 unless set).
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..=10_000))]
        deadline_ms: Option<i64>,
        /// What a failed decision does: `fail` it (`POLICY_FAILED`), or let the built-in
        /// default decide instead (`fallback`).
        #[arg(long, value_parser = ["fail", "fallback"])]
        on_policy_failure: Option<String>,
    },
}

/// A plugin name the server accepts, from a file's name: `orl_placer_spread.wasm` is
/// `orl-placer-spread`.
fn name_of(file: &std::path::Path) -> anyhow::Result<String> {
    let stem = file
        .file_stem()
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .with_context(|| format!("{} has no name to use; pass --name", file.display()))?;
    let name: String = stem
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | ':' | '-' => c,
            _ => '-',
        })
        .take(128)
        .collect();
    Ok(name)
}

/// `text` encoded for a URL's query.
fn query_value(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

pub(super) async fn run_plugins(client: &Client, command: PluginsCommand) -> anyhow::Result<Shown> {
    Ok(match command {
        PluginsCommand::Upload {
            file,
            name,
            version,
        } => {
            let name = match name {
                Some(name) => name,
                None => name_of(&file)?,
            };
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let path = format!(
                "/v1/plugins?name={}&version={}",
                query_value(&name),
                query_value(&version)
            );
            // The server compiles the component before it answers: seconds for a Rust
            // one, tens of seconds for an interpreted language's.
            let spinner = crate::progress::spinner(format!(
                "uploading {} ({} KiB); the server validates and compiles it",
                file.display(),
                bytes.len().div_ceil(1024)
            ));
            let stored = client.post_bytes(&path, bytes, "application/wasm").await;
            spinner.finish_and_clear();
            (stored?, render::plugin)
        }
        PluginsCommand::List { page } => (
            client.get(&page.on("/v1/plugins".to_string())).await?,
            render::plugins,
        ),
        PluginsCommand::Get { id } => (
            client.get(&format!("/v1/plugins/{id}")).await?,
            render::plugin,
        ),
        PluginsCommand::Delete { id } => {
            client.delete(&format!("/v1/plugins/{id}")).await?;
            (json!({ "deleted": id }), render::object)
        }
        PluginsCommand::Test(_) => unreachable!("run without a server"),
        PluginsCommand::Logs { plugin, page } => {
            let id = client.plugin_id(&plugin).await?;
            (
                client
                    .get(&page.on(format!("/v1/plugins/{id}/logs")))
                    .await?,
                render::plugin_logs,
            )
        }
    })
}

/// Sets `field` of `policies` to a plugin id, or removes it for `default`.
fn set_plugin(policies: &mut Map<String, Value>, field: &str, id: Option<String>) {
    match id.as_deref() {
        None => {}
        Some("default") => {
            policies.remove(field);
        }
        Some(id) => {
            policies.insert(field.into(), Value::String(id.to_string()));
        }
    }
}

pub(super) async fn run_policies(
    client: &Client,
    command: PoliciesCommand,
) -> anyhow::Result<Shown> {
    let path = |pool: &str| format!("/v1/pools/{pool}/policies");
    Ok(match command {
        PoliciesCommand::Get { pool_id } => (client.get(&path(&pool_id)).await?, render::policies),
        PoliciesCommand::Set {
            pool_id,
            placement,
            preemption,
            spend_guard,
            config_file,
            no_config,
            deadline_ms,
            on_policy_failure,
        } => {
            // Read the config first: a file that is not JSON changes nothing.
            let config = match config_file {
                Some(file) => Some(read_json(&file, "the config file")?),
                None => None,
            };
            let current = client.get(&path(&pool_id)).await?;
            let Value::Object(mut policies) = current else {
                bail!("the server answered policies that are not an object: {current}");
            };
            policies.remove("updatedAt");
            policies.remove("effective");
            set_plugin(&mut policies, "placement", placement);
            set_plugin(&mut policies, "preemption", preemption);
            set_plugin(&mut policies, "spendLimit", spend_guard);
            if let Some(config) = config {
                policies.insert("config".into(), config);
            }
            if no_config {
                policies.remove("config");
            }
            if let Some(deadline) = deadline_ms {
                policies.insert("deadlineMs".into(), deadline.into());
            }
            if let Some(on_failure) = on_policy_failure {
                policies.insert("onPolicyFailure".into(), on_failure.into());
            }
            (
                client
                    .put(&path(&pool_id), &Value::Object(policies))
                    .await?,
                render::policies,
            )
        }
    })
}
