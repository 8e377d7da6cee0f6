//! `orl serve`: open the database, bootstrap it, and serve until SIGINT/SIGTERM.

mod connections;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use tokio::net::TcpListener;

use crate::clock::Clock;
use crate::iam::keys::{self, Grant};
use crate::iam::{OPS_ORG, Principal, Role};
use crate::store::Store;
use crate::{App, api, audit, demo, ids};

/// Options of `orl serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Directory for the SQLite database and the generated admin key.
    #[arg(long, default_value = "./orl-data")]
    pub data_dir: PathBuf,
    /// `postgres://…` to use PostgreSQL instead of the embedded SQLite database.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Seed a provider with NVLink nodes, a tenant and keys, and print what to try.
    #[arg(long)]
    pub demo: bool,
    /// The providers' share of what tenants are charged, in basis points (8000 = 80 %).
    #[arg(long, env = "ORL_PROVIDER_SHARE_BPS",
          default_value_t = crate::earnings::DEFAULT_PROVIDER_SHARE_BPS,
          value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub provider_share_bps: u32,
    /// How long a node whose agent has reported may stay silent (no inventory report, no
    /// agent call) before it is lost: its reservations fail and it gets no new placements.
    #[arg(long, env = "ORL_NODE_LOST_AFTER", default_value = "5m")]
    pub node_lost_after: humantime::Duration,
    /// How long a client may take to send a request's head, counted from when the server is
    /// ready for it: a new connection, or a kept-alive one after its last response (so it
    /// is also how long a connection may sit idle between requests).
    #[arg(long, env = "ORL_HEADER_TIMEOUT", default_value = "10s")]
    pub header_timeout: humantime::Duration,
    /// How long a client may take to send a request's body once its head has arrived;
    /// past it the answer is 408 and the connection is closed. Responses that stream
    /// (events, WebSocket) are not bound by it.
    #[arg(long, env = "ORL_BODY_TIMEOUT", default_value = "60s")]
    pub body_timeout: humantime::Duration,
    /// Most connections served at once; further ones wait in the listen queue.
    #[arg(long, env = "ORL_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Most PostgreSQL connections this replica opens for requests and background work (the
    /// capacity view and the event stream hold a few more of their own). Size it so that
    /// the replicas together stay below the server's `max_connections`.
    #[arg(long, env = "ORL_DATABASE_CONNECTIONS", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(2..))]
    pub database_connections: u32,
    /// How log lines on stderr are written: `text` for people, `json` for log collectors
    /// (one JSON object per line).
    #[arg(long, env = "ORL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The format of the server's log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured when stderr is a terminal.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields, and the span it happened in.
    Json,
}

/// Sends the server's logs to stderr in `format`, at the level `ORL_LOG` sets (`info`
/// unless set).
pub fn init_logs(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("ORL_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().flatten_event(true).with_ansi(false).init(),
    }
}

