//! Group commit: creates whose placements are written at the same time share one write
//! transaction and one commit (and on SQLite, reservations ended meanwhile:
//! [`super::lifecycle::end`]).
//!
//! A create writes its placement as a member of the open group: in the group's transaction,
//! under a savepoint of its own, so that a member that loses (an overlap, a quota it does
//! not fit) or fails rolls back only its own writes. A member that is done hands the
//! transaction to the next create waiting to write, and waits for the group's commit; the
//! last one (nobody waiting, or [`MAX_MEMBERS`] in the group) commits it, and lays what
//! every member changed onto the capacity view in one go. Members are written one after
//! another, in the order they joined.
//!
//! Why: a placement charges the tenant's quota rows and appends to the event outbox, which
//! every create of the tenant (every create, for the outbox) must lock until its commit.
//! On PostgreSQL a commit waits for the write-ahead log to reach the disk, so one commit
//! per create would cap a tenant's creates at one per disk flush. On SQLite, which has one
//! writer, a group pays for one commit instead of one per create.
//!
//! A member's savepoint is never released: the next member's is taken on top of it, each
//! rolled back to by name (the most recent of that name), and the commit releases them
//! all, which spares a round trip per member. The savepoint is taken in the member's first
//! round trip ([`Writer::begin_in`], [`Writer::start_with`]), sparing another.
//!
//! The turn is the replica's write throughput: `orl_write_turn_held_seconds_total` counts
//! how long members held it, `orl_write_turn_writes_total` and
//! `orl_write_group_commits_total` how many took it and how many commits they made, and
//! `orl_write_turn_waiting` how many wait for it now.
//!
//! The commit runs in a task of its own: a create whose client goes away while the group
//! commits cancels nothing. A member that goes away before it is done is rolled back to its
//! savepoint, and the group goes on (or commits) without it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::future::BoxFuture;
use sqlx::AnyConnection;
use tokio::sync::{Mutex, OwnedMutexGuard, watch};

use super::engine::Laying;
use crate::capacity::{Edit, Since, View};
use crate::metrics::WriteTurn;
use crate::store::{Backend, Store, Tx};
use crate::{Error, Result};

/// The most creates one commit takes, so that the first of a group waits little.
const MAX_MEMBERS: usize = 16;

/// How long a member waits for a lock before it gives up and is tried again (PostgreSQL).
const LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '200ms'";
const SAVEPOINT: &str = "SAVEPOINT orl_member";
const ROLLBACK: &str = "ROLLBACK TO SAVEPOINT orl_member; RELEASE SAVEPOINT orl_member";

/// The open group, if any, how many creates wait to join it, and the view its commits lay
/// changes onto.
#[derive(Clone)]
pub struct Group(Arc<Shared>);

struct Shared {
    open: Arc<Mutex<Option<Open>>>,
    waiting: AtomicUsize,
    view: Arc<View>,
    turn: WriteTurn,
}

type Guard = OwnedMutexGuard<Option<Open>>;

/// How a group's commit went, for its members; `None` until it is done.
type Outcome = Option<std::result::Result<(), String>>;

/// A group's transaction and what its members lay onto the view once it commits.
struct Open {
    tx: Tx,
    members: usize,
    since: Option<Since>,
    edits: Vec<Edit>,
    forget: Vec<String>,
    done: watch::Sender<Outcome>,
}

/// One create's turn in the group's transaction ([`Group::join`]). Dropped before
/// [`Member::keep`] or [`Member::drop_writes`], its writes are rolled back.
pub struct Member {
    group: Group,
    /// When it took the turn.
    turn_taken: Instant,
    guard: Option<Guard>,
    /// Whether its savepoint was started (or sent with its first batch).
    started: bool,
}

/// A create waiting to join. One that goes away while waiting may leave a group that
/// nobody would commit, so it has the group settled.
struct Waiting {
    group: Group,
    joined: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.group.0.turn.waiting.dec();
        let last = self.group.0.waiting.fetch_sub(1, Ordering::AcqRel) == 1;
        if last && !self.joined {
            let group = self.group.clone();
            tokio::spawn(async move {
                let guard = group.0.open.clone().lock_owned().await;
                group.settle(guard);
            });
        }
    }
}

impl Group {
    pub fn new(view: Arc<View>, turn: WriteTurn) -> Group {
        Group(Arc::new(Shared {
            open: Arc::default(),
            waiting: AtomicUsize::new(0),
            view,
            turn,
        }))
    }

