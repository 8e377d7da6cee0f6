//! `orl bench api`: the create path as a user feels it, end to end over HTTP.
//!
//! For each node count it starts a real `orl serve` (SQLite in a temporary directory, or a
//! fresh database on `--database-url`'s PostgreSQL server), registers the nodes (8 H100s in
//! two NVLink domains of 4) over the API, puts them in one pool offered to one tenant, and
//! drives concurrent clients that create reservations of 1, 2, 4 and 8 GPUs (half of the 4s
//! `nvlink-all`; an 8 is a whole node), releasing their oldest ones whenever the pool is more than 70 %
//! booked. It prints creates per second, latency percentiles, answers by code, the server's
//! CPU time per create, how busy its write turn was, and its resident memory, then the
//! latency of `get`, `list`, a page of the catalog and a GraphQL page of 100 nodes. Last, it
//! books units spread over the next 180 days (`--availability-bookings`) and times
//! availability searches over that window.

use std::collections::{BTreeMap, VecDeque};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Options of `orl bench api`.
#[derive(Debug, clap::Args)]
pub struct ApiBench {
    /// Node counts to measure (8 GPUs each).
    #[arg(long, value_delimiter = ',', default_values_t = vec![500, 5_000, 20_000])]
    pub nodes: Vec<usize>,
    /// Concurrent clients creating reservations.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// How long the clients create, per node count (`15s`, `1m`).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// A PostgreSQL server (`postgres://…/postgres`) to create a fresh database on for each
    /// run; SQLite in a temporary directory otherwise.
    #[arg(long)]
    pub database_url: Option<String>,
    /// After the reads, book this many more units spread over the next 180 days, then time
    /// availability searches over that window (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    pub availability_bookings: usize,
}

/// Share of the pool's GPUs the clients keep booked.
const TARGET_BOOKED: f64 = 0.7;

/// Runs the benchmark and prints one block per node count.
pub async fn run(args: ApiBench) -> anyhow::Result<()> {
    println!(
        "orl bench api: {} clients for {:?} per run, {}",
        args.clients,
        args.duration,
        if args.database_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    );
    for &nodes in &args.nodes {
        let server = Server::start(args.database_url.as_deref()).await?;
        let outcome = measure(&server, nodes, &args).await;
        server.stop().await;
        outcome?;
    }
    Ok(())
}

async fn measure(server: &Server, nodes: usize, args: &ApiBench) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients * 2)
        .build()?;
    let api = Api {
        http: http.clone(),
        base: server.url.clone(),
        key: server.admin.clone(),
    };
    let started = Instant::now();
    let (tenant, pool) = setup(&api, nodes, args.availability_bookings).await?;
    println!(
        "\n{nodes} nodes × 8 GPUs: registered in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let capacity = (nodes * 8) as i64;
    let booked = Arc::new(AtomicI64::new(0));
    let turn_before = WriteTurn::read(&api).await?;
    let cpu_before = server.cpu_seconds()?;
    let deadline = Instant::now() + args.duration;
    let mut clients = Vec::new();
    for c in 0..args.clients {
        let client = Client {
            api: tenant.clone(),
            pool: pool.clone(),
            booked: booked.clone(),
            capacity,
            rng: StdRng::seed_from_u64(c as u64),
            live: VecDeque::new(),
            tag: format!("c{c}"),
        };
        clients.push(tokio::spawn(client.run(deadline)));
    }
    let ticking = tick_until(
        deadline,
        crate::progress::bar(args.duration.as_secs().max(1), "creating", "s"),
    );
    let mut latencies = Vec::new();
    let mut codes: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids = Vec::new();
    for client in clients {
        let report = client.await??;
        latencies.extend(report.latencies);
        for (code, n) in report.codes {
            *codes.entry(code).or_default() += n;
        }
        ids.extend(report.ids);
    }
    ticking.abort();
    let cpu = server.cpu_seconds()? - cpu_before;
    let creates = latencies.len();
    println!(
        "  creates: {:.0}/s ({creates} in {:?}), p50 {}, p99 {}, server CPU {:.2} ms per create",
        creates as f64 / args.duration.as_secs_f64(),
        args.duration,
        ms(percentile(&mut latencies, 0.50)),
        ms(percentile(&mut latencies, 0.99)),
        cpu * 1000.0 / creates.max(1) as f64,
    );
    println!("  answers: {codes:?}");
    let turn = WriteTurn::read(&api).await?.since(&turn_before);
    println!(
        "  write turn: held {:.0} % of the run, {:.2} ms a write, {:.1} writes a group commit",
        turn.held * 100.0 / args.duration.as_secs_f64(),
        turn.held * 1000.0 / turn.writes.max(1.0),
        turn.writes / turn.commits.max(1.0),
    );
    let booked = booked.load(Ordering::Relaxed);
    println!(
        "  pool booked at the end: {:.0} % ({booked} live unit bookings), server resident memory {:.0} MiB",
        booked as f64 * 100.0 / capacity as f64,
        server.resident_mib()?
    );
    reads(&tenant, &api, &pool, &ids).await?;
    alone(server, &tenant, &pool).await?;
    full(server, &tenant, &api, &pool, args.clients).await?;
    if args.availability_bookings > 0 {
        spread(&tenant, &pool, args.availability_bookings, args.clients).await?;
        println!("  server resident memory {:.0} MiB", server.resident_mib()?);
        searches(&tenant, &pool).await?;
    }
    Ok(())
}