/// Environment variable holding the bootstrap admin key (`or_…`).
pub const ADMIN_KEY_ENV: &str = "ORL_ADMIN_KEY";
/// Environment variable that replaces the wall clock with a manual one starting at the
/// given epoch milliseconds, moved through `POST /v1/clock`. For tests and rehearsals.
pub const TEST_CLOCK_ENV: &str = "ORL_TEST_CLOCK_MS";

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let admin_key = std::env::var(ADMIN_KEY_ENV).ok().filter(|k| !k.is_empty());
    if let Some(key) = &admin_key
        && (!key.starts_with("or_") || key.len() < 20 || key.len() > 200)
    {
        bail!("{ADMIN_KEY_ENV} must be an or_… key of 20-200 characters");
    }
    let clock = match std::env::var(TEST_CLOCK_ENV) {
        Ok(ms) => Clock::manual(
            ms.parse()
                .with_context(|| format!("{TEST_CLOCK_ENV}={ms}"))?,
        ),
        Err(_) => Clock::System,
    };
    create_private_dir(&args.data_dir)?;
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| Store::sqlite_url(&args.data_dir));
    let store = Store::open(&url, args.database_connections).await?;
    tracing::info!(backend = ?store.backend(), "database ready");
    let policy = crate::policy::PolicyHost::new(&args.data_dir)?;
    let app = App::new(
        store,
        clock,
        policy,
        args.data_dir.clone(),
        args.provider_share_bps,
        i64::try_from(args.node_lost_after.as_millis()).unwrap_or(i64::MAX),
    );
    let generated = bootstrap(&app, admin_key.as_deref()).await?;
    crate::replicas::join(&app).await?;
    crate::replicas::spawn_heartbeat(app.clone());
    if let Some(secret) = &generated {
        eprintln!(
            "orl: created the platform ops org and its admin key (shown once, also in {}):\n  {secret}",
            admin_key_path(&app.data_dir).display()
        );
    }

    // Listen for SIGINT/SIGTERM before announcing the address: a stop asked for right
    // after start still finishes in-flight work and closes the database.
    let stop = stop_requested().context("listening for SIGINT and SIGTERM")?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr()?;
    if args.demo {
        let admin = admin_key.or(generated).or_else(|| {
            std::fs::read_to_string(admin_key_path(&app.data_dir))
                .ok()
                .map(|k| k.trim().to_string())
        });
        demo::seed_and_print(&app, addr, admin.as_deref()).await?;
    }
    // On a manual clock time only moves through POST /v1/clock, which reconciles itself.
    if !app.clock.is_manual() {
        crate::reconciler::spawn(app.clone(), std::time::Duration::from_secs(1));
    }
    println!("orl listening on http://{addr}");
    std::io::stdout().flush()?;

    let limits = connections::Limits {
        header_timeout: args.header_timeout.into(),
        body_timeout: args.body_timeout.into(),
        max_connections: args.max_connections as usize,
    };
    connections::serve(
        listener,
        api::router(app.clone()),
        limits,
        shutdown_signal(stop),
    )
    .await
    .context("serving HTTP")?;
    if let Err(err) = crate::replicas::leave(&app).await {
        tracing::warn!(error = %err, "taking this replica off the list");
    }
    app.store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// On an empty database: creates the ops org and its admin key, in one transaction.
/// Returns the secret when it was generated here. Several replicas starting at once on one
/// PostgreSQL create exactly one ops org; later starts change nothing.
pub async fn bootstrap(app: &App, admin_key: Option<&str>) -> anyhow::Result<Option<String>> {
    let now = app.now_ms();
    let mut tx = app.store.begin().await?;
    let created = sqlx::query(
        "INSERT INTO orgs (id, name, created_at) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
    )
    .bind(OPS_ORG)
    .bind("Platform operations")
    .bind(now)
    .execute(&mut **tx)
    .await?
    .rows_affected()
        == 1;
    if !created {
        return Ok(None);
    }
    let secret = admin_key.map_or_else(ids::new_secret, str::to_string);
    let key = keys::insert(
        &mut tx,
        OPS_ORG,
        Some("bootstrap admin"),
        &Grant::role(Role::Admin),
        &secret,
        None,
        now,
    )
    .await?;
    let system = Principal::system();
    for (action, object_type, object_id) in [
        ("org.create", "org", OPS_ORG),
        ("api-key.create", "api-key", key.id.as_str()),
    ] {
        let entry = audit::Entry {
            org_id: OPS_ORG,
            action,
            object_type,
            object_id,
            reason: Some("bootstrap"),
            details: None,
        };
        audit::record(&mut tx, &system, entry, now).await?;
    }
    tx.commit().await?;
    if admin_key.is_some() {
        return Ok(None);
    }
    write_private_file(&admin_key_path(&app.data_dir), &format!("{secret}\n"))?;
    Ok(Some(secret))
}

pub fn admin_key_path(data_dir: &Path) -> PathBuf {
    data_dir.join("admin.key")
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating data directory {}", dir.display()))
}

/// Writes a secret to a file only its owner can read.
pub fn write_private_file(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

async fn shutdown_signal(stop: impl Future<Output = ()>) {
    stop.await;
    tracing::info!("shutting down: finishing in-flight requests");
}

/// Resolves when the process is asked to stop (SIGINT or SIGTERM) after this call, even
/// before the future is first polled.
fn stop_requested() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {},
            _ = interrupt.recv() => {},
        }
    })
}

/// Resolves when the process is asked to stop (SIGINT or SIGTERM): the server and every
/// open event stream end on it.
pub async fn stopping() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = terminate => {},
    }
}
