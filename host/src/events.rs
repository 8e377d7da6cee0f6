//! The event outbox. A state change writes its event in the same transaction as the change;
//! readers and streams take them from the table in `seq` order.
//!
//! A stream is a cursor over the table: it reads what follows its position, then waits for
//! more. On PostgreSQL it waits on `LISTEN orl_events` (every replica's writes notify it,
//! at commit); on SQLite, and as a safety net on PostgreSQL, it polls. Because the cursor is
//! the outbox position, a client resumes from the last id it saw, across server restarts.
//!
//! A stream lasts only as long as the key that opened it: it ends once that key is
//! revoked, before it delivers anything written after the revocation.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use serde_json::Value;
use sqlx::AnyConnection;
use sqlx::postgres::PgListener;

use crate::iam::{Permission, Principal, keys};
use crate::store::{Backend, Batch, to_json};
use crate::{App, Error, Result, validation};

/// The PostgreSQL channel every event insert notifies at commit.
const CHANNEL: &str = "orl_events";
/// The advisory lock that makes event inserts commit in `seq` order on PostgreSQL.
const OUTBOX_LOCK: i64 = 0x6f72_6c5f_6576_7473;
/// How often a SQLite stream looks for new events.
const SQLITE_POLL: Duration = Duration::from_millis(250);
/// How often a PostgreSQL stream looks even without a notification (a listener that
/// reconnected may have missed one).
const POSTGRES_POLL: Duration = Duration::from_secs(5);
/// Events a stream reads per query.
const STREAM_BATCH: i64 = 100;
/// How often an idle stream checks that its key is still live.
const KEY_RECHECK: Duration = Duration::from_secs(1);

/// Appends an event of `kind` about `object_id`, visible to the members of `org_ids`
/// (and to platform operators).
///
/// Readers follow the outbox by `seq`, so an event must never become visible after one
/// with a higher `seq`. On PostgreSQL identity values are taken at insert but transactions
/// commit in any order, so a reader could see `seq` 6 before 5 commits and skip 5 for good.
/// The transaction therefore first takes a transaction-scoped advisory lock, held until it
/// commits or rolls back: event inserts, and their commits, happen one at a time in `seq`
/// order. SQLite has a single writer already. The insert also notifies [`CHANNEL`], which
/// PostgreSQL delivers to listeners on every replica when the transaction commits.
pub async fn emit(
    conn: &mut AnyConnection,
    kind: &str,
    object_id: &str,
    org_ids: &[&str],
    payload: &Value,
    now_ms: i64,
) -> Result<()> {
    let mut batch = Batch::on(conn);
    push(&mut batch, kind, object_id, org_ids, payload, now_ms);
    batch.execute(conn).await?;
    Ok(())
}

/// Adds the append of an event ([`emit`]) to `batch`.
pub fn push(
    batch: &mut Batch,
    kind: &str,
    object_id: &str,
    org_ids: &[&str],
    payload: &Value,
    now_ms: i64,
) {
    let mut values: Vec<crate::store::Value> = vec![
        now_ms.into(),
        kind.into(),
        object_id.into(),
        to_json(org_ids).into(),
        to_json(payload).into(),
    ];
    let sql = if batch.postgres() {
        // The lock is taken before the row (and its `seq`) is made.
        values.extend([OUTBOX_LOCK.into(), CHANNEL.into()]);
        "INSERT INTO events (at, type, object_id, org_ids, payload)
         SELECT $1, $2, $3, $4, $5 FROM (SELECT pg_advisory_xact_lock($6), pg_notify($7, '')) AS outbox"
    } else {
        "INSERT INTO events (at, type, object_id, org_ids, payload) VALUES ($1, $2, $3, $4, $5)"
    };
    batch.push(sql, values);
}

/// One event as the API shows it.
#[derive(Clone, Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Position in the outbox; pass it as `after` to read on.
    pub id: i64,
    #[serde(rename = "type")]
    pub kind: String,
    pub at: String,
    pub object_id: String,
    pub payload: Value,
}

/// Whether the caller may read its org's events; otherwise events are not found.
pub fn require_reader(caller: &Principal) -> Result<()> {
    if caller.has(Permission::EventsRead) {
        Ok(())
    } else {
        Err(Error::NotFound("events not found".into()))
    }
}

/// A page of the events the caller may see after `after` (`limit` is 1-500), and whether
/// more follow it.
pub async fn read(
    app: &App,
    caller: &Principal,
    after: i64,
    limit: i64,
) -> Result<(Vec<Event>, bool)> {
    require_reader(caller)?;
    validation::range("limit", limit, 1, 500)?;
    validation::range("after", after, 0, i64::MAX)?;
    let mut events = list(app.store.pool(), &caller.org_id, after, limit + 1).await?;
    let more = crate::store::cut(&mut events, limit as usize);
    Ok((events, more))
}