/// Moves `progress` a step a second until `deadline`, then clears it; abort the task to
/// clear it sooner.
fn tick_until(deadline: Instant, progress: indicatif::ProgressBar) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _clear = ClearOnDrop(progress.clone());
        let start = Instant::now();
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
            progress.set_position(start.elapsed().as_secs());
        }
    })
}

/// Clears a progress bar when dropped, also when its task is aborted.
struct ClearOnDrop(indicatif::ProgressBar);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// The window availability searches look over, and future bookings are spread over.
const SPREAD_DAYS: i64 = 180;
const HOUR_MS: i64 = 3_600_000;

/// Books `units` more GPUs at random starts over the next [`SPREAD_DAYS`] days, for 1 to 72
/// hours each, from `clients` clients at once.
async fn spread(tenant: &Api, pool: &str, units: usize, clients: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let now = chrono::Utc::now().timestamp_millis();
    let booked = Arc::new(AtomicI64::new(0));
    let progress = crate::progress::bar(units as u64, "booking ahead", "units");
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (api, pool, booked) = (tenant.clone(), pool.to_string(), booked.clone());
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(1_000 + c as u64);
            let mut n = 0;
            while booked.load(Ordering::Relaxed) < units as i64 {
                let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
                let start = now + rng.random_range(1..SPREAD_DAYS * 24) * HOUR_MS;
                n += 1;
                let body = json!({ "tenantId": "tenant-a", "poolId": pool,
                                   "devices": [{ "class": "gpu", "count": gpus }], "start": start,
                                   "duration": rng.random_range(1..=72) * 3600,
                                   "idempotencyKey": format!("spread-{c}-{n}") });
                let (status, answer) = api
                    .call("POST", "/api/compute/reservations/create", body)
                    .await?;
                if !status.is_success() {
                    bail!("booking ahead: {status} {answer}");
                }
                if answer["state"] == "placed" {
                    booked.fetch_add(gpus, Ordering::Relaxed);
                    progress.inc(gpus as u64);
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    progress.finish_and_clear();
    println!(
        "  booked {} more units over the next {SPREAD_DAYS} days in {:.1} s",
        booked.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Latency of availability searches over the next [`SPREAD_DAYS`] days, 50 of each shape,
/// one at a time.
async fn searches(tenant: &Api, pool: &str) -> anyhow::Result<()> {
    let shapes = [
        ("8 GPUs nvlink-all", 8, true, 1),
        ("8 GPUs", 8, false, 1),
        ("4 GPUs nvlink-all", 4, true, 1),
        ("1 GPU", 1, false, 1),
        ("a gang of 4 × 8 GPUs", 8, false, 4),
    ];
    for (name, gpus, nvlink_all, members) in shapes {
        let now = chrono::Utc::now().timestamp_millis();
        let mut device = json!({ "class": "gpu", "count": gpus });
        if nvlink_all {
            device["topology"] = json!("nvlink-all");
        }
        let mut body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [device], "duration": "24h",
                           "window": { "from": now, "to": now + SPREAD_DAYS * 24 * HOUR_MS } });
        if members > 1 {
            body["gang"] = json!({ "size": members });
        }
        let mut latencies = Vec::new();
        let (mut slots, mut searched_days) = (0, 0.0);
        for _ in 0..50 {
            let sent = Instant::now();
            let answer = tenant
                .send(
                    "POST",
                    "/api/compute/reservations/availability",
                    body.clone(),
                )
                .await?;
            latencies.push(sent.elapsed());
            slots = answer["slots"].as_array().map_or(0, Vec::len);
            let searched_until = answer["searchedUntil"].as_i64().unwrap_or(now);
            searched_days = (searched_until - now) as f64 / (24 * HOUR_MS) as f64;
        }
        println!(
            "  availability, {name} for 24 h over {SPREAD_DAYS} days: p50 {}, p99 {} ({slots} slots, complete up to day {searched_days:.1})",
            ms(percentile(&mut latencies, 0.50)),
            ms(percentile(&mut latencies, 0.99))
        );
    }
    Ok(())
}

/// Registers `nodes` nodes for provider `acme`, a pool of them offered to `tenant-a` with
/// quota for the load and `spread` more units; answers the tenant's client and the pool id.
async fn setup(admin: &Api, nodes: usize, spread: usize) -> anyhow::Result<(Api, String)> {
    for org in ["acme", "tenant-a"] {
        admin
            .send("POST", "/v1/orgs", json!({ "id": org, "name": org }))
            .await?;
    }
    let provider = admin.with_key(
        admin
            .send(
                "POST",
                "/v1/orgs/acme/api-keys",
                json!({ "role": "provider" }),
            )
            .await?["key"]
            .as_str()
            .context("provider key")?,
    );
    let tenant = admin.with_key(
        admin
            .send(
                "POST",
                "/v1/orgs/tenant-a/api-keys",
                json!({ "role": "member" }),
            )
            .await?["key"]
            .as_str()
            .context("tenant key")?,
    );
    let ids: Vec<String> = (0..nodes).map(|n| format!("node-{n:05}")).collect();
    let registrations = futures::stream::iter(ids.clone()).map(|id| {
        let provider = provider.clone();
        async move {
            provider
                .send(
                    "PUT",
                    &format!("/v1/orgs/acme/provider/nodes/{id}"),
                    inventory(&id),
                )
                .await
        }
    });
    use futures::StreamExt as _;
    let mut registrations = registrations.buffer_unordered(8);
    let progress = crate::progress::bar(nodes as u64, "registering", "nodes");
    while let Some(done) = registrations.next().await {
        done?;
        progress.inc(1);
    }
    progress.finish_and_clear();
    let pool = admin
        .send(
            "POST",
            "/v1/pools",
            json!({ "name": "bench", "ownerOrgId": "acme", "nodeIds": ids }),
        )
        .await?["id"]
        .as_str()
        .context("pool id")?
        .to_string();
    admin
        .send(
            "POST",
            &format!("/v1/pools/{pool}/offers"),
            json!({ "tenantId": "tenant-a", "quota": { "gpu": nodes * 8 * 10 + spread } }),
        )
        .await?;
    Ok((tenant, pool))
}

fn inventory(node: &str) -> Value {
    let units: Vec<Value> = (0..8)
        .map(|g| {
            json!({ "id": format!("{node}-gpu{g}"), "class": "vfio-group", "deviceClass": "gpu",
                    "model": "H100-SXM5-80GB", "memoryGiB": 80, "nvlinkDomain": format!("nvl{}", g / 4),
                    "sellable": true })
        })
        .collect();
    json!({ "region": "bench-1", "host": { "vcpu": 224, "memoryGiB": 2048, "hugepages1Gi": 512 }, "units": units })
}

/// One load-generating client: creates, and releases its oldest reservations while the
/// pool is above the target.
struct Client {
    api: Api,
    pool: String,
    booked: Arc<AtomicI64>,
    capacity: i64,
    rng: StdRng,
    live: VecDeque<(String, i64)>,
    tag: String,
}

#[derive(Default)]
struct Report {
    latencies: Vec<Duration>,
    codes: BTreeMap<String, usize>,
    ids: Vec<String>,
}

impl Client {
    async fn run(mut self, deadline: Instant) -> anyhow::Result<Report> {
        let mut report = Report::default();
        let mut n = 0;
        while Instant::now() < deadline {
            while self.booked.load(Ordering::Relaxed) as f64 > TARGET_BOOKED * self.capacity as f64
            {
                let Some((id, gpus)) = self.live.pop_front() else {
                    break;
                };
                let body = json!({ "tenantId": "tenant-a", "reservationId": id });
                self.api
                    .call("POST", "/api/compute/reservations/release", body)
                    .await?;
                self.booked.fetch_sub(gpus, Ordering::Relaxed);
            }
            let gpus = [1, 2, 4, 8][self.rng.random_range(0..4)];
            let mut device = json!({ "class": "gpu", "count": gpus });
            if gpus == 4 && self.rng.random_bool(0.5) {
                device["topology"] = json!("nvlink-all");
            }
            n += 1;
            let body = json!({ "tenantId": "tenant-a", "poolId": self.pool, "devices": [device],
                               "duration": "2h", "idempotencyKey": format!("{}-{n}", self.tag) });
            let sent = Instant::now();
            let (status, answer) = self
                .api
                .call("POST", "/api/compute/reservations/create", body)
                .await?;
            report.latencies.push(sent.elapsed());
            let code = if status.is_success() {
                let state = answer["state"].as_str().unwrap_or("?");
                match answer["conditions"][0]["message"].as_str() {
                    Some(why) if state == "pending" => format!("pending: {why}"),
                    _ => state.to_string(),
                }
            } else {
                answer["error"]["code"]
                    .as_str()
                    .map_or_else(|| status.to_string(), str::to_string)
            };
            *report.codes.entry(code.clone()).or_default() += 1;
            if let Some(id) = answer["id"].as_str() {
                report.ids.push(id.to_string());
                if code == "placed" {
                    self.booked.fetch_add(gpus, Ordering::Relaxed);
                    self.live.push_back((id.to_string(), gpus));
                }
            }
        }
        Ok(report)
    }
}

/// Latency of the reads a dashboard or a tenant makes, and of a create's plan, 50 of each,
/// one at a time.
async fn reads(tenant: &Api, admin: &Api, pool: &str, ids: &[String]) -> anyhow::Result<()> {
    let graphql = json!({ "query": "{ nodes(orgId: \"acme\", first: 100) { edges { node { id units { id } } } } }" });
    let id = ids.first().cloned().unwrap_or_default();
    let plan = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 4, "topology": "nvlink-all" }],
                       "duration": "2h", "idempotencyKey": "bench-plan" });
    let reads: [(&str, &Api, &str, &str, Value); 5] = [
        (
            "get",
            tenant,
            "POST",
            "/api/compute/reservations/get",
            json!({ "tenantId": "tenant-a", "reservationId": id }),
        ),
        (
            "list (50)",
            tenant,
            "POST",
            "/api/compute/reservations/list",
            json!({ "tenantId": "tenant-a" }),
        ),
        (
            "catalog",
            tenant,
            "GET",
            "/v1/orgs/tenant-a/catalog?limit=100",
            Value::Null,
        ),
        ("GraphQL nodes (100)", admin, "POST", "/graphql", graphql),
        (
            "plan (4 GPUs)",
            tenant,
            "POST",
            "/api/compute/reservations/plan",
            plan,
        ),
    ];
    for (name, api, method, path, body) in reads {
        let mut latencies = Vec::new();
        for _ in 0..50 {
            let sent = Instant::now();
            let (status, answer) = api.call(method, path, body.clone()).await?;
            if !status.is_success() {
                bail!("{name}: {status} {answer}");
            }
            latencies.push(sent.elapsed());
        }
        println!(
            "  {name}: p50 {}, p99 {}",
            ms(percentile(&mut latencies, 0.50)),
            ms(percentile(&mut latencies, 0.99))
        );
    }
    Ok(())
}

