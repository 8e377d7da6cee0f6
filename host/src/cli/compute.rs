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
    /// The pool id (`pool_…`).
    #[arg(long, required_unless_present = "request_file")]
    pool: Option<String>,
    /// How many whole GPUs.
    #[arg(long, required_unless_present = "request_file")]
    gpus: Option<i64>,
    /// Exact GPU model, e.g. H100-SXM5-80GB.
    #[arg(long)]
    model: Option<String>,
    /// All GPUs in one NVLink domain.
    #[arg(long)]
    nvlink_all: bool,
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
    /// --idempotency-key and --wait-ms still apply.
    #[arg(long, conflicts_with_all = ["tenant", "pool", "gpus", "model", "nvlink_all", "duration", "start", "lease_seconds", "spot"])]
    request_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct AvailabilityArgs {
    /// The tenant org that would book.
    #[arg(long, required_unless_present = "request_file")]
    tenant: Option<String>,
    /// The pool id (`pool_…`).
    #[arg(long, required_unless_present = "request_file")]
    pool: Option<String>,
    /// How many whole GPUs.
    #[arg(long, required_unless_present = "request_file")]
    gpus: Option<i64>,
    /// Exact GPU model, e.g. H100-SXM5-80GB.
    #[arg(long)]
    model: Option<String>,
    /// All GPUs in one NVLink domain.
    #[arg(long)]
    nvlink_all: bool,
    /// Window length: seconds, or e.g. 90m, 2h, 1d.
    #[arg(long, default_value = "1h")]
    duration: String,
    /// Spot: may also use units that node reservations released to the spot market.
    #[arg(long)]
    spot: bool,
    /// Members on distinct nodes (2-64).
    #[arg(long)]
    gang: Option<i64>,
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
    #[arg(long, conflicts_with_all = ["tenant", "pool", "gpus", "model", "nvlink_all", "duration", "spot", "gang", "from", "to", "limit"])]
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
    /// Only reservations of this pool.
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

fn fresh_key() -> String {
    format!("cli-{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// A device entry of whole GPUs, of one model and in one NVLink domain when asked.
fn gpus(count: Option<i64>, model: Option<String>, nvlink_all: bool) -> Value {
    let mut device = json!({ "class": "gpu", "count": count });
    if let Some(model) = model {
        device["selector"] = json!({ "model": model });
    }
    if nvlink_all {
        device["topology"] = json!("nvlink-all");
    }
    device
}

/// The availability request: from the file, or built from the flags.
fn availability_request(args: AvailabilityArgs) -> anyhow::Result<Value> {
    if let Some(file) = &args.request_file {
        return read_json(file, "the request file");
    }
    let device = gpus(args.gpus, args.model, args.nvlink_all);
    const WEEK_MS: i64 = 7 * 24 * 3_600_000;
    let from = args
        .from
        .unwrap_or_else(|| chrono::Utc::now().timestamp_millis());
    Ok(render::without_nulls(json!({
        "tenantId": args.tenant,
        "poolId": args.pool,
        "devices": [device],
        "duration": duration(&args.duration),
        "spot": args.spot.then_some(true),
        "gang": args.gang.map(|size| json!({ "size": size })),
        "window": { "from": from, "to": args.to.unwrap_or(from.saturating_add(WEEK_MS)) },
        "limit": args.limit,
    })))
}

/// The create request: from the file, or built from the flags.
fn create_request(args: CreateArgs) -> anyhow::Result<Value> {
    let mut request = match &args.request_file {
        Some(file) => read_json(file, "the request file")?,
        None => {
            let device = gpus(args.gpus, args.model, args.nvlink_all);
            render::without_nulls(json!({
                "tenantId": args.tenant,
                "poolId": args.pool,
                "devices": [device],
                "duration": duration(&args.duration),
                "start": args.start,
                "leaseSeconds": args.lease_seconds,
                "spot": args.spot.then_some(true),
            }))
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
    Ok(match command {
        ComputeReservationsCommand::Create(args) if args.plan => {
            let mut body = create_request(args)?;
            if let Some(fields) = body.as_object_mut() {
                fields.remove("wait");
            }
            (client.post(&call("plan"), &body).await?, render::plan)
        }
        ComputeReservationsCommand::Create(args) => {
            let body = create_request(args)?;
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
            let body = availability_request(args)?;
            (
                client.post(&call("availability"), &body).await?,
                render::availability,
            )
        }
    })
}