/// Events after `after` in outbox order that `org` may see (all of them for the ops org),
/// at most `limit`.
pub async fn list(pool: &sqlx::AnyPool, org: &str, after: i64, limit: i64) -> Result<Vec<Event>> {
    use sqlx::Row as _;
    let everything = org == crate::iam::OPS_ORG;
    let pattern = format!("%\"{org}\"%");
    let rows = sqlx::query(
        "SELECT seq, at, type, object_id, org_ids, payload FROM events
         WHERE seq > $1 AND ($2 OR org_ids LIKE $3) ORDER BY seq LIMIT $4",
    )
    .bind(after)
    .bind(everything)
    .bind(&pattern)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .iter()
        .filter(|r| {
            everything
                || crate::store::json_strings(&r.get::<String, _>("org_ids"))
                    .iter()
                    .any(|o| o == org)
        })
        .map(|r| Event {
            id: r.get("seq"),
            kind: r.get("type"),
            at: crate::clock::format_ms(r.get("at")),
            object_id: r.get("object_id"),
            payload: serde_json::from_str(&r.get::<String, _>("payload")).unwrap_or(Value::Null),
        })
        .collect())
}

/// The id of the newest event, or 0: where a stream of only new events starts.
pub async fn head(pool: &sqlx::AnyPool) -> Result<i64> {
    Ok(
        sqlx::query_scalar::<_, Option<i64>>("SELECT MAX(seq) FROM events")
            .fetch_one(pool)
            .await?
            .unwrap_or(0),
    )
}

/// The events the caller may see after `after`, then each new one as it is written, for
/// as long as the stream is held and the caller's key is live. It ends when the server is
/// asked to stop, so graceful shutdown does not wait on open streams, and when the key is
/// revoked: every batch read is delivered only after the key is checked, and an idle
/// stream checks it every [`KEY_RECHECK`]. A database error ends it after yielding it.
pub async fn follow(
    app: Arc<App>,
    caller: &Principal,
    after: i64,
) -> Result<impl Stream<Item = Result<Event>> + Send + use<>> {
    require_reader(caller)?;
    validation::range("after", after, 0, i64::MAX)?;
    if !keys::is_live(app.store.pool(), &caller.key_id).await? {
        return Err(Error::Unauthenticated("unknown or revoked API key".into()));
    }
    let wake = Wake::open(&app).await;
    let ended = {
        let app = app.clone();
        let key_id = caller.key_id.clone();
        async move {
            tokio::select! {
                () = crate::serve::stopping() => {}
                () = revoked(&app, &key_id) => {}
            }
        }
    };
    let cursor = Cursor {
        app,
        org: caller.org_id.clone(),
        key_id: caller.key_id.clone(),
        after,
        ready: VecDeque::new(),
        wake,
        failed: false,
    };
    Ok(futures::stream::unfold(cursor, Cursor::next).take_until(Box::pin(ended)))
}

/// Returns once the key `key_id` no longer authenticates, looking every [`KEY_RECHECK`].
/// A failed look is retried at the next one.
async fn revoked(app: &App, key_id: &str) {
    loop {
        tokio::time::sleep(KEY_RECHECK).await;
        match keys::is_live(app.store.pool(), key_id).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => tracing::warn!(error = %err, "event stream: cannot check its key"),
        }
    }
}

/// A stream's position in the outbox and what wakes it.
struct Cursor {
    app: Arc<App>,
    org: String,
    /// The key the stream was opened with; it must be live for anything to be delivered.
    key_id: String,
    after: i64,
    ready: VecDeque<Event>,
    wake: Wake,
    failed: bool,
}

impl Cursor {
    async fn next(mut self) -> Option<(Result<Event>, Cursor)> {
        if self.failed {
            return None;
        }
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Some((Ok(event), self));
            }
            match list(self.app.store.pool(), &self.org, self.after, STREAM_BATCH).await {
                Ok(batch) if batch.is_empty() => self.wake.wait().await,
                Ok(batch) => {
                    match keys::is_live(self.app.store.pool(), &self.key_id).await {
                        Ok(true) => {}
                        Ok(false) => return None,
                        Err(err) => {
                            self.failed = true;
                            return Some((Err(err), self));
                        }
                    }
                    self.after = batch.last().map_or(self.after, |e| e.id);
                    self.ready.extend(batch);
                }
                Err(err) => {
                    self.failed = true;
                    return Some((Err(err), self));
                }
            }
        }
    }
}

/// What a stream waits on between reads.
enum Wake {
    Poll(Duration),
    Listen(Box<PgListener>),
}

impl Wake {
    async fn open(app: &App) -> Wake {
        if app.store.backend() == Backend::Sqlite {
            return Wake::Poll(SQLITE_POLL);
        }
        let url = app.store.pool().connect_options().database_url.clone();
        let listener = async {
            let mut listener = PgListener::connect(url.as_str()).await?;
            listener.listen(CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        match listener.await {
            Ok(listener) => Wake::Listen(Box::new(listener)),
            Err(err) => {
                tracing::warn!(error = %err, "event stream: cannot LISTEN; polling instead");
                Wake::Poll(SQLITE_POLL)
            }
        }
    }

    async fn wait(&mut self) {
        match self {
            Wake::Poll(every) => tokio::time::sleep(*every).await,
            Wake::Listen(listener) => {
                // A notification, a reconnect (`recv` fails once, then listens again) or
                // the safety-net interval: any of them means "read again".
                if let Ok(Err(err)) = tokio::time::timeout(POSTGRES_POLL, listener.recv()).await {
                    tracing::warn!(error = %err, "event stream: listener failed; retrying");
                    tokio::time::sleep(SQLITE_POLL).await;
                }
            }
        }
    }
}