/// A create one at a time, 50 placed and 50 that wait (8 GPUs in one NVLink domain, which
/// no node has): latency and server CPU each. A create that waits does what a pending
/// retry does (the decision over the whole pool, why it waits and until when, the write)
/// and more (the draft, the quota charge).
async fn alone(server: &Server, tenant: &Api, pool: &str) -> anyhow::Result<()> {
    for (name, topology) in [
        ("placed (1 GPU)", "any"),
        ("waits (8 GPUs nvlink-all)", "nvlink-all"),
    ] {
        let gpus = if topology == "any" { 1 } else { 8 };
        let mut latencies = Vec::new();
        let mut cpu = 0.0;
        for i in 0..50 {
            let body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": gpus, "topology": topology }],
                               "duration": "1h", "idempotencyKey": format!("alone-{topology}-{i}") });
            let (created, took, used) = timed_create(server, tenant, body).await?;
            latencies.push(took);
            cpu += used;
            let state = created["state"].as_str().unwrap_or_default();
            if state
                != (if topology == "any" {
                    "placed"
                } else {
                    "pending"
                })
            {
                bail!("create {name}: {created}");
            }
            // Released at once (a pending one is cancelled; a placed one may have become
            // active meanwhile), so that the next create finds the pool as this one did.
            let release = json!({ "tenantId": "tenant-a", "reservationId": created["id"] });
            tenant
                .send("POST", "/api/compute/reservations/release", release)
                .await?;
        }
        println!(
            "  create one at a time, {name}: p50 {}, p99 {}, server CPU {:.2} ms each",
            ms(percentile(&mut latencies, 0.50)),
            ms(percentile(&mut latencies, 0.99)),
            cpu * 1000.0 / 50.0
        );
    }
    Ok(())
}

