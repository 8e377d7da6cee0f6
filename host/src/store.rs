//! The database: SQLite (embedded default) or PostgreSQL, behind one sqlx `Any` pool and
//! one dialect of SQL (`$n` placeholders, epoch-millisecond BIGINTs, JSON as TEXT).
//!
//! Writes go through [`Store::begin`]. On PostgreSQL that is a plain transaction and the
//! database's constraints arbitrate between replicas. On SQLite it also takes the process's
//! write lock first, so every check-then-write transaction runs alone: SQLite has one
//! writer anyway, and serializing in the process avoids `SQLITE_BUSY` upgrade failures.
//! Those transactions all run on one connection of their own, whose page cache stays
//! valid from one to the next (a connection drops its cache whenever another commits).

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{Any, AnyConnection, AnyPool, Executor as _, Transaction};
use tokio::sync::{Mutex, OwnedMutexGuard};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// What the SQLite writer's connection sets beyond what every connection does.
const WRITER_PRAGMAS: &str = "PRAGMA temp_store = MEMORY;";

/// Which database the store talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A connection pool plus what is needed to write safely on its backend.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    /// Where write transactions run: on SQLite one connection, on PostgreSQL `pool`.
    writer: AnyPool,
    backend: Backend,
    sqlite_writer: Arc<Mutex<()>>,
    commits: Commits,
}

/// How many write transactions this process has committed (or tried to commit). On SQLite,
/// whose one writer is this process, a reader that saw the count unchanged since its last
/// look knows the database is unchanged too.
#[derive(Clone, Default)]
pub struct Commits(Arc<AtomicU64>);