    /// Waits for the turn to write in the open group (opening one if none is), and starts
    /// the member's savepoint.
    pub(crate) async fn join(&self, store: &Store) -> Result<Member> {
        self.0.waiting.fetch_add(1, Ordering::AcqRel);
        self.0.turn.waiting.inc();
        let mut waiting = Waiting {
            group: self.clone(),
            joined: false,
        };
        let guard = self.0.open.clone().lock_owned().await;
        waiting.joined = true;
        drop(waiting);
        let mut member = Member {
            group: self.clone(),
            turn_taken: Instant::now(),
            guard: Some(guard),
            started: false,
        };
        let open = member.guard.as_mut().expect("held");
        if open.is_none() {
            let mut tx = store.begin().await?;
            if store.backend() == Backend::Postgres {
                // A member never waits long for a row another transaction holds: that one
                // may be waiting for this group's locks, taken by the members before it.
                execute(&mut tx, LOCK_TIMEOUT).await?;
            }
            **open = Some(Open {
                tx,
                members: 0,
                since: None,
                edits: Vec::new(),
                forget: Vec::new(),
                done: watch::channel(None).0,
            });
        }
        Ok(member)
    }

    /// Waits until the group open now, if any, has committed (or failed): what its members
    /// wrote is then visible to every reader.
    pub(crate) async fn settled(&self) {
        let done = {
            let open = self.0.open.lock().await;
            open.as_ref().map(|o| o.done.subscribe())
        };
        if let Some(mut done) = done {
            let _ = done.wait_for(Option::is_some).await;
        }
    }

    /// Counts a member's turn, taken at `taken`, as it ends.
    fn count_turn(&self, taken: Instant) {
        self.0.turn.writes.inc();
        self.0.turn.held.inc_by(taken.elapsed().as_secs_f64());
    }

    /// Hands the group to the next create waiting to join, or, when nobody waits or it is
    /// full, commits it (in a task of its own: the next group may begin meanwhile).
    fn settle(&self, mut guard: Guard) {
        let full = guard.as_ref().is_some_and(|o| o.members >= MAX_MEMBERS);
        if self.0.waiting.load(Ordering::Acquire) > 0 && !full {
            return;
        }
        let Some(open) = guard.take() else { return };
        drop(guard);
        self.0.turn.commits.inc();
        let view = self.0.view.clone();
        tokio::spawn(async move { open.commit(&view).await });
    }
}

impl Member {
    fn open(&mut self) -> &mut Open {
        (self.guard.as_mut().and_then(|g| g.as_mut())).expect("a member holds an open group")
    }

    fn conn(&mut self) -> &mut AnyConnection {
        &mut self.open().tx
    }

    /// The statement that begins this member's writes (its savepoint), once: the caller
    /// runs it before anything else it writes.
    fn savepoint_due(&mut self) -> Option<&'static str> {
        (!std::mem::replace(&mut self.started, true)).then_some(SAVEPOINT)
    }

    /// Keeps this member's writes: they commit with the group, and `laying` (read in the
    /// transaction from `since`) is laid onto the view then. Answers once the group has
    /// committed.
    pub(crate) async fn keep(mut self, since: Since, laying: Laying) -> Result<()> {
        let open = self.open();
        open.members += 1;
        open.since = Some(open.since.map_or(since, |first| first.through(since)));
        match laying {
            Laying::Edits(edits) => open.edits.extend(edits),
            Laying::Forget(nodes) => open.forget.extend(nodes),
        }
        let mut outcome = open.done.subscribe();
        self.hand_on();
        let committed = outcome.wait_for(Option::is_some).await.map(|o| o.clone());
        match committed {
            Ok(Some(Ok(()))) => Ok(()),
            Ok(Some(Err(why))) => Err(Error::Internal(anyhow::anyhow!("committing: {why}"))),
            _ => Err(Error::Internal(anyhow::anyhow!("the commit was lost"))),
        }
    }

    /// Rolls this member's writes back; the group goes on without them.
    pub(crate) async fn drop_writes(mut self) -> Result<()> {
        if self.started {
            execute(self.conn(), ROLLBACK).await?;
        }
        self.hand_on();
        Ok(())
    }

    fn hand_on(&mut self) {
        if let Some(guard) = self.guard.take() {
            self.group.count_turn(self.turn_taken);
            self.group.settle(guard);
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        let (group, started) = (self.group.clone(), self.started);
        let taken = self.turn_taken;
        tokio::spawn(async move {
            let rolled_back = match guard.as_mut() {
                Some(open) if started => execute(&mut open.tx, ROLLBACK).await,
                _ => Ok(()),
            };
            group.count_turn(taken);
            match rolled_back {
                Ok(()) => group.settle(guard),
                Err(err) => {
                    if let Some(open) = guard.take() {
                        drop(guard);
                        open.fail(&err.to_string()).await;
                    }
                }
            }
        });
    }
}