/// Fills the pool (8 GPUs a create until none fits, then 1 GPU), then measures, one at a
/// time, 50 creates of 1 GPU that wait there: every node could take one were it not
/// booked, so each decision reads every node. Leaves them pending and waits for the
/// reconciler to try each again (every 30 s): the time one retry takes, read off
/// `orl_pending_retry_seconds_total` over `orl_pending_retries_total`, and the server's CPU
/// over the wait (its idle reconciler passes and two scrapes included). Releases them at
/// the end.
async fn full(
    server: &Server,
    tenant: &Api,
    admin: &Api,
    pool: &str,
    clients: usize,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut filled = 0;
    for gpus in [8, 1] {
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (api, pool) = (tenant.clone(), pool.to_string());
            tasks.push(tokio::spawn(async move {
                let mut placed = 0;
                loop {
                    let body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": gpus }],
                                       "duration": "2h", "idempotencyKey": format!("fill-{gpus}-{c}-{placed}") });
                    let created = api.send("POST", "/api/compute/reservations/create", body).await?;
                    if created["state"] != "placed" {
                        let release = json!({ "tenantId": "tenant-a", "reservationId": created["id"] });
                        api.send("POST", "/api/compute/reservations/release", release).await?;
                        return anyhow::Ok(placed);
                    }
                    placed += 1;
                }
            }));
        }
        for task in tasks {
            filled += task.await??;
        }
    }
    println!(
        "  filled the pool: {filled} more creates in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut latencies = Vec::new();
    let mut cpu = 0.0;
    let mut waiting = Vec::new();
    for i in 0..50 {
        let body = json!({ "tenantId": "tenant-a", "poolId": pool, "devices": [{ "class": "gpu", "count": 1 }],
                           "duration": "1h", "idempotencyKey": format!("full-{i}") });
        let (created, took, used) = timed_create(server, tenant, body).await?;
        latencies.push(took);
        cpu += used;
        if created["state"] != "pending" {
            bail!("a create in the full pool: {created}");
        }
        waiting.push(created["id"].clone());
    }
    println!(
        "  create one at a time in the full pool, waits (1 GPU): p50 {}, p99 {}, server CPU {:.2} ms each",
        ms(percentile(&mut latencies, 0.50)),
        ms(percentile(&mut latencies, 0.99)),
        cpu * 1000.0 / 50.0
    );
    let figures = || async {
        let text = admin.text("/metrics").await?;
        anyhow::Ok((
            sample(&text, "orl_pending_retries_total"),
            sample(&text, "orl_pending_retry_seconds_total"),
        ))
    };
    let (tried_before, seconds_before) = figures().await?;
    let cpu_before = server.cpu_seconds()?;
    let waited = Instant::now();
    // Scraped again only once the last of them is due (a scrape works out every gauge, and
    // the CPU it takes would count against the retries).
    tokio::time::sleep(Duration::from_secs(31)).await;
    let (mut tried, mut seconds) = figures().await?;
    while tried - tried_before < waiting.len() as f64 && waited.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
        (tried, seconds) = figures().await?;
    }
    let cpu = server.cpu_seconds()? - cpu_before;
    let tried = tried - tried_before;
    if tried < waiting.len() as f64 {
        bail!(
            "the reconciler tried {tried} of {} pending reservations again within 60 s",
            waiting.len()
        );
    }
    println!(
        "  pending retry in the full pool (1 GPU): {:.2} ms each ({tried} tried), server CPU {:.2} ms each over the {:.0} s wait",
        (seconds - seconds_before) * 1000.0 / tried,
        cpu * 1000.0 / tried,
        waited.elapsed().as_secs_f64()
    );
    for id in waiting {
        let release = json!({ "tenantId": "tenant-a", "reservationId": id });
        tenant
            .send("POST", "/api/compute/reservations/release", release)
            .await?;
    }
    Ok(())
}