impl Commits {
    /// The count so far. Read it before reading what it vouches for.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// A write transaction. Dropping it without [`Tx::commit`] rolls back.
pub struct Tx {
    tx: Transaction<'static, Any>,
    _writer: Option<OwnedMutexGuard<()>>,
    commits: Commits,
}

impl Store {
    /// Connects to `url` (`sqlite://…` or `postgres://…`) and applies the migrations; on
    /// PostgreSQL the pool holds at most `max_connections`.
    pub async fn open(url: &str, max_connections: u32) -> anyhow::Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            anyhow::bail!("unsupported database URL {url:?}: use sqlite://… or postgres://…");
        };
        let options: AnyConnectOptions = url.parse().context("parsing the database URL")?;
        let sqlite_file = sqlite_file(url).filter(|_| backend == Backend::Sqlite);
        if let Some((path, create)) = &sqlite_file {
            make_private(path, *create)?;
        }
        let sqlite = |max_connections: u32, more: Option<&'static str>| {
            pool_options()
                .max_connections(max_connections)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        // Reads map the file rather than copy pages: each commit empties
                        // the other connections' page caches.
                        conn.execute(
                            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                                 PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000; \
                                 PRAGMA mmap_size = 1073741824;",
                        )
                        .await?;
                        if let Some(more) = more {
                            conn.execute(more).await?;
                        }
                        Ok(())
                    })
                })
        };
        let pool = match backend {
            Backend::Sqlite => sqlite(8, None).connect_with(options.clone()).await,
            Backend::Postgres => {
                pool_options()
                    .max_connections(max_connections)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(options.clone())
                    .await
            }
        }
        .with_context(|| format!("connecting to {}", redact(url)))?;
        let migrator = match backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator.run(&pool).await.context("applying migrations")?;
        if let Some((path, _)) = &sqlite_file {
            // The WAL and shared-memory files now exist too.
            make_private(path, false)?;
        }
        let writer = match &sqlite_file {
            // The writer keeps its statement journal in memory. A create writes under a
            // savepoint in its group's transaction ([`crate::booking::group`]), and SQLite
            // copies each page a savepoint changes into that journal, which otherwise
            // spills to a temporary file past 64 KiB, written and deleted in every group.
            Some(_) => sqlite(1, Some(WRITER_PRAGMAS)).connect_lazy_with(options),
            None => pool.clone(),
        };
        Ok(Store {
            pool,
            writer,
            backend,
            sqlite_writer: Arc::new(Mutex::new(())),
            commits: Commits::default(),
        })
    }

    /// The SQLite URL of the database file in `data_dir`.
    pub fn sqlite_url(data_dir: &Path) -> String {
        format!("sqlite://{}?mode=rwc", data_dir.join("orl.db").display())
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The count of this process's commits ([`Commits`]).
    pub fn commits(&self) -> Commits {
        self.commits.clone()
    }

    /// The row-lock clause for a read that a write in the same transaction depends on:
    /// `FOR UPDATE` on PostgreSQL; nothing on SQLite, whose writers are already serialized.
    pub fn for_update(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "",
            Backend::Postgres => " FOR UPDATE",
        }
    }

    /// The row-lock clause for a row that serializes writers (a pool, a node) without
    /// changing it: `FOR NO KEY UPDATE` on PostgreSQL, which does not wait for the key-share
    /// locks that inserting a row referencing it takes, so a transaction that inserted such
    /// a row can still take it.
    pub fn for_turn(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "",
            Backend::Postgres => " FOR NO KEY UPDATE",
        }
    }

    /// The row-lock clause for a read whose rows must not change until this transaction
    /// commits, while other readers may share them: `FOR SHARE` on PostgreSQL.
    pub fn for_share(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "",
            Backend::Postgres => " FOR SHARE",
        }
    }

    /// A small pool of its own for a reader that must never wait for a connection that a
    /// writer holds while it waits for that reader (the capacity view).
    pub fn reader(&self, max_connections: u32) -> AnyPool {
        pool_options()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(|conn, _| {
                Box::pin(async move {
                    if conn.backend_name().eq_ignore_ascii_case("sqlite") {
                        conn.execute("PRAGMA busy_timeout = 10000; PRAGMA mmap_size = 1073741824;")
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with((*self.pool.connect_options()).clone())
    }

    /// The pool, for reads.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Starts a write transaction (see the module docs for how writers are serialized).
    pub async fn begin(&self) -> sqlx::Result<Tx> {
        let writer = match self.backend {
            Backend::Sqlite => Some(self.sqlite_writer.clone().lock_owned().await),
            Backend::Postgres => None,
        };
        Ok(Tx {
            tx: self.writer.begin().await?,
            _writer: writer,
            commits: self.commits.clone(),
        })
    }

    /// Closes every connection; called on shutdown after the last request finished.
    pub async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }
}

impl Tx {
    pub async fn commit(self) -> sqlx::Result<()> {
        let committed = self.tx.commit().await;
        self.commits.bump();
        committed
    }

    /// Commits, keeping the writer's turn (SQLite) until the returned guard drops: what
    /// runs right after the commit runs before any other write of this process commits.
    pub async fn commit_in_turn(self) -> sqlx::Result<Option<OwnedMutexGuard<()>>> {
        let committed = self.tx.commit().await;
        self.commits.bump();
        committed.map(|()| self._writer)
    }

    /// Rolls back now, releasing the transaction's row locks before anything else runs
    /// (a dropped transaction rolls back only when its connection is next used).
    pub async fn rollback(self) -> sqlx::Result<()> {
        self.tx.rollback().await
    }
}

impl Deref for Tx {
    type Target = Transaction<'static, Any>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

/// Statements sent to the database in one round trip: on SQLite as one multi-statement
/// query, on PostgreSQL as one statement of data-modifying `WITH` parts. Each statement is
/// pushed with its own parameters numbered from `$1`; they are renumbered to follow the
/// statements before. Only `INSERT`, `UPDATE` and `DELETE` without `RETURNING` go in a
/// batch. On PostgreSQL the parts see the same snapshot, so none may depend on another's
/// rows.
pub struct Batch {
    statements: Vec<String>,
    values: Vec<Value>,
    postgres: bool,
    /// A statement without parameters run first, uncounted ([`Batch::opening`]).
    opening: Option<&'static str>,
    /// A scalar query read before the statements ([`Batch::execute_between`]).
    before: Option<String>,
}

/// A parameter of a batched statement.
#[derive(Clone, Debug)]
pub enum Value {
    Int(Option<i64>),
    Text(Option<String>),
    Bool(bool),
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(Some(v))
    }
}

impl From<Option<i64>> for Value {
    fn from(v: Option<i64>) -> Value {
        Value::Int(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(Some(v.to_string()))
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(Some(v.clone()))
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(Some(v))
    }
}

impl From<Option<String>> for Value {
    fn from(v: Option<String>) -> Value {
        Value::Text(v)
    }
}

impl From<Option<&str>> for Value {
    fn from(v: Option<&str>) -> Value {
        Value::Text(v.map(str::to_string))
    }
}

impl From<&Option<String>> for Value {
    fn from(v: &Option<String>) -> Value {
        Value::Text(v.clone())
    }
}

impl Batch {
    /// An empty batch for statements run on `conn`.
    pub fn on(conn: &AnyConnection) -> Batch {
        Batch {
            statements: Vec::new(),
            values: Vec::new(),
            postgres: conn.backend_name() == <sqlx::Postgres as sqlx::Database>::NAME,
            opening: None,
            before: None,
        }
    }

    /// Runs `sql` (a statement without parameters and without a count, such as
    /// `SAVEPOINT`) before the batch's statements, in the same round trip. SQLite only: a
    /// PostgreSQL batch is one statement.
    pub fn open_with(&mut self, sql: &'static str) {
        assert!(!self.postgres, "a PostgreSQL batch is one statement");
        self.opening = Some(sql);
    }

    /// Whether the batch runs on PostgreSQL (for statements written per dialect).
    pub fn postgres(&self) -> bool {
        self.postgres
    }

    /// Whether its statements run one after another, each seeing what the ones before it
    /// wrote, under the database's one writer (SQLite): a check can then be a statement of
    /// the batch, or a condition on one, instead of a round trip before it. A PostgreSQL
    /// batch is one statement with one snapshot.
    pub fn sequential(&self) -> bool {
        !self.postgres
    }

    /// Adds `sql`, whose parameters `$1…` are `values`.
    pub fn push(&mut self, sql: &str, values: Vec<Value>) -> &mut Batch {
        self.statements.push(renumber(sql, self.values.len()));
        self.values.extend(values);
        self
    }

    /// Runs the statements in order and answers how many rows each changed.
    pub async fn execute(self, conn: &mut AnyConnection) -> sqlx::Result<Vec<u64>> {
        Ok(self.run(conn, None).await?.0)
    }

    /// Runs the statements in order, then reads the scalar query `read` (an `i64`), in the
    /// same round trip: answers how many rows each statement changed, and what `read` read
    /// (on PostgreSQL with the statements' snapshot, so it must not read their rows).
    pub async fn execute_then(
        self,
        conn: &mut AnyConnection,
        read: &str,
    ) -> sqlx::Result<(Vec<u64>, i64)> {
        let (counts, read) = self.run(conn, Some(read)).await?;
        Ok((counts, read.expect("asked for")))
    }

    /// Reads the scalar query `before` (an `i64`), runs the statements in order, then reads
    /// `after`, in one round trip: answers how many rows each statement changed and what
    /// the two reads read. SQLite only, whose statements run one after another (a
    /// PostgreSQL batch is one statement with one snapshot).
    pub async fn execute_between(
        mut self,
        conn: &mut AnyConnection,
        before: &str,
        after: &str,
    ) -> sqlx::Result<(Vec<u64>, i64, i64)> {
        assert!(!self.postgres, "a PostgreSQL batch is one statement");
        self.before = Some(format!("SELECT CAST(({before}) AS BIGINT)"));
        let (mut counts, after) = self.run(conn, Some(after)).await?;
        let before = counts.remove(0) as i64;
        Ok((counts, before, after.expect("asked for")))
    }

    async fn run(
        self,
        conn: &mut AnyConnection,
        read: Option<&str>,
    ) -> sqlx::Result<(Vec<u64>, Option<i64>)> {
        // A read before the statements comes back as the first count.
        let n = self.statements.len() + usize::from(self.before.is_some());
        let read_sql = read.map(|r| format!("CAST(({r}) AS BIGINT)"));
        let sql = match (self.postgres, n, &read_sql) {
            (_, 0, None) if self.opening.is_none() => return Ok((Vec::new(), None)),
            // SQLite sums the changes of every statement; the opening one changes none.
            (_, 1, None) => (self.opening.iter().copied())
                .chain([self.statements[0].as_str()])
                .collect::<Vec<_>>()
                .join(";\n"),
            // Each statement's count follows it (rows changed by the statement before).
            (false, _, _) => (self.opening.iter().map(|s| s.to_string()))
                .chain(self.before.clone())
                .chain((self.statements.iter()).map(|s| format!("{s};\nSELECT changes()")))
                .chain(read_sql.iter().map(|r| format!("SELECT {r}")))
                .collect::<Vec<_>>()
                .join(";\n"),
            // The parts run in the order the final select reads them.
            (true, _, _) => {
                let parts: Vec<String> = (self.statements.iter().enumerate())
                    .map(|(i, s)| match s.starts_with("SELECT") {
                        true => format!("s{i} AS ({s})"),
                        false => format!("s{i} AS ({s} RETURNING 1)"),
                    })
                    .collect();
                let columns: Vec<String> = (0..n)
                    .map(|i| format!("CAST((SELECT COUNT(*) FROM s{i}) AS BIGINT)"))
                    .chain(read_sql.clone())
                    .collect();
                format!("WITH {} SELECT {}", parts.join(", "), columns.join(", "))
            }
        };
        let mut query = sqlx::query(&sql);
        for value in self.values {
            query = match value {
                Value::Int(v) => query.bind(v),
                Value::Text(v) => query.bind(v),
                Value::Bool(v) => query.bind(v),
            };
        }
        if n <= 1 && read.is_none() {
            let changed = query.execute(conn).await?.rows_affected();
            return Ok(((n == 1).then_some(changed).into_iter().collect(), None));
        }
        let rows = query.fetch_all(conn).await?;
        let value = |row: &sqlx::any::AnyRow, i: usize| sqlx::Row::get::<i64, _>(row, i);
        Ok(match self.postgres {
            true => (
                (0..n).map(|i| value(&rows[0], i) as u64).collect(),
                read.map(|_| value(&rows[0], n)),
            ),
            false => (
                rows[..n].iter().map(|row| value(row, 0) as u64).collect(),
                read.map(|_| value(&rows[n], 0)),
            ),
        })
    }
}

/// The options every pool starts from. A connection is not pinged before it is handed
/// out: on SQLite a ping is a round trip to the connection's worker thread, on PostgreSQL
/// one to the server, and a create takes connections several times. A connection that
/// broke while idle (a restarted PostgreSQL) fails the one statement that uses it and is
/// closed (sqlx's defaults also close idle connections after 10 minutes and all after 30).
fn pool_options() -> AnyPoolOptions {
    AnyPoolOptions::new().test_before_acquire(false)
}

/// `sql` with each parameter `$n` made `$(n + offset)`.
fn renumber(sql: &str, offset: usize) -> String {
    if offset == 0 {
        return sql.to_string();
    }
    let mut out = String::with_capacity(sql.len() + 8);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            let n: usize = rest[..digits].parse().expect("ascii digits");
            out.push_str(&(n + offset).to_string());
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// Whether `err` is a unique-key violation (the row already exists).
pub fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// `$first, $first+1, …` for `count` bind parameters of an `IN (…)` list.
pub fn placeholders(first: usize, count: usize) -> String {
    (first..first + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `value` as a PostgreSQL string literal, for a statement sent without parameters, in a
/// round trip with others (the simple query protocol): an escape string (`E'…'`), whose
/// meaning does not depend on `standard_conforming_strings`, with every quote and
/// backslash escaped. A NUL, which no PostgreSQL string holds, is dropped.
pub fn literal(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 3);
    quoted.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => quoted.push_str("''"),
            '\\' => quoted.push_str("\\\\"),
            '\0' => {}
            c => quoted.push(c),
        }
    }
    quoted.push('\'');
    quoted
}

/// Whether `err` violates the named constraint: PostgreSQL names it, SQLite triggers
/// raise it as their message.
pub fn violates(err: &sqlx::Error, constraint: &str) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            db.constraint() == Some(constraint) || db.message().contains(constraint)
        }
        _ => false,
    }
}

/// Cuts `items`, read with one more than `limit` to tell whether the list goes on, to
/// `limit`; answers whether more remain.
pub fn cut<T>(items: &mut Vec<T>, limit: usize) -> bool {
    let more = items.len() > limit;
    items.truncate(limit);
    more
}

/// Reads a boolean column: BOOLEAN on PostgreSQL, INTEGER 0/1 on SQLite.
pub fn flag(row: &sqlx::any::AnyRow, column: &str) -> bool {
    use sqlx::Row as _;
    row.try_get::<bool, _>(column)
        .or_else(|_| row.try_get::<i64, _>(column).map(|v| v != 0))
        .unwrap_or(false)
}

/// Decodes a JSON array of strings stored as TEXT.
pub fn json_strings(text: &str) -> Vec<String> {
    serde_json::from_str(text).unwrap_or_default()
}

/// Encodes strings as a JSON array for a TEXT column.
pub fn to_json<T: serde::Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("serializing to JSON cannot fail")
}

