//! The capacity view: what each node offers and what holds it, in memory, per replica.
//!
//! A decision (placement, preemption, a gang, a pending retry) reads its pool's nodes from
//! here instead of the database: each node's inventory (units with class, model, memory,
//! NVLink domain, labels; host resources; lost or not), every active booking of its units
//! (with spot or not and the reservation), its active host bookings, and the node
//! reservations that claim its units.
//!
//! # How it stays current
//!
//! Triggers in the database record every change to those rows by node (migration
//! `0011_capacity_changes`), in the writing transaction, so a change that rolls back is
//! never announced:
//!
//! - On **SQLite** (one process, one writer) they append the node's id to
//!   `capacity_changes`; before each read the view takes the rows past its cursor, in
//!   commit order, and loads those nodes again.
//! - On **PostgreSQL** they `NOTIFY orl_capacity` with the node's id, delivered at commit
//!   to every replica's listener (this one's own commits included), which marks the node
//!   stale; the next read loads it again. While the listener is down (at start, after a
//!   dropped connection) every node is treated as stale, so a missed notification can never
//!   leave the view behind for good.
//!
//! Nodes are loaded on first use and then kept. Nothing about correctness depends on the
//! view being fresh: the database still refuses every overlapping booking, placements
//! re-read node-reservation rights under a lock before they write, and a decision that
//! lost to a commit the view had not seen yet marks the nodes it chose stale and decides
//! again.
//!
//! This module imports nothing from the booking engine, the reconciler or the surfaces.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use sqlx::{AnyConnection, AnyPool, Row as _};

use crate::Result;
use crate::inventory::nodes::{self, Node};
use crate::node_reservations::queries::{self, Record};
use crate::store::{Backend, Store, flag, placeholders};

/// The channel PostgreSQL announces capacity changes on.
const CHANNEL: &str = "orl_capacity";

/// How many nodes one load asks the database for at once (bind parameters per query).
const LOAD_BATCH: usize = 500;

/// One node as the view holds it.
#[derive(Debug, Clone)]
pub struct NodeCapacity {
    pub node: Arc<Node>,
    /// Active bookings of its units, by unit then start.
    pub bookings: Vec<Booked>,
    /// Active host bookings (CPU, memory, hugepages) on it.
    pub host: Vec<HostBooked>,
    /// Node reservations on it that are not cancelled.
    pub claims: Vec<Record>,
}

impl NodeCapacity {
    /// Whether `other` offers and holds the same: everything but the node's report times,
    /// which change without changing capacity.
    fn same_capacity(&self, other: &NodeCapacity) -> bool {
        let timeless = |n: &Node| Node {
            last_seen_at: String::new(),
            updated_at: String::new(),
            ..n.clone()
        };
        timeless(&self.node) == timeless(&other.node)
            && self.bookings == other.bookings
            && self.host == other.host
            && self.claims == other.claims
    }
}

impl NodeCapacity {
    /// How many sellable units no active booking holds at any time in `[start, end)`: an
    /// upper bound of what a request over that window could get here.
    pub fn free_units(&self, start: i64, end: i64) -> usize {
        self.node
            .units
            .iter()
            .filter(|u| u.sellable)
            .filter(|u| {
                !self
                    .bookings
                    .iter()
                    .any(|b| b.unit_id == u.id && b.start_ms < end && b.end_ms > start)
            })
            .count()
    }
}

/// An active booking of one unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booked {
    pub unit_id: String,
    pub reservation_id: String,
    pub spot: bool,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// An active booking of host resources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBooked {
    pub reservation_id: String,
    pub spot: bool,
    pub vcpu: i64,
    pub memory_gib: i64,
    pub hugepages_1gi: i64,
    pub start_ms: i64,
    pub end_ms: i64,
}

/// Which nodes changed since the view last looked.
enum Feed {
    /// SQLite: the `capacity_changes` rows past `cursor`.
    Table { cursor: Option<i64> },
    /// PostgreSQL: what the listener heard.
    Notify(Arc<SyncMutex<Heard>>),
}

#[derive(Default)]
struct Heard {
    /// Whether the listener is connected; until it is, every node is stale.
    listening: bool,
    /// Set when the listener (re)connects: everything loaded before may have missed news.
    reset: bool,
    nodes: HashSet<String>,
}

struct State {
    nodes: HashMap<String, Arc<NodeCapacity>, foldhash::fast::RandomState>,
    feed: Feed,
}

/// The capacity view of this replica.
pub struct View {
    state: tokio::sync::Mutex<State>,
    /// Its own connections: a decision reads the view while its transaction holds one of
    /// the store's.
    reader: AnyPool,
}

