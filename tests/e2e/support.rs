//! The harness: a server process per test, on the database it asks for, and a JSON client.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::Connection as _;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::call_log::CallLog;
use crate::exposition::Metrics;

/// The longest a test waits for one answer: well past the longest a request may ask to wait
/// (`wait.timeoutMs`, 30 s), so that a server that hangs fails the call, not the test's clock.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);

/// Runs `$name(Db)` once per database, as `$name::sqlite` and `$name::postgres`.
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name($crate::support::Db::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name($crate::support::Db::Postgres).await
            }
        }
    )*};
}
pub(crate) use on_both_databases;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// The instant every test server's manual clock starts at: 2026-12-01T00:00:00Z.
pub const T0: i64 = 1_796_083_200_000;

/// An hour of the test clock, in milliseconds.
pub const HOUR: i64 = 3_600_000;

/// An RFC 3339 instant `hours` after the test clock's start.
pub fn at(hours: i64) -> String {
    chrono::DateTime::from_timestamp_millis(T0 + hours * HOUR)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The PostgreSQL server tests create their databases on.
fn postgres_admin_url() -> String {
    std::env::var("ORL_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// A database that lives as long as the test.
pub struct Database {
    pub url: Option<String>,
    postgres_name: Option<String>,
}

impl Database {
    pub async fn create(db: Db) -> Database {
        match db {
            Db::Sqlite => Database {
                url: None,
                postgres_name: None,
            },
            Db::Postgres => {
                let name = format!("orl_e2e_{}", ulid::Ulid::new().to_string().to_lowercase());
                let mut conn = sqlx::PgConnection::connect(&postgres_admin_url())
                    .await
                    .expect("PostgreSQL at 127.0.0.1:5432 (set ORL_TEST_POSTGRES_URL)");
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                let admin = postgres_admin_url();
                let base = admin.rsplit_once('/').unwrap().0;
                Database {
                    url: Some(format!("{base}/{name}")),
                    postgres_name: Some(name),
                }
            }
        }
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        if let Some(name) = self.postgres_name.take() {
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    if let Ok(mut conn) = sqlx::PgConnection::connect(&postgres_admin_url()).await {
                        let _ =
                            sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                                .execute(&mut conn)
                                .await;
                    }
                });
            })
            .join()
            .ok();
        }
    }
}

/// A connection to the database at `url`.
pub async fn connect(url: &str) -> sqlx::AnyConnection {
    sqlx::any::install_default_drivers();
    sqlx::AnyConnection::connect(url).await.unwrap()
}

/// How to start a server.
pub struct Options {
    pub admin_key: Option<String>,
    pub demo: bool,
    /// More arguments for `orl serve`.
    pub args: Vec<String>,
    /// More environment variables for `orl serve`.
    pub env: Vec<(String, String)>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            admin_key: Some(random_key()),
            demo: false,
            args: Vec::new(),
            env: Vec::new(),
        }
    }
}

pub fn random_key() -> String {
    format!("or_test{}", ulid::Ulid::new().to_string().to_lowercase())
}

/// A running `orl serve`.
pub struct Server {
    child: Option<Child>,
    pub url: String,
    /// The ops admin key (given or generated).
    pub admin: String,
    /// Everything the server printed to stdout before it started listening.
    pub banner: String,
    pub data_dir: TempDir,
    pub db: Database,
    /// The successful mutating calls of this server's clients (shared with its replicas).
    pub calls: CallLog,
}

impl Server {
    pub async fn start(db: Db) -> Server {
        Server::start_with(db, Options::default()).await
    }

    pub async fn start_with(db: Db, options: Options) -> Server {
        let database = Database::create(db).await;
        let data_dir = tempfile::tempdir().unwrap();
        let (child, url, banner) = spawn(data_dir.path(), &database, &options).await;
        let admin = match &options.admin_key {
            Some(key) => key.clone(),
            None => std::fs::read_to_string(data_dir.path().join("admin.key"))
                .expect("admin.key written at bootstrap")
                .trim()
                .to_string(),
        };
        Server {
            child: Some(child),
            url,
            admin,
            banner,
            data_dir,
            db: database,
            calls: CallLog::default(),
        }
    }

