//! `orl compute reservations …`: the reservation RPC, one command per method.

use std::path::PathBuf;

use anyhow::bail;
use clap::builder::PossibleValuesParser;
use clap::{ArgGroup, Args, Subcommand};
use serde_json::{Value, json};

use super::{Client, Shown, read_json, render};
use crate::booking::State;

#[derive(Debug, Subcommand)]
pub enum ComputeCommand {
    /// A tenant's claims on devices of one pool for a time window.
    #[command(subcommand)]
    Reservations(ComputeReservationsCommand),
}

#[derive(Debug, Subcommand)]
pub enum ComputeReservationsCommand {
    /// Book GPUs of a pool for a window: one IAM decision, then `placed` or `pending`.
    Create(CreateArgs),
    /// One reservation of the tenant.
    Get(Target),
    /// The tenant's reservations, newest first.
    List(ListArgs),
    /// End a reservation now (a pending one is cancelled).
    Release(Target),
    /// Withdraw a reservation that has not started (pending or placed).
    Cancel(Target),
    /// Move the end of a reservation later, all or nothing.
    Extend(ExtendArgs),
    /// Move the lease deadline to now plus the reservation's leaseSeconds.
    Renew(Target),
    /// When and where a request would fit: the earliest starts in a window, with the units,
    /// and whether quota and budget would take it now. Books nothing.
    Availability(AvailabilityArgs),
}

/// One reservation of a tenant.
#[derive(Debug, Args)]
pub struct Target {
    /// The tenant org the reservation belongs to.
    #[arg(long)]
    tenant: String,
    /// The reservation id (`rsv_…`).
    id: String,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The tenant org that books.
    #[arg(long, required_unless_present = "request_file")]
    tenant: Option<String>,
    /// The pool: its id (`pool_…`) or its name.
    #[arg(long, required_unless_present = "request_file")]
    pool: Option<String>,
    #[command(flatten)]
    shape: Shape,
    /// Window length: seconds, or e.g. 90m, 2h, 1d.
    #[arg(long, default_value = "1h")]
    duration: String,
    /// Epoch milliseconds or RFC 3339 (e.g. 2026-12-01T09:00:00Z); defaults to now.
    #[arg(long, value_parser = instant)]
    start: Option<i64>,
    /// Renewable: released unless renewed within this many seconds (30-86400).
    #[arg(long)]
    lease_seconds: Option<i64>,
    /// Spot: may also use units that node reservations released to the spot market.
    #[arg(long)]
    spot: bool,
    /// Defaults to a fresh random key, printed to stderr so a retry can reuse it.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Hold the answer while the reservation is queued, at most 30000 ms.
    #[arg(long)]
    wait_ms: Option<i64>,
    /// Show what the create would do now (IAM, quota, budget, placement, preemption)
    /// without booking anything.
    #[arg(long)]
    plan: bool,
    /// Send this CreateRequest (JSON, `-` for stdin) instead of one built from the flags;
    /// --idempotency-key and --wait-ms still apply, and its `poolId` may name the pool.
    #[arg(long, conflicts_with_all = ["tenant", "pool", "count", "class", "model", "labels", "nvlink_all", "binding", "gang", "topology_key", "vcpu", "memory_gib", "hugepages", "duration", "start", "lease_seconds", "spot"])]
    request_file: Option<PathBuf>,
}

/// What a request asks for, as flags: one device entry, how it is bound, a gang, host
/// resources.
#[derive(Debug, Args)]
pub struct Shape {
    /// How many devices of --class (whole GPUs by default), 1-64.
    #[arg(
        long = "gpus",
        visible_alias = "count",
        id = "count",
        required_unless_present = "request_file"
    )]
    count: Option<i64>,
    /// The device class.
    #[arg(long, default_value = "gpu", value_parser = ["gpu", "gpu.mig", "gpu.slot", "nic.vf", "disk", "node"])]
    class: String,
    /// Exact device model, e.g. H100-SXM5-80GB.
    #[arg(long)]
    model: Option<String>,
    /// A label the units must carry (the unit's own, or else its node's), as key=value;
    /// repeat for more.
    #[arg(long = "label", id = "labels", value_name = "KEY=VALUE", value_parser = label)]
    labels: Vec<(String, String)>,
    /// All devices in one NVLink domain.
    #[arg(long)]
    nvlink_all: bool,
    /// How the devices are handed over: hold (the default), node or kubernetes.
    #[arg(long, value_parser = ["hold", "node", "kubernetes"])]
    binding: Option<String>,
    /// Members on distinct nodes (2-64), each getting the devices and resources asked for.
    #[arg(long)]
    gang: Option<i64>,
    /// Keep the gang's members on nodes with one value of this key (`region`, or a node
    /// label).
    #[arg(long, requires = "gang")]
    topology_key: Option<String>,
    /// Host CPUs to book on the node (per member), above the pool's per-GPU share.
    #[arg(long)]
    vcpu: Option<i64>,
    /// Host memory in GiB to book on the node (per member).
    #[arg(long)]
    memory_gib: Option<i64>,
    /// 1 GiB hugepages to book on the node (per member).
    #[arg(long)]
    hugepages: Option<i64>,
}