impl View {
    /// An empty view for `store`; on PostgreSQL it starts listening for changes at once.
    pub fn new(store: &Store) -> View {
        let feed = match store.backend() {
            Backend::Sqlite => Feed::Table { cursor: None },
            Backend::Postgres => {
                let heard = Arc::new(SyncMutex::new(Heard::default()));
                let url = store.pool().connect_options().database_url.to_string();
                tokio::spawn(listen(url, heard.clone()));
                Feed::Notify(heard)
            }
        };
        View {
            state: tokio::sync::Mutex::new(State {
                nodes: HashMap::default(),
                feed,
            }),
            reader: store.reader(2),
        }
    }

    /// The nodes of `ids` that exist, current as of the changes announced so far, in the
    /// order asked. A node that changed is dropped and, like one never seen, loaded again,
    /// in batches.
    ///
    /// It reads on a connection of its own, never inside a caller's write transaction: the
    /// view holds only what is committed.
    pub async fn nodes(&self, ids: &[String]) -> Result<Vec<Arc<NodeCapacity>>> {
        let mut conn = self.reader.acquire().await?;
        let conn = &mut *conn;
        let mut state = self.state.lock().await;
        match state.take_changes(conn).await? {
            Some(changed) => {
                for id in changed {
                    state.nodes.remove(&id);
                }
            }
            None => state.nodes.clear(),
        }
        let mut out: Vec<Option<Arc<NodeCapacity>>> =
            ids.iter().map(|id| state.nodes.get(id).cloned()).collect();
        let missing: Vec<String> = ids
            .iter()
            .zip(&out)
            .filter(|(_, held)| held.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        if !missing.is_empty() {
            for node in load(conn, &missing).await? {
                state.nodes.insert(node.node.id.clone(), Arc::new(node));
            }
            for (id, held) in ids.iter().zip(out.iter_mut()) {
                if held.is_none() {
                    *held = state.nodes.get(id).cloned();
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Forgets `ids`: the next read loads them from the database. For nodes this replica
    /// just changed (so its next decision need not wait for the announcement), and after a
    /// decision lost to a commit the view had not heard of.
    pub async fn forget(&self, ids: &[String]) {
        let mut state = self.state.lock().await;
        for id in ids {
            state.nodes.remove(id);
        }
    }

    /// Compares the view with the database for `ids`: the ids of nodes whose loaded state
    /// differs from what the database holds now (empty when the view is current).
    pub async fn differences(&self, ids: &[String]) -> Result<Vec<String>> {
        let held = self.nodes(ids).await?;
        let mut conn = self.reader.acquire().await?;
        let conn = &mut *conn;
        let mut fresh: HashMap<String, NodeCapacity> = HashMap::new();
        for node in load(conn, ids).await? {
            fresh.insert(node.node.id.clone(), node);
        }
        let mut differ: Vec<String> = held
            .iter()
            .filter(|n| !fresh.remove(&n.node.id).is_some_and(|f| f.same_capacity(n)))
            .map(|n| n.node.id.clone())
            .collect();
        differ.extend(fresh.into_keys());
        differ.sort();
        Ok(differ)
    }

    /// Drops `capacity_changes` rows the view has read (SQLite; nothing to do elsewhere).
    pub async fn prune(&self, store: &Store) -> Result<()> {
        let cursor = match &self.state.lock().await.feed {
            Feed::Table { cursor: Some(c) } => *c,
            _ => return Ok(()),
        };
        let mut tx = store.begin().await?;
        sqlx::query("DELETE FROM capacity_changes WHERE seq <= $1")
            .bind(cursor)
            .execute(&mut **tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

impl State {
    /// The nodes changed since the last call; `None` when every node must be treated as
    /// changed.
    async fn take_changes(&mut self, conn: &mut AnyConnection) -> Result<Option<HashSet<String>>> {
        match &mut self.feed {
            Feed::Table { cursor: None } => {
                // The first look: nothing is loaded yet, so nothing is stale; what commits
                // from here on is past the cursor.
                let last: i64 =
                    sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM capacity_changes")
                        .fetch_one(&mut *conn)
                        .await?;
                self.feed = Feed::Table { cursor: Some(last) };
                Ok(Some(HashSet::new()))
            }
            Feed::Table {
                cursor: Some(cursor),
            } => {
                let rows = sqlx::query(
                    "SELECT seq, node_id FROM capacity_changes WHERE seq > $1 ORDER BY seq",
                )
                .bind(*cursor)
                .fetch_all(&mut *conn)
                .await?;
                let mut changed = HashSet::new();
                for row in &rows {
                    *cursor = row.get("seq");
                    changed.insert(row.get::<String, _>("node_id"));
                }
                Ok(Some(changed))
            }
            Feed::Notify(heard) => {
                let mut heard = heard.lock().expect("capacity listener state");
                if !heard.listening || std::mem::take(&mut heard.reset) {
                    heard.nodes.clear();
                    return Ok(None);
                }
                Ok(Some(std::mem::take(&mut heard.nodes)))
            }
        }
    }
}

/// Reads `ids` (those that exist) with what books and claims them, on `conn` as it sees
/// them (inside a transaction: with its own uncommitted changes). The view uses it on
/// committed data only.
pub async fn load(conn: &mut AnyConnection, ids: &[String]) -> Result<Vec<NodeCapacity>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(LOAD_BATCH) {
        out.extend(load_batch(conn, chunk).await?);
    }
    Ok(out)
}

/// [`load`] for at most [`LOAD_BATCH`] ids (one query each for nodes, units, bookings,
/// host bookings and claims).
async fn load_batch(conn: &mut AnyConnection, ids: &[String]) -> Result<Vec<NodeCapacity>> {
    let list = placeholders(2, ids.len());
    let mut bookings: HashMap<String, Vec<Booked>> = HashMap::new();
    let sql = format!(
        "SELECT node_id, unit_id, reservation_id, spot, start_ms, end_ms FROM bookings
         WHERE active = $1 AND node_id IN ({list}) ORDER BY node_id, unit_id, start_ms, reservation_id"
    );
    let mut query = sqlx::query(&sql).bind(true);
    for id in ids {
        query = query.bind(id);
    }
    for row in query.fetch_all(&mut *conn).await? {
        bookings
            .entry(row.get("node_id"))
            .or_default()
            .push(Booked {
                unit_id: row.get("unit_id"),
                reservation_id: row.get("reservation_id"),
                spot: flag(&row, "spot"),
                start_ms: row.get("start_ms"),
                end_ms: row.get("end_ms"),
            });
    }
    let mut host: HashMap<String, Vec<HostBooked>> = HashMap::new();
    let sql = format!(
        "SELECT h.node_id, h.reservation_id, r.spot, h.vcpu, h.memory_gib, h.hugepages_1gi, h.start_ms, h.end_ms
         FROM host_bookings h JOIN compute_reservations r ON r.id = h.reservation_id
         WHERE h.active = $1 AND h.node_id IN ({list}) ORDER BY h.node_id, h.start_ms, h.reservation_id"
    );
    let mut query = sqlx::query(&sql).bind(true);
    for id in ids {
        query = query.bind(id);
    }
    for row in query.fetch_all(&mut *conn).await? {
        host.entry(row.get("node_id"))
            .or_default()
            .push(HostBooked {
                reservation_id: row.get("reservation_id"),
                spot: flag(&row, "spot"),
                vcpu: row.get("vcpu"),
                memory_gib: row.get("memory_gib"),
                hugepages_1gi: row.get("hugepages_1gi"),
                start_ms: row.get("start_ms"),
                end_ms: row.get("end_ms"),
            });
    }
    let mut claims: HashMap<String, Vec<Record>> = HashMap::new();
    for record in queries::live_on_nodes(conn, ids).await? {
        claims
            .entry(record.node_id.clone())
            .or_default()
            .push(record);
    }
    // In one order, so that two loads of the same rows compare equal.
    for records in claims.values_mut() {
        records.sort_by(|a, b| a.id.cmp(&b.id));
    }
    Ok(nodes::find_many(conn, ids)
        .await?
        .into_iter()
        .map(|node| NodeCapacity {
            bookings: bookings.remove(&node.id).unwrap_or_default(),
            host: host.remove(&node.id).unwrap_or_default(),
            claims: claims.remove(&node.id).unwrap_or_default(),
            node: Arc::new(node),
        })
        .collect())
}

/// Listens on [`CHANNEL`] until the process ends, reconnecting after a failure.
async fn listen(url: String, heard: Arc<SyncMutex<Heard>>) {
    loop {
        match sqlx::postgres::PgListener::connect(&url).await {
            Ok(mut listener) => {
                if let Err(err) = listener.listen(CHANNEL).await {
                    tracing::warn!(error = %err, "capacity view: cannot LISTEN; retrying");
                } else {
                    {
                        let mut h = heard.lock().expect("capacity listener state");
                        h.listening = true;
                        h.reset = true;
                    }
                    loop {
                        match listener.try_recv().await {
                            Ok(Some(note)) => {
                                let mut h = heard.lock().expect("capacity listener state");
                                h.nodes.insert(note.payload().to_string());
                            }
                            Ok(None) => {
                                // The connection dropped; notifications may be lost.
                                heard.lock().expect("capacity listener state").reset = true;
                            }
                            Err(err) => {
                                tracing::warn!(error = %err, "capacity view: listener failed; reconnecting");
                                break;
                            }
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, "capacity view: cannot connect to listen"),
        }
        heard.lock().expect("capacity listener state").listening = false;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