    /// Another `orl serve` on this server's PostgreSQL database, with its own data
    /// directory and manual clock (a replica: the database outlives it).
    pub async fn replica(&self) -> Server {
        assert!(
            self.db.url.is_some(),
            "replicas share a PostgreSQL database"
        );
        let database = Database {
            url: self.db.url.clone(),
            postgres_name: None,
        };
        let data_dir = tempfile::tempdir().unwrap();
        let options = Options {
            admin_key: Some(self.admin.clone()),
            // Replicas of parallel tests share one PostgreSQL server's connection slots.
            args: vec!["--database-connections".into(), "6".into()],
            ..Options::default()
        };
        let (child, url, banner) = spawn(data_dir.path(), &database, &options).await;
        Server {
            child: Some(child),
            url,
            admin: self.admin.clone(),
            banner,
            data_dir,
            db: database,
            calls: self.calls.clone(),
        }
    }

    /// A connection to the server's database, to check what the API does not show.
    pub async fn database(&self) -> sqlx::AnyConnection {
        connect(&self.database_url()).await
    }

    /// The URL of the server's database.
    pub fn database_url(&self) -> String {
        self.db.url.clone().unwrap_or_else(|| {
            format!("sqlite://{}", self.data_dir.path().join("orl.db").display())
        })
    }

    /// Whether the database is this server's own, not one it serves as a replica.
    fn owns_database(&self) -> bool {
        self.db.url.is_none() || self.db.postgres_name.is_some()
    }

    /// Stops the server with SIGTERM and waits for it; returns whether it exited cleanly.
    pub async fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let pid = child.id().unwrap().to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
            .await
            .expect("server stops within 20 s of SIGTERM")
            .unwrap();
        status.success()
    }

    /// Stops and starts the server on the same data directory and database.
    /// Stops the server and starts `orl serve` again with `options` on its data directory
    /// and database, expecting it to refuse: it exits with a failure before listening.
    /// Answers what it wrote to stderr. The server stays stopped.
    pub async fn restart_refused(&mut self, options: Options) -> String {
        assert!(self.stop().await, "server exits cleanly on SIGTERM");
        let mut command = serve_command(self.data_dir.path(), &self.db, &options);
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let output = tokio::time::timeout(Duration::from_secs(60), command.output())
            .await
            .expect("orl serve exits")
            .expect("running orl serve");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "orl serve started: {stdout}");
        assert!(!stdout.contains("orl listening"), "{stdout}");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    pub async fn restart_with(&mut self, options: Options) {
        assert!(self.stop().await, "server exits cleanly on SIGTERM");
        let (child, url, banner) = spawn(self.data_dir.path(), &self.db, &options).await;
        self.child = Some(child);
        self.url = url;
        self.banner = banner;
    }

    /// A client calling as `key`.
    pub fn as_key(&self, key: &str) -> Api {
        Api {
            http: http_client(),
            base: self.url.clone(),
            key: Some(key.to_string()),
            log: self.calls.clone(),
        }
    }

    pub fn admin(&self) -> Api {
        self.as_key(&self.admin)
    }

    pub fn anonymous(&self) -> Api {
        Api {
            http: http_client(),
            base: self.url.clone(),
            key: None,
            log: self.calls.clone(),
        }
    }

    /// What the server wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.data_dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Creates an org and an API key of `role` in it; returns the key's client.
    pub async fn org_with_key(&self, org: &str, role: &str) -> Api {
        let admin = self.admin();
        let (status, body) = admin
            .post("/v1/orgs", json!({ "id": org, "name": org }))
            .await;
        assert!(
            status == StatusCode::CREATED || status == StatusCode::CONFLICT,
            "{body}"
        );
        self.as_key(&self.key_in(org, json!({ "role": role })).await)
    }

    /// Creates a key in `org` (as the ops admin) and returns its secret.
    pub async fn key_in(&self, org: &str, body: Value) -> String {
        let (status, key) = self
            .admin()
            .post(&format!("/v1/orgs/{org}/api-keys"), body)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{key}");
        key["key"].as_str().unwrap().to_string()
    }

    /// Scrapes `/metrics`.
    pub async fn metrics(&self) -> Metrics {
        let (status, text) = self.anonymous().get("/metrics").await;
        assert_eq!(status, StatusCode::OK, "{text}");
        Metrics::parse(text.as_str().unwrap().to_string())
    }

    /// How many pending reservations this server has tried to place again.
    pub async fn pending_retries(&self) -> f64 {
        let metrics = self.metrics().await;
        metrics.get("orl_pending_retries_total").unwrap_or(0.0)
    }

    /// Moves the server's manual clock to `ms`.
    pub async fn set_clock(&self, ms: i64) {
        let (status, body) = self.admin().post("/v1/clock", json!({ "nowMs": ms })).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

/// A test's server stops with it, and the server that owns its database (not a replica)
/// then checks every invariant on it ([`crate::invariants::check_database`]): whatever a
/// test did, it must leave the database consistent. A test that already failed is not
/// checked again.
impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        if std::thread::panicking() {
            // What the server logged is shown with the failing test.
            let stderr = self.stderr();
            let mut start = stderr.len().saturating_sub(16_000);
            while !stderr.is_char_boundary(start) {
                start += 1;
            }
            let tail = &stderr[start..];
            eprintln!("--- {} stderr (its end) ---\n{tail}", self.url);
            return;
        }
        if !self.owns_database() {
            return;
        }
        let url = self.database_url();
        let calls = self.calls.calls();
        let checked = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(crate::invariants::check_database(&url, &calls))
        })
        .join();
        if let Err(panic) = checked {
            std::panic::resume_unwind(panic);
        }
    }
}

