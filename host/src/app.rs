//! The application state every handler and background job shares.

use std::path::PathBuf;
use std::sync::Arc;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::policy::PolicyHost;
use crate::store::Store;

/// Everything a request needs: the database, the one clock, the policy runtime and the
/// metrics registry.
/// Cheap to clone (handlers receive it as `State<Arc<App>>`).
pub struct App {
    pub store: Store,
    pub clock: Clock,
    pub metrics: Arc<Metrics>,
    /// The WebAssembly policy runtime.
    pub policy: Arc<PolicyHost>,
    /// Where the server keeps its files (SQLite database, admin key).
    pub data_dir: PathBuf,
    /// The providers' share of what tenants are charged, in basis points (0-10000).
    pub provider_share_bps: u32,
    /// How long a node watched by an agent may stay silent before it is lost.
    pub node_lost_after_ms: i64,
    /// What every node offers and what holds it, in memory ([`crate::capacity`]).
    pub capacity: Arc<crate::capacity::View>,
    /// Creates' placements written together ([`crate::booking::group`]).
    pub placements: crate::booking::group::Group,
    /// Pools' settings, offers' terms, IAM policies and plugin assignments, in memory
    /// ([`crate::settings`]).
    pub settings: crate::settings::Settings,
    /// This process's id among the replicas serving the database ([`crate::replicas`]).
    pub replica: String,
    /// The API keys this replica has authenticated ([`crate::iam::key_cache`]).
    pub keys: Arc<crate::iam::key_cache::KeyCache>,
}

impl App {
    pub fn new(
        store: Store,
        clock: Clock,
        policy: Arc<PolicyHost>,
        data_dir: PathBuf,
        provider_share_bps: u32,
        node_lost_after_ms: i64,
    ) -> Arc<App> {
        let capacity = Arc::new(crate::capacity::View::new(&store));
        let replica = crate::ids::new_id("rep", clock.now_ms());
        // Plugins' log lines carry the server's time and this replica's id.
        policy.logs().attach(clock.clone(), &replica);
        let metrics = Arc::new(Metrics::with_names(policy.names()));
        Arc::new(App {
            placements: crate::booking::group::Group::new(capacity.clone(), metrics.write_turn()),
            capacity,
            settings: crate::settings::Settings::default(),
            replica,
            keys: crate::iam::key_cache::KeyCache::new(&store),
            store,
            clock,
            metrics,
            policy,
            data_dir,
            provider_share_bps,
            node_lost_after_ms,
        })
    }

    /// Now, in epoch milliseconds, from the one clock.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}
