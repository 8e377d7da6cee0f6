//! Batched loading: what every node of a page needs is read in one query per kind, not one
//! per node. Loaders are made per operation and count the queries they run, which the
//! response reports as `extensions.loaderQueries`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll, Waker};

use async_graphql::Context;
use async_graphql::dataloader::{DataLoader, Loader};
use futures::StreamExt as _;
use futures::channel::mpsc::{self, UnboundedReceiver};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::task::ArcWake;
use sqlx::Row as _;

use super::limits;
use super::types::Booking;
use crate::App;
use crate::store::{flag, placeholders};

/// Most keys one query takes: every node of a full page, over two windows each.
const BATCH_KEYS: usize = 2 * limits::MAX_PAGE_SIZE as usize;

/// Queries the loaders of one operation ran.
#[derive(Clone, Default)]
pub struct QueryCount(Arc<AtomicUsize>);

impl QueryCount {
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// The loaders of one operation (or one WebSocket connection).
pub struct Loaders {
    bookings: DataLoader<BookingLoader>,
}

/// The batch loads of one operation, run in the operation's own task by [`Batches::beside`].
pub struct Batches(UnboundedReceiver<BoxFuture<'static, ()>>);

impl Loaders {
    /// Loaders whose batches run on the runtime (for WebSocket connections).
    pub fn spawned(app: Arc<App>) -> Loaders {
        Loaders::with(app, QueryCount::default(), |batch| {
            tokio::spawn(batch);
        })
    }

    /// Loaders whose batches run beside the operation in its task: a batch starts only
    /// when a pass over the operation's fields has asked for every key it needs, so the
    /// nodes of one page load together however long the pass takes.
    pub fn driven(app: Arc<App>, queries: QueryCount) -> (Loaders, Batches) {
        let (send, receive) = mpsc::unbounded();
        let loaders = Loaders::with(app, queries, move |batch| {
            // The receiver lives as long as the operation that holds these loaders.
            let _ = send.unbounded_send(batch);
        });
        (loaders, Batches(receive))
    }

    fn with(
        app: Arc<App>,
        queries: QueryCount,
        spawn: impl Fn(BoxFuture<'static, ()>) + Send + Sync + 'static,
    ) -> Loaders {
        Loaders {
            bookings: DataLoader::new(BookingLoader { app, queries }, spawn)
                .max_batch_size(BATCH_KEYS),
        }
    }
}

impl Batches {
    /// Runs `operation` and, in the same task, the batch loads it starts. Batches run only
    /// while the operation waits: when it merely yields mid-pass (large lists are resolved
    /// in slices), it goes on asking for keys first.
    pub async fn beside<F: Future>(self, operation: F) -> F::Output {
        let mut incoming = self.0;
        let mut running = FuturesUnordered::new();
        let mut operation = std::pin::pin!(operation);
        futures::future::poll_fn(|cx| {
            let watch = Arc::new(Yield {
                task: cx.waker().clone(),
                yielded: AtomicBool::new(false),
            });
            let waker = futures::task::waker(watch.clone());
            if let Poll::Ready(output) = operation
                .as_mut()
                .poll(&mut TaskContext::from_waker(&waker))
            {
                return Poll::Ready(output);
            }
            if watch.yielded.load(Ordering::Relaxed) {
                return Poll::Pending;
            }
            while let Poll::Ready(Some(batch)) = incoming.poll_next_unpin(cx) {
                running.push(batch);
            }
            while let Poll::Ready(Some(())) = running.poll_next_unpin(cx) {}
            Poll::Pending
        })
        .await
    }
}

/// The operation's waker, noting whether it was woken while being polled (it yielded).
struct Yield {
    task: Waker,
    yielded: AtomicBool,
}

impl ArcWake for Yield {
    fn wake_by_ref(this: &Arc<Self>) {
        this.yielded.store(true, Ordering::Relaxed);
        this.task.wake_by_ref();
    }
}

/// The bookings of `node_id` that overlap `[from, to)`, by start.
pub async fn bookings(
    ctx: &Context<'_>,
    node_id: &str,
    from: i64,
    to: i64,
) -> async_graphql::Result<Vec<Booking>> {
    let loaders = ctx.data::<Loaders>()?;
    let window = Window {
        node_id: node_id.to_string(),
        from,
        to,
    };
    Ok(loaders.bookings.load_one(window).await?.unwrap_or_default())
}

/// One node over one window.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    node_id: String,
    from: i64,
    to: i64,
}

/// Reads the bookings of every node asked for in one query over the union of the windows.
pub struct BookingLoader {
    app: Arc<App>,
    queries: QueryCount,
}

impl Loader<Window> for BookingLoader {
    type Value = Vec<Booking>;
    type Error = async_graphql::Error;

    async fn load(&self, keys: &[Window]) -> Result<HashMap<Window, Vec<Booking>>, Self::Error> {
        let (Some(from), Some(to)) = (
            keys.iter().map(|k| k.from).min(),
            keys.iter().map(|k| k.to).max(),
        ) else {
            return Ok(HashMap::new());
        };
        let nodes: BTreeSet<&str> = keys.iter().map(|k| k.node_id.as_str()).collect();
        let sql = format!(
            "SELECT reservation_id, node_id, unit_id, start_ms, end_ms, spot, active FROM bookings
             WHERE end_ms > $1 AND start_ms < $2 AND node_id IN ({})
             ORDER BY start_ms, unit_id, reservation_id",
            placeholders(3, nodes.len())
        );
        let mut query = sqlx::query(&sql).bind(from).bind(to);
        for node in &nodes {
            query = query.bind(*node);
        }
        self.queries.add();
        let rows = query
            .fetch_all(self.app.store.pool())
            .await
            .map_err(crate::Error::from)?;
        let mut by_node: HashMap<String, Vec<Booking>> = HashMap::new();
        for row in &rows {
            by_node
                .entry(row.get("node_id"))
                .or_default()
                .push(Booking {
                    reservation_id: row.get("reservation_id"),
                    unit_id: row.get("unit_id"),
                    start: row.get("start_ms"),
                    end: row.get("end_ms"),
                    spot: flag(row, "spot"),
                    active: flag(row, "active"),
                });
        }
        Ok(keys
            .iter()
            .map(|key| {
                let overlapping = by_node
                    .get(&key.node_id)
                    .map(|all| {
                        all.iter()
                            .filter(|b| b.end > key.from && b.start < key.to)
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                (key.clone(), overlapping)
            })
            .collect())
    }
}