/// `orl serve` on `data_dir` and `db` with `options`, on a free port of the test clock.
fn serve_command(data_dir: &Path, db: &Database, options: &Options) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_orl"));
    command
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env_remove("DATABASE_URL")
        .env_remove("ORL_ADMIN_KEY")
        .env("ORL_TEST_CLOCK_MS", T0.to_string())
        .env("ORL_LOG", "warn")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(url) = &db.url {
        command.args(["--database-url", url]);
    }
    if let Some(key) = &options.admin_key {
        command.env("ORL_ADMIN_KEY", key);
    }
    if options.demo {
        command.arg("--demo");
    }
    command.args(&options.args);
    command.envs(options.env.iter().map(|(k, v)| (k, v)));
    command
}

async fn spawn(data_dir: &Path, db: &Database, options: &Options) -> (Child, String, String) {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join("stderr.log"))
        .unwrap();
    let mut command = serve_command(data_dir, db, options);
    command.stdout(Stdio::piped()).stderr(Stdio::from(stderr));
    let mut child = command.spawn().expect("spawning orl");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut banner = String::new();
    let url = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(url) = line.strip_prefix("orl listening on ") {
                return url.to_string();
            }
            banner.push_str(&line);
            banner.push('\n');
        }
        panic!(
            "orl exited before listening: {}",
            std::fs::read_to_string(data_dir.join("stderr.log")).unwrap_or_default()
        );
    })
    .await
    .expect("orl starts listening within 60 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, url, banner)
}

/// An HTTP client whose every request gives up after [`REQUEST_TIMEOUT`].
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("an HTTP client")
}

/// A JSON client of one server, calling as one key (or none).
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
    log: CallLog,
}

impl Api {
    /// The same caller against `server` as it is now (a restarted server listens on a new
    /// port).
    pub fn on(&self, server: &Server) -> Api {
        Api {
            http: self.http.clone(),
            base: server.url.clone(),
            key: self.key.clone(),
            log: server.calls.clone(),
        }
    }
}

impl Api {
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::DELETE, path, None).await
    }

    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let body = body.map(|b| b.to_string().into_bytes());
        self.raw(method, path, body, Some("application/json")).await
    }

    /// Sends `body` as it is, with `content_type` when given.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: Option<&str>,
    ) -> (StatusCode, Value) {
        self.send(method.clone(), path, body, content_type)
            .await
            .unwrap_or_else(|err| panic!("{method} {path} reaches the server: {err:?}"))
    }

    /// As [`Api::raw`], but a transport failure is `None` (a server may answer an
    /// oversized body and close the connection while the client is still sending it).
    pub async fn try_raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: Option<&str>,
    ) -> Option<(StatusCode, Value)> {
        self.send(method, path, body, content_type).await.ok()
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        content_type: Option<&str>,
    ) -> reqwest::Result<(StatusCode, Value)> {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        let sent = body.clone();
        if let Some(body) = body {
            request = request.body(body);
            if let Some(ct) = content_type {
                request = request.header("content-type", ct);
            }
        }
        let response = request.send().await?;
        let status = response.status();
        let text = response.text().await?;
        let value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        self.log
            .record(&method, path, status, sent.as_deref(), &value);
        Ok((status, value))
    }

    /// Asserts the answer is the error envelope with `code`, and returns its message.
    pub async fn expect_error(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        status: StatusCode,
        code: &str,
    ) -> String {
        let (got, value) = self.call(method.clone(), path, body).await;
        assert_error(got, &value, status, code);
        value["error"]["message"].as_str().unwrap().to_string()
    }
}