/// The database file a `sqlite:` URL names (not an in-memory one), and whether the URL
/// lets it be created.
pub fn sqlite_file(url: &str) -> Option<(PathBuf, bool)> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let (path, params) = rest.split_once('?').unwrap_or((rest, ""));
    let params: Vec<&str> = params.split('&').collect();
    if path.is_empty() || path == ":memory:" || params.contains(&"mode=memory") {
        return None;
    }
    Some((PathBuf::from(path), params.contains(&"mode=rwc")))
}

/// Makes the database file and its `-wal` and `-shm` companions readable and writable by
/// their owner only, creating the (empty) database file first when `create` and it is
/// missing: SQLite would create it from the umask (usually 0644), and creates the
/// companions with the database file's permissions.
fn make_private(path: &Path, create: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    if create && !path.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
    }
    let mut companions = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        companions.push(PathBuf::from(name));
    }
    for file in companions {
        if file.exists() {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("making {} private", file.display()))?;
        }
    }
    Ok(())
}

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => format!("{}://…{}", &url[..scheme], &url[at..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row as _;

    use super::{Store, literal, renumber};

    /// `PRAGMA temp_store` on `conn`: 2 is `MEMORY`, 0 the build's default (a file).
    async fn temp_store(conn: &mut sqlx::AnyConnection) -> i64 {
        let row = sqlx::query("PRAGMA temp_store")
            .fetch_one(conn)
            .await
            .unwrap();
        row.try_get::<i64, _>(0).unwrap()
    }

    #[tokio::test]
    async fn the_sqlite_writer_keeps_its_statement_journal_in_memory_and_readers_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&Store::sqlite_url(dir.path()), 1)
            .await
            .unwrap();
        let mut tx = store.begin().await.unwrap();
        assert_eq!(temp_store(&mut tx).await, 2, "the writer's temp_store");
        tx.rollback().await.unwrap();
        let mut reader = store.pool().acquire().await.unwrap();
        assert_eq!(temp_store(&mut reader).await, 0, "a reader's temp_store");
    }

    #[test]
    fn a_batched_statements_parameters_follow_those_before_it() {
        assert_eq!(
            renumber("UPDATE t SET a = $1, b = $12 WHERE id = $2", 9),
            "UPDATE t SET a = $10, b = $21 WHERE id = $11"
        );
        assert_eq!(renumber("SELECT $1", 0), "SELECT $1");
        assert_eq!(renumber("x = '$' || $3$", 1), "x = '$' || $4$");
    }

    #[test]
    fn a_literal_escapes_every_quote_and_backslash_whatever_the_server_reads_them_as() {
        assert_eq!(literal("node-1"), "E'node-1'");
        assert_eq!(literal(r"a'b\c"), r"E'a''b\\c'");
        assert_eq!(
            literal("'); DROP TABLE nodes; --"),
            "E'''); DROP TABLE nodes; --'"
        );
        assert_eq!(literal("a\0b"), "E'ab'");
    }
}
