//! `orl nodes import`: many nodes registered from one file, a few requests at a time.

use std::path::Path;

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use serde_json::{Value, json};

use super::{Client, read_json};

/// Registers (or replaces) every node of the file at `path` for `org`: a JSON object of
/// node id → inventory, sent `parallel` at a time in the file's key order. Answers the
/// nodes as registered, as a page of `items`. The first refusal stops the import with its
/// node named; the nodes registered before it stay registered.
pub(super) async fn import(
    client: &Client,
    org: &str,
    path: &Path,
    parallel: usize,
) -> anyhow::Result<Value> {
    let Value::Object(nodes) = read_json(path, "the nodes file")? else {
        bail!("the nodes file must be a JSON object of node id → inventory");
    };
    let progress = crate::progress::bar(
        nodes.len() as u64,
        format!("registering for {org}"),
        "nodes",
    );
    let mut puts = futures::stream::iter(nodes.iter())
        .map(|(node_id, inventory)| async move {
            let path = format!("/v1/orgs/{org}/provider/nodes/{node_id}");
            (client.put(&path, inventory).await).with_context(|| format!("node {node_id}"))
        })
        .buffered(parallel.max(1));
    let mut registered = Vec::with_capacity(nodes.len());
    while let Some(node) = puts.next().await {
        match node {
            Ok(node) => registered.push(node),
            Err(err) => {
                progress.abandon();
                return Err(err.context(format!(
                    "{} of {} nodes registered before",
                    registered.len(),
                    nodes.len()
                )));
            }
        }
        progress.inc(1);
    }
    progress.finish_and_clear();
    Ok(json!({ "items": registered }))
}