/// Waits (up to 20 s) until `file` exists: the mark a server held at a test gate leaves
/// (`<gate>.reached`).
pub async fn reached(file: &std::path::Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !file.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing reached the gate ({})",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts `(status, body)` is the error envelope with `code`.
#[track_caller]
pub fn assert_error(status: StatusCode, body: &Value, expected: StatusCode, code: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

/// A node inventory of `gpus` H100s split over NVLink domains of four.
pub fn h100_inventory(node: &str, gpus: usize) -> Value {
    let units: Vec<Value> = (0..gpus)
        .map(|g| {
            json!({
                "id": format!("{node}-gpu{g}"), "class": "vfio-group", "deviceClass": "gpu",
                "model": "H100-SXM5-80GB", "memoryGiB": 80, "nvlinkDomain": format!("nvl{}", g / 4),
                "sellable": true,
            })
        })
        .collect();
    json!({
        "region": "eu-west-1",
        "host": { "vcpu": 224, "memoryGiB": 2048, "hugepages1Gi": 512 },
        "units": units,
    })
}

/// A pool of `acme`'s nodes for each list of `pools` (the nodes registered already), each
/// offered to `tenant-a` with a quota of 64 GPUs; answers the pools' ids in order.
pub async fn pools_for_tenant_a(server: &Server, pools: &[&[&str]]) -> Vec<String> {
    let mut ids = Vec::new();
    for nodes in pools {
        let (status, pool) = server
            .admin()
            .post(
                "/v1/pools",
                json!({ "name": "p", "ownerOrgId": "acme", "nodeIds": nodes }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{pool}");
        let id = pool["id"].as_str().unwrap().to_string();
        let (status, offer) = server
            .admin()
            .post(
                &format!("/v1/pools/{id}/offers"),
                json!({ "tenantId": "tenant-a", "quota": { "gpu": 64 } }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{offer}");
        ids.push(id);
    }
    ids
}

/// Registers `node` with `gpus` H100s for `org` as `api`, expecting success.
pub async fn register_node(api: &Api, org: &str, node: &str, gpus: usize) -> Value {
    report_node(api, org, node, h100_inventory(node, gpus)).await
}

/// `org` reports `inventory` for `node` (registering it, or reporting it again).
pub async fn report_node(api: &Api, org: &str, node: &str, inventory: Value) -> Value {
    let (status, body) = api
        .put(&format!("/v1/orgs/{org}/provider/nodes/{node}"), inventory)
        .await;
    assert!(status.is_success(), "{status} {body}");
    body
}

/// Every page of the REST list `path` at `limit`, following each answer's `cursor`, as the
/// ids (`field`) of each page's items. Each page but the last must be full and carry a
/// cursor, the id of its last item; the last carries none.
pub async fn pages(api: &Api, path: &str, limit: usize, field: &str) -> Vec<Vec<String>> {
    let separator = if path.contains('?') { '&' } else { '?' };
    let mut pages = Vec::new();
    let mut next = format!("{path}{separator}limit={limit}");
    loop {
        let (status, page) = api.get(&next).await;
        assert_eq!(status, StatusCode::OK, "{next}: {page}");
        let ids: Vec<String> = page["items"]
            .as_array()
            .unwrap_or_else(|| panic!("{next} answers no items: {page}"))
            .iter()
            .map(|item| item[field].as_str().unwrap().to_string())
            .collect();
        assert!(ids.len() <= limit, "{next}: {page}");
        pages.push(ids);
        match page.get("cursor") {
            None => break,
            Some(cursor) => {
                let cursor = cursor.as_str().unwrap();
                assert_eq!(
                    pages.last().unwrap().len(),
                    limit,
                    "a page with a cursor is full"
                );
                assert_eq!(cursor, pages.last().unwrap().last().unwrap(), "{page}");
                next = format!("{path}{separator}limit={limit}&cursor={cursor}");
            }
        }
        assert!(pages.len() <= 20, "the cursor must end: {pages:?}");
    }
    pages
}

/// The names of the parameters `/openapi.json` documents for `GET path`, in order.
pub async fn list_params(server: &Server, path: &str) -> Vec<String> {
    let (_, doc) = server.anonymous().get("/openapi.json").await;
    let list = &doc["paths"][path]["get"];
    list["parameters"]
        .as_array()
        .unwrap_or_else(|| panic!("GET {path} documents no parameters: {list}"))
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

/// The number of audit entries the ops admin can see.
pub async fn audit_count(server: &Server) -> usize {
    let mut count = 0;
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/audit?limit=200&cursor={c}"),
            None => "/v1/audit?limit=200".to_string(),
        };
        let (status, page) = server.admin().get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        count += page["items"].as_array().unwrap().len();
        match page["cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return count,
        }
    }
}

/// The id a create with `key` by the tenant's first key was given (read from the
/// database, for drafts and refused requests the API does not show).
pub async fn reservation_id_of(server: &Server, tenant: &str, key: &str) -> String {
    let mut conn = server.database().await;
    sqlx::query_scalar(
        "SELECT id FROM compute_reservations WHERE tenant_id = $1 AND idempotency_key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_one(&mut conn)
    .await
    .unwrap()
}

/// Builds WebAssembly components from source once per test run and returns the path of
/// `file` (e.g. `trap.wasm`): the spread example from the root workspace, the hostile
/// fixtures from `tests/components`.
pub fn component(file: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf();
        let target = root.join("target").join("e2e-components");
        let build = |manifest: &Path, extra: &[&str]| {
            let status = std::process::Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--release",
                    "--target",
                    "wasm32-wasip2",
                    "--manifest-path",
                ])
                .arg(manifest)
                .arg("--target-dir")
                .arg(&target)
                .args(extra)
                .env_remove("RUSTFLAGS")
                .env_remove("CARGO_ENCODED_RUSTFLAGS")
                .status()
                .expect("running cargo");
            assert!(
                status.success(),
                "building components from {}",
                manifest.display()
            );
        };
        build(&root.join("Cargo.toml"), &["-p", "orl-placer-spread"]);
        build(&root.join("tests/components/Cargo.toml"), &["--workspace"]);
        target.join("wasm32-wasip2/release")
    });
    let path = dir.join(file);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// A `graphql-transport-ws` client of `/graphql`.
pub struct Socket {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Socket {
    /// Connects and initialises with `init` as the `connection_init` payload; returns the
    /// server's answer to it (`connection_ack`, or the close that refused it).
    pub async fn open(server: &Server, init: Value) -> (Socket, Option<Value>) {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let url = format!("{}/graphql", server.url.replacen("http", "ws", 1));
        let mut request = url.into_client_request().unwrap();
        request.headers_mut().insert(
            "sec-websocket-protocol",
            "graphql-transport-ws".parse().unwrap(),
        );
        let (ws, _) = tokio_tungstenite::connect_async(request)
            .await
            .expect("WebSocket upgrade");
        let mut socket = Socket { ws };
        socket
            .send(json!({ "type": "connection_init", "payload": init }))
            .await;
        let answer = socket.next().await;
        (socket, answer)
    }

    pub async fn send(&mut self, message: Value) {
        use futures::SinkExt as _;
        self.ws
            .send(tokio_tungstenite::tungstenite::Message::text(
                message.to_string(),
            ))
            .await
            .unwrap();
    }

    /// The next protocol message (pings answered), or `None` once the server closed;
    /// nothing within 15 s fails the test.
    pub async fn next(&mut self) -> Option<Value> {
        let message = self.next_within(Duration::from_secs(15)).await;
        assert_ne!(message, Some(Value::Null), "a message within 15 s");
        message
    }

    /// The next protocol message within `wait` (pings answered): `Some(Value::Null)` when
    /// nothing came, `None` once the server closed.
    pub async fn next_within(&mut self, wait: Duration) -> Option<Value> {
        use futures::StreamExt as _;
        use tokio_tungstenite::tungstenite::Message;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let message = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return Some(Value::Null),
                Ok(message) => message?.ok()?,
            };
            match message {
                Message::Text(text) => {
                    let value: Value = serde_json::from_str(text.as_str()).unwrap();
                    if value["type"] == "ping" {
                        self.send(json!({ "type": "pong" })).await;
                        continue;
                    }
                    return Some(value);
                }
                Message::Close(_) => return None,
                _ => {}
            }
        }
    }

    pub async fn subscribe(&mut self, id: &str, query: &str) {
        self.send(json!({ "id": id, "type": "subscribe", "payload": { "query": query } }))
            .await;
    }

    /// The `data` of the next `next` message.
    pub async fn event(&mut self) -> Value {
        let message = self.next().await.expect("the subscription goes on");
        assert_eq!(message["type"], "next", "{message}");
        message["payload"]["data"].clone()
    }
}