impl Shape {
    /// The request's fields these flags set.
    fn fields(&self) -> Value {
        let mut selector = serde_json::Map::new();
        if let Some(model) = &self.model {
            selector.insert("model".into(), json!(model));
        }
        if !self.labels.is_empty() {
            let labels: serde_json::Map<String, Value> = (self.labels.iter())
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            selector.insert("labels".into(), Value::Object(labels));
        }
        let device = json!({
            "class": self.class,
            "count": self.count,
            "selector": (!selector.is_empty()).then_some(Value::Object(selector)),
            "topology": self.nvlink_all.then_some("nvlink-all"),
        });
        let resources = (self.vcpu.is_some() || self.memory_gib.is_some() || self.hugepages.is_some())
            .then(|| json!({ "vcpu": self.vcpu, "memoryGiB": self.memory_gib, "hugepages1Gi": self.hugepages }));
        json!({
            "devices": [device],
            "binding": self.binding,
            "gang": self.gang.map(|size| json!({ "size": size, "topologyKey": self.topology_key })),
            "resources": resources,
        })
    }
}

/// A `key=value` label.
fn label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not key=value")),
    }
}

#[derive(Debug, Args)]
pub struct AvailabilityArgs {
    /// The tenant org that would book.
    #[arg(long, required_unless_present = "request_file")]
    tenant: Option<String>,
    /// The pool: its id (`pool_…`) or its name.
    #[arg(long, required_unless_present = "request_file")]
    pool: Option<String>,
    #[command(flatten)]
    shape: Shape,
    /// Window length: seconds, or e.g. 90m, 2h, 1d.
    #[arg(long, default_value = "1h")]
    duration: String,
    /// Spot: may also use units that node reservations released to the spot market.
    #[arg(long)]
    spot: bool,
    /// The earliest start: epoch milliseconds or RFC 3339; defaults to now.
    #[arg(long, value_parser = instant)]
    from: Option<i64>,
    /// The latest end: epoch milliseconds or RFC 3339; defaults to 7 days after --from.
    #[arg(long, value_parser = instant)]
    to: Option<i64>,
    /// 1-50 slots; the server's default is 10.
    #[arg(long)]
    limit: Option<i64>,
    /// Send this request (JSON, `-` for stdin: a create request plus `window` and `limit`)
    /// instead of one built from the flags.
    #[arg(long, conflicts_with_all = ["tenant", "pool", "count", "class", "model", "labels", "nvlink_all", "binding", "gang", "topology_key", "vcpu", "memory_gib", "hugepages", "duration", "spot", "from", "to", "limit"])]
    request_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(long)]
    tenant: String,
    /// `mine` (the default): the caller's own; `all`: every one the caller may read.
    #[arg(long, value_parser = ["mine", "all"])]
    scope: Option<String>,
    #[arg(long, value_parser = PossibleValuesParser::new(State::ALL.map(State::as_str)))]
    state: Option<String>,
    /// Only reservations of this pool (its id or its name).
    #[arg(long)]
    pool: Option<String>,
    /// 1-200; the server's default is 50.
    #[arg(long)]
    limit: Option<i64>,
    /// The `more: --cursor` of the previous page.
    #[arg(long)]
    cursor: Option<String>,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("new_end").required(true).args(["until", "by"])))]
pub struct ExtendArgs {
    #[arg(long)]
    tenant: String,
    /// The reservation id (`rsv_…`).
    id: String,
    /// The new end: epoch milliseconds or RFC 3339.
    #[arg(long, value_parser = instant)]
    until: Option<i64>,
    /// How much later: seconds, or e.g. 30m, 1h.
    #[arg(long)]
    by: Option<String>,
    /// Defaults to a fresh random key (extend does not replay).
    #[arg(long)]
    idempotency_key: Option<String>,
}

/// An instant given as epoch milliseconds or RFC 3339.
fn instant(text: &str) -> Result<i64, String> {
    text.parse()
        .ok()
        .or_else(|| crate::clock::parse_rfc3339(text))
        .ok_or_else(|| {
            format!("{text:?} is neither epoch milliseconds nor RFC 3339 (2026-12-01T09:00:00Z)")
        })
}

/// A duration as the API takes it: whole seconds as a number, anything else as text.
fn duration(text: &str) -> Value {
    text.trim()
        .parse::<i64>()
        .map_or_else(|_| Value::String(text.to_string()), Value::from)
}

/// `into` with the fields of `from` added (both JSON objects).
fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