/// The value of the sample `name` (without labels) in the metrics `text`; 0 if absent.
fn sample(text: &str, name: &str) -> f64 {
    (text.lines())
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The server's write-turn counters (`orl_write_turn_*`, `orl_write_group_commits_total`).
struct WriteTurn {
    held: f64,
    writes: f64,
    commits: f64,
}

impl WriteTurn {
    async fn read(admin: &Api) -> anyhow::Result<WriteTurn> {
        let text = admin.text("/metrics").await?;
        Ok(WriteTurn {
            held: sample(&text, "orl_write_turn_held_seconds_total"),
            writes: sample(&text, "orl_write_turn_writes_total"),
            commits: sample(&text, "orl_write_group_commits_total"),
        })
    }

    fn since(&self, before: &WriteTurn) -> WriteTurn {
        WriteTurn {
            held: self.held - before.held,
            writes: self.writes - before.writes,
            commits: self.commits - before.commits,
        }
    }
}

/// One create: its answer, its latency and the server CPU it took (seconds).
async fn timed_create(
    server: &Server,
    tenant: &Api,
    body: Value,
) -> anyhow::Result<(Value, Duration, f64)> {
    let cpu_before = server.cpu_seconds()?;
    let sent = Instant::now();
    let created = tenant
        .send("POST", "/api/compute/reservations/create", body)
        .await?;
    let took = sent.elapsed();
    Ok((created, took, server.cpu_seconds()? - cpu_before))
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// A JSON client calling as one key.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Api {
    fn with_key(&self, key: &str) -> Api {
        Api {
            key: key.to_string(),
            ..self.clone()
        }
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Value,
    ) -> anyhow::Result<(reqwest::StatusCode, Value)> {
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key);
        if !body.is_null() {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// The text `path` answers to a GET, failing on anything but success.
    async fn text(&self, path: &str) -> anyhow::Result<String> {
        let response = (self.http.get(format!("{}{path}", self.base)))
            .bearer_auth(&self.key)
            .send()
            .await?
            .error_for_status()?;
        Ok(response.text().await?)
    }

    /// As [`Api::call`], failing on anything but success.
    async fn send(&self, method: &str, path: &str, body: Value) -> anyhow::Result<Value> {
        let (status, answer) = self.call(method, path, body).await?;
        if !status.is_success() {
            bail!("{method} {path}: {status} {answer}");
        }
        Ok(answer)
    }
}

/// A child `orl serve` on a fresh database.
struct Server {
    child: Child,
    url: String,
    admin: String,
    _data_dir: tempfile::TempDir,
    database: Option<(String, String)>,
}

impl Server {
    async fn start(postgres: Option<&str>) -> anyhow::Result<Server> {
        let data_dir = tempfile::tempdir()?;
        let admin = format!("or_bench{}", ulid::Ulid::new().to_string().to_lowercase());
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .env("ORL_ADMIN_KEY", &admin)
            .env("ORL_LOG", "error")
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut database = None;
        if let Some(url) = postgres {
            use sqlx::Connection as _;
            let name = format!("orl_bench_{}", ulid::Ulid::new().to_string().to_lowercase());
            let mut conn = sqlx::PgConnection::connect(url).await?;
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut conn)
                .await?;
            let base = url.rsplit_once('/').context("a database URL")?.0;
            command.args(["--database-url", &format!("{base}/{name}")]);
            database = Some((url.to_string(), name));
        }
        let mut child = command.spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let url = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("orl listening on ") {
                    return Ok(url.to_string());
                }
            }
            bail!("orl serve exited before listening")
        })
        .await
        .context("orl serve did not start within 120 s")??;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Server {
            child,
            url,
            admin,
            _data_dir: data_dir,
            database,
        })
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("the server exited")
    }

    /// User and system CPU time the server used so far.
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()?))?;
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .context("/proc stat")?
            .1
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
        Ok(ticks / 100.0)
    }

    fn resident_mib(&self) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?))?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .context("VmRSS")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kib / 1024.0)
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
        if let Some((url, name)) = self.database.take() {
            use sqlx::Connection as _;
            if let Ok(mut conn) = sqlx::PgConnection::connect(&url).await {
                let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await;
            }
        }
    }
}