/// Where a transaction's writes go: into the open group ([`Group::join`]), or alone, in a
/// transaction of their own that commits by itself.
pub(crate) enum Writer {
    Member(Member),
    Alone(Tx),
}

impl Writer {
    /// The transaction to write in, once [`Writer::start`], [`Writer::start_with`] or
    /// [`Writer::begin_in`] began the writes.
    pub(crate) fn conn(&mut self) -> &mut AnyConnection {
        match self {
            Writer::Member(member) => member.conn(),
            Writer::Alone(tx) => tx,
        }
    }

    /// Begins the writes (a member's savepoint) now, unless they were begun.
    pub(crate) async fn start(&mut self) -> Result<()> {
        if let Some(savepoint) = self.savepoint_due() {
            execute(self.conn(), savepoint).await?;
        }
        Ok(())
    }

    /// Runs `sql`, a statement without parameters (sent in the simple query protocol),
    /// beginning the writes in its round trip unless they were begun.
    pub(crate) async fn start_with(&mut self, sql: &str) -> Result<()> {
        let sql = match self.savepoint_due() {
            Some(savepoint) => format!("{savepoint};\n{sql}"),
            None => sql.to_string(),
        };
        sqlx::Executor::execute(self.conn(), sql.as_str()).await?;
        Ok(())
    }

    /// Has `batch`, about to run, begin the writes unless they were begun: on SQLite in
    /// its round trip, on PostgreSQL (whose batch is one statement) in one before it.
    pub(crate) async fn begin_in(&mut self, batch: &mut crate::store::Batch) -> Result<()> {
        if batch.postgres() {
            return self.start().await;
        }
        if let Some(savepoint) = self.savepoint_due() {
            batch.open_with(savepoint);
        }
        Ok(())
    }

    fn savepoint_due(&mut self) -> Option<&'static str> {
        match self {
            Writer::Member(member) => member.savepoint_due(),
            Writer::Alone(_) => None,
        }
    }

    /// Commits what was written (with the group, or now) and lays `laying` onto the view.
    pub(crate) async fn keep(self, app: &crate::App, since: Since, laying: Laying) -> Result<()> {
        match self {
            Writer::Member(member) => member.keep(since, laying).await,
            Writer::Alone(tx) => super::engine::commit_laying(app, tx, since, laying).await,
        }
    }

    pub(crate) async fn drop_writes(self) -> Result<()> {
        match self {
            Writer::Member(member) => member.drop_writes().await,
            Writer::Alone(tx) => Ok(tx.rollback().await?),
        }
    }
}

impl Open {
    /// Commits and lays every member's changes onto the view (before any other write of
    /// this replica commits, on SQLite), then tells the members.
    async fn commit(self, view: &View) {
        let Open {
            tx,
            since,
            edits,
            forget,
            done,
            ..
        } = self;
        let outcome = match tx.commit_in_turn().await {
            Ok(turn) => {
                if let Some(since) = since
                    && !edits.is_empty()
                {
                    view.apply(since, edits).await;
                }
                drop(turn);
                if !forget.is_empty() {
                    view.forget(&forget).await;
                }
                Ok(())
            }
            Err(err) => Err(err.to_string()),
        };
        done.send_replace(Some(outcome));
    }

    /// Rolls back every member's writes and tells them.
    async fn fail(self, why: &str) {
        let _ = self.tx.rollback().await;
        self.done.send_replace(Some(Err(why.to_string())));
    }
}

/// Runs `sql` (boxed: the future is sent to tasks whatever the connection's lifetime).
fn execute<'c>(conn: &'c mut AnyConnection, sql: &'static str) -> BoxFuture<'c, Result<()>> {
    Box::pin(async move {
        sqlx::Executor::execute(&mut *conn, sql).await?;
        Ok(())
    })
}