fn fresh_key() -> String {
    format!("cli-{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// The availability request: from the file, or built from the flags.
fn availability_request(args: AvailabilityArgs) -> anyhow::Result<Value> {
    if let Some(file) = &args.request_file {
        return read_json(file, "the request file");
    }
    const WEEK_MS: i64 = 7 * 24 * 3_600_000;
    let from = args
        .from
        .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
    let mut request = json!({
        "tenantId": args.tenant,
        "poolId": args.pool,
        "duration": duration(&args.duration),
        "spot": args.spot.then_some(true),
        "window": { "from": from, "to": args.to.unwrap_or(from.saturating_add(WEEK_MS)) },
        "limit": args.limit,
    });
    merge(&mut request, args.shape.fields());
    Ok(render::without_nulls(request))
}

/// Replaces a pool name in the request's `poolId` (as a request file may give it) with the
/// pool's id.
async fn pool_by_id(client: &Client, request: &mut Value) -> anyhow::Result<()> {
    if let Some(Value::String(pool)) = request.get_mut("poolId") {
        *pool = client.pool_id(pool).await?;
    }
    Ok(())
}

/// The create request: from the file, or built from the flags.
fn create_request(args: CreateArgs) -> anyhow::Result<Value> {
    let mut request = match &args.request_file {
        Some(file) => read_json(file, "the request file")?,
        None => {
            let mut request = json!({
                "tenantId": args.tenant,
                "poolId": args.pool,
                "duration": duration(&args.duration),
                "start": args.start,
                "leaseSeconds": args.lease_seconds,
                "spot": args.spot.then_some(true),
            });
            merge(&mut request, args.shape.fields());
            render::without_nulls(request)
        }
    };
    let Some(fields) = request.as_object_mut() else {
        bail!("the request must be a JSON object");
    };
    let key = match (args.idempotency_key, fields.get("idempotencyKey")) {
        (Some(key), _) => key,
        (None, Some(Value::String(key))) => key.clone(),
        (None, _) => {
            let key = fresh_key();
            eprintln!("idempotency key: {key} (retry with --idempotency-key {key})");
            key
        }
    };
    fields.insert("idempotencyKey".into(), Value::String(key));
    if let Some(timeout) = args.wait_ms {
        fields.insert("wait".into(), json!({ "timeoutMs": timeout }));
    }
    Ok(request)
}

pub(super) async fn run(
    client: &Client,
    command: ComputeReservationsCommand,
) -> anyhow::Result<Shown> {
    let call = |method: &str| format!("/api/compute/reservations/{method}");
    let reference = |t: &Target| json!({ "tenantId": t.tenant, "reservationId": t.id });
    let mut command = command;
    let pool = match &mut command {
        ComputeReservationsCommand::Create(args) => args.pool.as_mut(),
        ComputeReservationsCommand::Availability(args) => args.pool.as_mut(),
        ComputeReservationsCommand::List(args) => args.pool.as_mut(),
        _ => None,
    };
    if let Some(named) = pool {
        *named = client.pool_id(named).await?;
    }
    Ok(match command {
        ComputeReservationsCommand::Create(args) if args.plan => {
            let mut body = create_request(args)?;
            pool_by_id(client, &mut body).await?;
            if let Some(fields) = body.as_object_mut() {
                fields.remove("wait");
            }
            (client.post(&call("plan"), &body).await?, render::plan)
        }
        ComputeReservationsCommand::Create(args) => {
            let mut body = create_request(args)?;
            pool_by_id(client, &mut body).await?;
            (
                client.post(&call("create"), &body).await?,
                render::reservation,
            )
        }
        ComputeReservationsCommand::Get(target) => (
            client.post(&call("get"), &reference(&target)).await?,
            render::reservation,
        ),
        ComputeReservationsCommand::List(args) => {
            let body = render::without_nulls(json!({
                "tenantId": args.tenant, "scope": args.scope, "state": args.state,
                "poolId": args.pool, "limit": args.limit, "cursor": args.cursor,
            }));
            (
                client.post(&call("list"), &body).await?,
                render::reservations,
            )
        }
        ComputeReservationsCommand::Release(target) => (
            client.post(&call("release"), &reference(&target)).await?,
            render::reservation,
        ),
        ComputeReservationsCommand::Cancel(target) => (
            client.post(&call("cancel"), &reference(&target)).await?,
            render::reservation,
        ),
        ComputeReservationsCommand::Extend(args) => {
            let body = render::without_nulls(json!({
                "tenantId": args.tenant, "reservationId": args.id,
                "until": args.until, "by": args.by.as_deref().map(duration),
                "idempotencyKey": args.idempotency_key.unwrap_or_else(fresh_key),
            }));
            (client.post(&call("extend"), &body).await?, render::extended)
        }
        ComputeReservationsCommand::Renew(target) => (
            client.post(&call("renew"), &reference(&target)).await?,
            render::reservation,
        ),
        ComputeReservationsCommand::Availability(args) => {
            let mut body = availability_request(args)?;
            pool_by_id(client, &mut body).await?;
            (
                client.post(&call("availability"), &body).await?,
                render::availability,
            )
        }
    })
}
