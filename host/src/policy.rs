//! Policies as WebAssembly: the sandboxed runtime that runs placement, preemption and
//! spend-limit components, the registry operators upload them to, and their assignment to
//! pools.
//!
//! One [`wasmtime::Engine`] with the pooling allocator and epoch interruption; components
//! checked for what they import and export before they are compiled ([`imports`]),
//! compiled once per content hash (one compile at a time per hash, at most
//! [`COMPILE_SLOTS`] at once), cached by id in memory and (precompiled) on disk, so a
//! decision never reads or hashes a plugin's bytes; instances made from an `InstancePre`
//! and kept warm between decisions of the same plugin and config (an instance that fails a
//! decision in any way is thrown away); a cap on the total linear memory of each instance.
//! A plugin sees WASI with no environment, no arguments, no stdio, no network, and only its
//! read-only config directory at `/config`, plus the host's `log` (capped per call, tagged
//! with the plugin's name).
//!
//! **The deadline bounds the whole decision.** A decision — making an instance (its start
//! functions included) and the call — is one future, run with `instantiate_async` and
//! `call_async` on a fiber, under `tokio::time::timeout`. WASI is linked asynchronously, so
//! a plugin blocked in a host call (a sleep through `wasi:clocks` and `wasi:io/poll`) is
//! parked on the host's timer, and the timeout drops the future there. A plugin spinning
//! in its own code meets the epoch check at every tick ([`EPOCH_TICK`]): past the deadline
//! the epoch callback traps it, and before it the callback yields, so the timeout is
//! checked even while the plugin computes. Either way the failure kind is `deadline` and
//! the instance is dropped. The entry points ([`PolicyHost::place`], ...) are that future,
//! awaited on the caller's async worker: since a computing plugin yields at every tick, it
//! never holds a worker for longer than a tick, and no decision needs a thread of its own.
//!
//! Whatever a plugin does, it fails only its own decision.

pub mod assignment;
mod bindings;
pub mod imports;
pub mod logs;
pub mod placer;
pub mod registry;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker, ResourceTable, TypedFunc};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    UpdateDeadline,
};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use crate::placer::{FactsOf, Failure, FailureKind, NodeFacts, SpotCandidate};
use bindings::placer::orl::policy::types as wit;

/// Default time a decision may take.
pub const DEFAULT_DEADLINE_MS: u64 = 50;
/// Default cap on all linear memory of one plugin instance.
pub const DEFAULT_MEMORY_BYTES: usize = 64 << 20;
/// The epoch advances this often; a running plugin checks its deadline at every tick.
const EPOCH_TICK: Duration = Duration::from_millis(1);
/// Warm instances kept per plugin and config, and in all. An idle instance keeps the linear
/// memory it grew to (up to the cap), so few are kept: decisions of one pool are serialized
/// by the pool lock, so one or two per key serve it.
const IDLE_PER_KEY: usize = 2;
const IDLE_TOTAL: usize = 16;
/// Components compiled at once. A compile already uses every core (functions are compiled
/// in parallel) and an interpreted-language component needs gigabytes while it compiles.
pub const COMPILE_SLOTS: usize = 2;

/// The worlds a plugin may implement.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum World {
    Placer,
    Preemptor,
    SpendGuard,
}

impl World {
    pub fn as_str(self) -> &'static str {
        match self {
            World::Placer => "placer",
            World::Preemptor => "preemptor",
            World::SpendGuard => "spend-guard",
        }
    }

    pub fn parse(s: &str) -> Option<World> {
        [World::Placer, World::Preemptor, World::SpendGuard]
            .into_iter()
            .find(|w| w.as_str() == s)
    }
}

/// What a running instance may use, and what it did.
pub struct PluginState {
    plugin_id: String,
    /// The name the plugin was uploaded under, which its log lines carry.
    plugin_name: String,
    wasi: WasiCtx,
    table: ResourceTable,
    limits: MemoryCap,
    /// When the running decision's deadline passes.
    expires: Instant,
    log: bindings::LogBudget,
    /// Where the plugin's admitted log lines are kept ([`logs`]).
    logs: Arc<logs::PluginLogs>,
}

impl PluginState {
    /// Ends a call's log budget, saying once how many lines past the cap were dropped.
    fn end_call(&mut self) {
        let dropped = self.log.reset();
        if dropped > 0 {
            tracing::warn!(
                plugin = %self.plugin_name,
                plugin_id = %self.plugin_id,
                dropped,
                "a plugin call logged past its cap of {} lines or {} bytes; the rest were dropped",
                bindings::LOG_LINES_PER_CALL,
                bindings::LOG_BYTES_PER_CALL,
            );
            self.logs.push(
                &self.plugin_id,
                logs::Level::Warn,
                &format!(
                    "{dropped} lines of this call were dropped: a call may log {} lines or {} bytes",
                    bindings::LOG_LINES_PER_CALL,
                    bindings::LOG_BYTES_PER_CALL,
                ),
            );
        }
    }
}

/// The error the epoch callback traps a plugin with once its deadline has passed.
#[derive(Debug)]
struct DeadlinePassed;

impl std::fmt::Display for DeadlinePassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the decision's deadline passed")
    }
}

impl std::error::Error for DeadlinePassed {}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Caps the total of all linear memories of one instance: every creation and growth of
/// any of its memories counts against one budget (a per-memory cap would let a component
/// with several memories exceed it).
struct MemoryCap {
    limit: usize,
    total: usize,
    hit: bool,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.total + desired.saturating_sub(current);
        if total > self.limit {
            self.hit = true;
            return Ok(false);
        }
        self.total = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// The versions of the `orl:policy` package the host serves, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, utoipa::ToSchema)]
pub enum PolicyVersion {
    #[serde(rename = "orl:policy@0.1.0")]
    V0_1,
    #[serde(rename = "orl:policy@0.2.0")]
    V0_2,
}

impl PolicyVersion {
    /// Every version served, oldest first.
    pub const ALL: [PolicyVersion; 2] = [PolicyVersion::V0_1, PolicyVersion::V0_2];

    /// The package and version, as a component names it: `orl:policy@0.2.0`.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyVersion::V0_1 => "orl:policy@0.1.0",
            PolicyVersion::V0_2 => "orl:policy@0.2.0",
        }
    }

    pub fn parse(s: &str) -> Option<PolicyVersion> {
        PolicyVersion::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// A compiled plugin, ready to instantiate.
pub struct Loaded {
    pub id: String,
    pub world: World,
    /// The version of `orl:policy` whose world it implements.
    pub version: PolicyVersion,
    pre: Pre,
}

/// A plugin's `InstancePre` with the export indices of its world resolved, by world and
/// version.
enum Pre {
    Placer(bindings::placer::PlacerPre<PluginState>),
    Preemptor(bindings::preemptor::PreemptorPre<PluginState>),
    SpendGuard(bindings::spend_guard::SpendGuardPre<PluginState>),
    PlacerV0_1(bindings::v0_1::placer::PlacerPre<PluginState>),
    PreemptorV0_1(bindings::v0_1::preemptor::PreemptorPre<PluginState>),
    SpendGuardV0_1(bindings::v0_1::spend_guard::SpendGuardPre<PluginState>),
}

/// An instance's exports, typed by world and version.
enum Bound {
    Placer(bindings::placer::Placer),
    Preemptor(bindings::preemptor::Preemptor),
    SpendGuard(bindings::spend_guard::SpendGuard),
    PlacerV0_1(bindings::v0_1::placer::Placer),
    PreemptorV0_1(bindings::v0_1::preemptor::Preemptor),
    SpendGuardV0_1(bindings::v0_1::spend_guard::SpendGuard),
}

/// An instance that answered its last decision, ready for the next one of the same plugin
/// and config. Its linear memory (and whatever the plugin keeps in it) persists between
/// decisions; a policy must not depend on that.
struct Warm {
    store: Store<PluginState>,
    bound: Bound,
}

/// The idle warm instances by plugin id, then config (as compact JSON; empty for none), so
/// that a decision on a warm instance touches no file and looks its key up without copying.
struct Idle<W = Warm> {
    by_plugin: HashMap<String, HashMap<String, Vec<W>>>,
    count: usize,
}

impl<W> Default for Idle<W> {
    fn default() -> Self {
        Idle {
            by_plugin: HashMap::new(),
            count: 0,
        }
    }
}

impl<W> Idle<W> {
    fn take(&mut self, plugin: &str, config: &str) -> Option<W> {
        let warm = self.by_plugin.get_mut(plugin)?.get_mut(config)?.pop()?;
        self.count -= 1;
        Some(warm)
    }

    /// Keeps `warm` unless as many are kept for its key, or in all, as the limits allow.
    fn put(&mut self, plugin: &str, config: &str, warm: W) {
        if self.count >= IDLE_TOTAL {
            return;
        }
        if let Some(kept) = self
            .by_plugin
            .get_mut(plugin)
            .and_then(|c| c.get_mut(config))
        {
            if kept.len() < IDLE_PER_KEY {
                kept.push(warm);
                self.count += 1;
            }
            return;
        }
        (self.by_plugin.entry(plugin.to_owned()).or_default())
            .insert(config.to_owned(), vec![warm]);
        self.count += 1;
    }
}

/// The thread that advances the engine's epoch every [`EPOCH_TICK`], and how many
/// decisions are running: it ticks only while one is, and sleeps otherwise. Deadlines are
/// counted from the epoch at a call's start, so a pause between calls changes none.
struct Ticker {
    running: Arc<AtomicUsize>,
    thread: std::thread::Thread,
}

impl Ticker {
    /// Keeps the epoch advancing until the answer is dropped.
    fn tick(&self) -> Ticking<'_> {
        if self.running.fetch_add(1, Ordering::AcqRel) == 0 {
            self.thread.unpark();
        }
        Ticking(self)
    }
}

struct Ticking<'a>(&'a Ticker);

impl Drop for Ticking<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The runtime: engine, linker, and the compiled plugins.
pub struct PolicyHost {
    engine: Engine,
    ticker: Ticker,
    linker: Linker<PluginState>,
    loaded: Mutex<HashMap<String, Arc<Loaded>>>,
    /// Loads in progress by id: every caller of one id waits for the one load.
    flights: Mutex<HashMap<String, Arc<Flight>>>,
    compile_slots: Slots,
    /// Components compiled by Cranelift since start (not those read back from disk).
    compiles: AtomicU64,
    /// The names and versions plugins were uploaded under, for their log lines and metrics.
    names: Arc<Names>,
    idle: Mutex<Idle>,
    /// The last log lines of each plugin this process ran.
    logs: Arc<logs::PluginLogs>,
    /// Where precompiled components are kept; `None` when profiling, because `perf` names
    /// guest functions only in code compiled in memory.
    cache_dir: Option<PathBuf>,
    config_root: PathBuf,
    /// The default policies shipped inside the binary, by id: loaded, and so hashed, once
    /// at start.
    built_ins: OnceLock<Vec<BuiltIn>>,
}

/// The name and version each plugin was uploaded under, by id (a built-in: its name and
/// the server's version). One component is one plugin, so an id has one of each.
#[derive(Debug, Default)]
pub struct Names(Mutex<HashMap<String, (String, String)>>);

impl Names {
    pub fn set(&self, id: &str, name: &str, version: &str) {
        (self.0.lock().expect("plugin names"))
            .insert(id.to_owned(), (name.to_owned(), version.to_owned()));
    }

    /// The name and version of plugin `id`, when this process knows them.
    pub fn get(&self, id: &str) -> Option<(String, String)> {
        (self.0.lock().expect("plugin names")).get(id).cloned()
    }
}

/// A default policy shipped inside the binary, loaded when the host starts.
pub struct BuiltIn {
    /// Its name, as `GET /v1/plugins` lists it.
    pub name: &'static str,
    /// The component's size in bytes.
    pub size: usize,
    /// The compiled component: its id (content hash) and world.
    pub loaded: Arc<Loaded>,
}

/// One load of one id, shared by every caller that asked for it meanwhile.
type Flight = OnceLock<Result<Arc<Loaded>, Failure>>;

/// A counting semaphore for blocking threads (loads run on the blocking pool).
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn new(count: usize) -> Slots {
        Slots {
            free: Mutex::new(count),
            freed: Condvar::new(),
        }
    }

    /// Waits for a free slot; it is given back when the guard drops.
    fn take(&self) -> SlotGuard<'_> {
        let mut free = self.free.lock().expect("compile slots");
        while *free == 0 {
            free = self.freed.wait(free).expect("compile slots");
        }
        *free -= 1;
        SlotGuard(self)
    }
}

struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().expect("compile slots") += 1;
        self.0.freed.notify_one();
    }
}

/// The default policies, built from `plugins/` for wasm32-wasip2 by the build script.
pub const DEFAULT_PLACER_WASM: &[u8] = include_bytes!(env!("ORL_PLACER_DEFAULT_WASM"));
pub const DEFAULT_SPEND_GUARD_WASM: &[u8] = include_bytes!(env!("ORL_SPEND_GUARD_DEFAULT_WASM"));
/// The default preemption component (`plugins/preemptor-default`), built for wasm32-wasip2.
pub const DEFAULT_PREEMPTOR_WASM: &[u8] = include_bytes!(env!("ORL_PREEMPTOR_DEFAULT_WASM"));

/// The built-in policies by name, as `GET /v1/plugins` lists them.
pub const BUILT_INS: [(&str, &[u8]); 3] = [
    ("placer-default", DEFAULT_PLACER_WASM),
    ("preemptor-default", DEFAULT_PREEMPTOR_WASM),
    ("spend-guard-default", DEFAULT_SPEND_GUARD_WASM),
];

/// `sha256:<hex>` of a component's bytes: its id.
pub fn content_id(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

impl PolicyHost {
    /// Starts the engine (and its epoch ticker) and loads the built-in default policies.
    /// Precompiled artifacts go to `data_dir/plugins`, plugin config to
    /// `data_dir/plugin-config/<plugin>/<config>`.
    pub fn new(data_dir: &Path) -> anyhow::Result<Arc<PolicyHost>> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        let profiling = std::env::var_os("ORL_WASM_PERFMAP").is_some();
        if profiling {
            // Lets `perf` name plugin functions (/tmp/perf-<pid>.map).
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let mut pooling = PoolingAllocationConfig::default();
        pooling.total_component_instances(256);
        pooling.total_core_instances(512);
        pooling.total_memories(512);
        pooling.total_tables(512);
        pooling.max_memory_size(DEFAULT_MEMORY_BYTES.max(256 << 20));
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = Engine::new(&config)
            .map_err(|e| anyhow::Error::from(e).context("starting the WebAssembly engine"))?;
        let ticks = engine.weak();
        let running = Arc::new(AtomicUsize::new(0));
        let calls = running.clone();
        let thread = std::thread::Builder::new()
            .name("orl-epoch".into())
            .spawn(move || {
                while let Some(engine) = ticks.upgrade() {
                    if calls.load(Ordering::Acquire) == 0 {
                        // No decision runs: sleep until one starts (or the engine is gone).
                        drop(engine);
                        std::thread::park_timeout(Duration::from_secs(1));
                        continue;
                    }
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .context("starting the epoch ticker")?;
        let ticker = Ticker {
            running,
            thread: thread.thread().clone(),
        };
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| anyhow::Error::from(e).context("linking WASI"))?;
        bindings::placer::orl::policy::log::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| anyhow::Error::from(e).context("linking log"))?;
        bindings::v0_1::placer::orl::policy::log::add_to_linker::<
            _,
            wasmtime::component::HasSelf<_>,
        >(&mut linker, |s| s)
        .map_err(|e| anyhow::Error::from(e).context("linking log@0.1.0"))?;
        let cache_dir = data_dir.join("plugins");
        let config_root = data_dir.join("plugin-config");
        // Precompiled artifacts are loaded as machine code: only the owner may write them.
        for dir in [&cache_dir, &config_root] {
            create_private_dir(dir)?;
        }
        let host = PolicyHost {
            engine,
            ticker,
            linker,
            loaded: Mutex::new(HashMap::new()),
            flights: Mutex::new(HashMap::new()),
            compile_slots: Slots::new(COMPILE_SLOTS),
            compiles: AtomicU64::new(0),
            names: Arc::default(),
            idle: Mutex::new(Idle::default()),
            logs: Arc::default(),
            cache_dir: (!profiling).then_some(cache_dir),
            config_root,
            built_ins: OnceLock::new(),
        };
        let mut built_ins = Vec::new();
        for (name, bytes) in BUILT_INS {
            let loaded = host
                .load(bytes)
                .map_err(|e| anyhow::anyhow!("the built-in {name}: {}", e.message))?;
            host.set_name(&loaded.id, name, env!("CARGO_PKG_VERSION"));
            built_ins.push(BuiltIn {
                name,
                size: bytes.len(),
                loaded,
            });
        }
        built_ins.sort_by(|a, b| a.loaded.id.cmp(&b.loaded.id));
        let _ = host.built_ins.set(built_ins);
        Ok(Arc::new(host))
    }

    /// The default policies shipped inside the binary, by id, as loaded at start: their
    /// ids and sizes are known without hashing their bytes again.
    pub fn built_ins(&self) -> &[BuiltIn] {
        self.built_ins.get().map(Vec::as_slice).unwrap_or_default()
    }

    /// The built-in policy `id`, if it is one.
    pub fn built_in(&self, id: &str) -> Option<&BuiltIn> {
        self.built_ins().iter().find(|b| b.loaded.id == id)
    }

    /// The built-in policy of `world`.
    pub fn built_in_of(&self, world: World) -> Option<&BuiltIn> {
        self.built_ins().iter().find(|b| b.loaded.world == world)
    }

    /// The default component of `world` shipped inside the binary.
    pub fn default_for(&self, world: World) -> Option<Arc<Loaded>> {
        self.built_in_of(world).map(|b| b.loaded.clone())
    }

    /// The default placement component shipped inside the binary.
    pub fn default_placer(&self) -> Arc<Loaded> {
        self.default_for(World::Placer)
            .expect("the built-in placer is loaded at start")
    }

    /// The compiled plugin `id`, when this process has loaded it: no bytes read, none hashed.
    pub fn cached(&self, id: &str) -> Option<Arc<Loaded>> {
        self.loaded.lock().expect("plugin cache").get(id).cloned()
    }

    /// Components compiled by Cranelift since start (artifacts read back from disk are not
    /// counted).
    pub fn compiles(&self) -> u64 {
        self.compiles.load(Ordering::Relaxed)
    }

    /// Records the name and version plugin `id` was uploaded under (a built-in: its name
    /// and the server's version), which its log lines and its metrics carry.
    pub fn set_name(&self, id: &str, name: &str, version: &str) {
        self.names.set(id, name, version);
    }

    /// The names and versions of the plugins this process knows, by id: what the metrics
    /// label each plugin's series with.
    pub fn names(&self) -> Arc<Names> {
        self.names.clone()
    }

    /// The last log lines of each plugin this process ran.
    pub fn logs(&self) -> &logs::PluginLogs {
        &self.logs
    }

    fn name_of(&self, id: &str) -> String {
        (self.names.get(id)).map_or_else(|| id.to_owned(), |(name, _)| name)
    }

    /// Compiles (or fetches from the caches) the component `bytes` and checks it implements
    /// one world with no import outside it. What it imports and exports is checked before
    /// anything is compiled; callers loading the same bytes at once share one load. The
    /// error says what is wrong.
    pub fn load(&self, bytes: &[u8]) -> Result<Arc<Loaded>, Failure> {
        let id = content_id(bytes);
        if let Some(loaded) = self.cached(&id) {
            return Ok(loaded);
        }
        imports::check(bytes).map_err(|message| Failure {
            plugin_id: id.clone(),
            kind: FailureKind::InvalidAnswer,
            message,
        })?;
        let flight = (self.flights.lock().expect("plugin loads"))
            .entry(id.clone())
            .or_default()
            .clone();
        let result = flight
            .get_or_init(|| match self.cached(&id) {
                Some(loaded) => Ok(loaded),
                None => self.load_uncached(&id, bytes),
            })
            .clone();
        let mut flights = self.flights.lock().expect("plugin loads");
        if flights.get(&id).is_some_and(|f| Arc::ptr_eq(f, &flight)) {
            flights.remove(&id);
        }
        result
    }

    fn load_uncached(&self, id: &str, bytes: &[u8]) -> Result<Arc<Loaded>, Failure> {
        let refuse = |message: String| Failure {
            plugin_id: id.to_owned(),
            kind: FailureKind::InvalidAnswer,
            message,
        };
        let component = self
            .compile(id, bytes)
            .map_err(|e| refuse(format!("not a WebAssembly component: {e:#}")))?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            refuse(format!("the component needs imports a plugin may not use (only WASI without network and orl:policy/log): {e:#}"))
        })?;
        // The newest version first; the export types tell the versions apart.
        use bindings::v0_1;
        use {PolicyVersion::*, World::*};
        let (world, version, pre) = if let Ok(p) = bindings::placer::PlacerPre::new(pre.clone()) {
            (Placer, V0_2, Pre::Placer(p))
        } else if let Ok(p) = bindings::preemptor::PreemptorPre::new(pre.clone()) {
            (Preemptor, V0_2, Pre::Preemptor(p))
        } else if let Ok(p) = bindings::spend_guard::SpendGuardPre::new(pre.clone()) {
            (SpendGuard, V0_2, Pre::SpendGuard(p))
        } else if let Ok(p) = v0_1::placer::PlacerPre::new(pre.clone()) {
            (Placer, V0_1, Pre::PlacerV0_1(p))
        } else if let Ok(p) = v0_1::preemptor::PreemptorPre::new(pre.clone()) {
            (Preemptor, V0_1, Pre::PreemptorV0_1(p))
        } else if let Ok(p) = v0_1::spend_guard::SpendGuardPre::new(pre) {
            (SpendGuard, V0_1, Pre::SpendGuardV0_1(p))
        } else {
            return Err(refuse(format!(
                "the component exports none of the worlds placer, preemptor or spend-guard of {}",
                imports::served_packages()
            )));
        };
        let loaded = Arc::new(Loaded {
            id: id.to_owned(),
            world,
            version,
            pre,
        });
        self.loaded
            .lock()
            .expect("plugin cache")
            .insert(id.to_owned(), loaded.clone());
        Ok(loaded)
    }

    /// Compiles once per content hash: a precompiled artifact on disk is reused across
    /// restarts; otherwise Cranelift compiles (in one of the compile slots) and the artifact
    /// is saved.
    fn compile(&self, id: &str, bytes: &[u8]) -> anyhow::Result<Component> {
        let Some(cache_dir) = &self.cache_dir else {
            let _slot = self.compile_slots.take();
            self.compiles.fetch_add(1, Ordering::Relaxed);
            let component = Component::new(&self.engine, bytes);
            return_compile_memory();
            return Ok(component?);
        };
        let path = cache_dir.join(format!("{}.cwasm", id.trim_start_matches("sha256:")));
        if path.exists() {
            match deserialize(&self.engine, &path) {
                Ok(component) => return Ok(component),
                Err(err) => {
                    tracing::warn!(error = %err, path = %path.display(), "recompiling a stale precompiled plugin")
                }
            }
        }
        let artifact = {
            let _slot = self.compile_slots.take();
            self.compiles.fetch_add(1, Ordering::Relaxed);
            let artifact = self.engine.precompile_component(bytes);
            return_compile_memory();
            artifact?
        };
        let tmp = path.with_extension(format!("tmp-{}", crate::ids::new_id("cw", 0)));
        std::fs::write(&tmp, &artifact)?;
        drop(artifact);
        std::fs::rename(&tmp, &path)?;
        deserialize(&self.engine, &path)
    }

    /// The config directory a plugin sees at `/config` for one pool's `config`: keyed by
    /// plugin and config content, so pools sharing a plugin with different configs never
    /// see each other's, and a directory never changes once written.
    fn config_dir(
        &self,
        plugin_id: &str,
        config: Option<&serde_json::Value>,
    ) -> anyhow::Result<PathBuf> {
        let text = config.map(serde_json::to_string_pretty).transpose()?;
        let key = hex::encode(Sha256::digest(text.as_deref().unwrap_or("").as_bytes()));
        let dir = self
            .config_root
            .join(plugin_id.trim_start_matches("sha256:"))
            .join(&key[..16]);
        if !dir.exists() {
            let tmp = self
                .config_root
                .join(format!("tmp-{}", crate::ids::new_id("cfg", 0)));
            std::fs::create_dir_all(&tmp)?;
            if let Some(text) = &text {
                std::fs::write(tmp.join("config.json"), text)?;
            }
            std::fs::create_dir_all(dir.parent().expect("has a parent"))?;
            if std::fs::rename(&tmp, &dir).is_err() {
                // Another decision wrote the same directory first.
                std::fs::remove_dir_all(&tmp)?;
            }
        }
        Ok(dir)
    }

    /// A store for a new instance of `loaded`: no environment, no stdio, no network, the
    /// config directory `dir` read-only at `/config`, the memory cap, and the deadline
    /// `expires` checked at every epoch tick.
    fn new_store(
        &self,
        loaded: &Loaded,
        dir: &Path,
        memory_bytes: usize,
        expires: Instant,
    ) -> anyhow::Result<Store<PluginState>> {
        let mut wasi = WasiCtx::builder();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        wasi.preopened_dir(dir, "/config", FsPerms::ReadOnly)?;
        let state = PluginState {
            plugin_id: loaded.id.clone(),
            plugin_name: self.name_of(&loaded.id),
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: MemoryCap {
                limit: memory_bytes,
                total: 0,
                hit: false,
            },
            expires,
            log: bindings::LogBudget::default(),
            logs: self.logs.clone(),
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().expires {
                Err(wasmtime::Error::new(DeadlinePassed))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        store.set_epoch_deadline(1);
        Ok(store)
    }

    /// A new instance of `loaded` for one decision, its start functions run within the
    /// decision's deadline.
    async fn fresh(
        &self,
        loaded: &Loaded,
        config: Option<&serde_json::Value>,
        expires: Instant,
        deadline_ms: u64,
    ) -> Result<Warm, Failure> {
        let prepare = |e: anyhow::Error| Failure {
            plugin_id: loaded.id.clone(),
            kind: FailureKind::Trap,
            message: format!("preparing the instance: {e:#}"),
        };
        let dir = self.config_dir(&loaded.id, config).map_err(prepare)?;
        let mut store = self
            .new_store(loaded, &dir, DEFAULT_MEMORY_BYTES, expires)
            .map_err(prepare)?;
        match bind(&loaded.pre, &mut store).await {
            Ok(bound) => Ok(Warm { store, bound }),
            Err(err) => Err(failure(loaded, store.data_mut(), &err, deadline_ms)),
        }
    }

    /// Runs `decision` on a warm instance of `loaded` (a new one when none is idle), turning
    /// a trap, a missed deadline or the memory cap into a [`Failure`] of that plugin. The
    /// deadline covers making the instance as well as the call, whatever the plugin does
    /// (see the module documentation). An instance that answered goes back to the idle
    /// set; one that failed is dropped.
    async fn run<D: Decision>(
        &self,
        loaded: &Loaded,
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
        decision: D,
    ) -> Result<D::Answer, Failure> {
        let _ticking = self.ticker.tick();
        let deadline = Duration::from_millis(deadline_ms.max(1));
        let expires = Instant::now() + deadline;
        let config_key = config.map(serde_json::Value::to_string).unwrap_or_default();
        let idle = (self.idle.lock().expect("idle instances")).take(&loaded.id, &config_key);
        let work = async {
            let mut warm = match idle {
                Some(mut warm) => {
                    warm.store.data_mut().expires = expires;
                    warm.store.set_epoch_deadline(1);
                    warm
                }
                None => self.fresh(loaded, config, expires, deadline_ms).await?,
            };
            let Warm { store, bound } = &mut warm;
            match decision.call(store, bound).await {
                Ok(answer) => Ok((warm, answer)),
                Err(err) => Err(failure(loaded, warm.store.data_mut(), &err, deadline_ms)),
            }
        };
        match tokio::time::timeout(deadline, work).await {
            Ok(Ok((mut warm, answer))) => {
                warm.store.data_mut().end_call();
                (self.idle.lock().expect("idle instances")).put(&loaded.id, &config_key, warm);
                Ok(answer)
            }
            Ok(Err(failure)) => Err(failure),
            Err(_elapsed) => Err(Failure {
                plugin_id: loaded.id.clone(),
                kind: FailureKind::Deadline,
                message: format!("did not answer within {deadline_ms} ms"),
            }),
        }
    }

    /// Runs the placer `loaded`. `facts` is asked for the candidate nodes' names, regions
    /// and labels only when the plugin's version has them.
    pub async fn place(
        &self,
        loaded: &Loaded,
        request: &orl_placer_default::Request,
        candidates: &orl_placer_default::Candidates,
        facts: FactsOf<'_>,
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
    ) -> Result<Result<orl_placer_default::Placement, String>, Failure> {
        let req = placer::request_to_wit(request);
        let facts = facts_for(loaded, candidates, facts);
        let candidates = placer::CandidatesRef::of(candidates, &facts);
        let answer = (self.run(loaded, config, deadline_ms, Place(&req, &candidates))).await?;
        Ok(answer.map(|p| orl_placer_default::Placement {
            node: p.node,
            units: p.units,
        }))
    }

    /// Runs the preemptor `loaded`: the indices of the spot bookings to
    /// terminate, or why nothing can make room.
    #[allow(clippy::too_many_arguments)] // the call's inputs, then how to run it
    pub async fn preempt(
        &self,
        loaded: &Loaded,
        request: &orl_placer_default::Request,
        candidates: &orl_placer_default::Candidates,
        facts: FactsOf<'_>,
        spot: &[SpotCandidate],
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
    ) -> Result<Result<Vec<u32>, String>, Failure> {
        let req = placer::request_to_wit(request);
        let facts = facts_for(loaded, candidates, facts);
        let candidates = placer::CandidatesRef::of(candidates, &facts);
        let spot: Vec<_> = spot.iter().map(placer::spot_to_wit).collect();
        self.run(
            loaded,
            config,
            deadline_ms,
            ChooseVictims(&req, &candidates, &spot),
        )
        .await
    }

    /// Runs the spend-guard `loaded`: `Ok(Ok(()))` allows the charge.
    pub async fn spend(
        &self,
        loaded: &Loaded,
        charge: &orl_spend_guard_default::Charge,
        budget: &orl_spend_guard_default::Budget,
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
    ) -> Result<Result<(), String>, Failure> {
        let charge = wit::Charge {
            amount_minor: charge.amount_minor,
            gpu_count: charge.gpu_count,
            duration_seconds: charge.duration_seconds,
            price_per_gpu_hour_minor: charge.price_per_gpu_hour_minor,
        };
        let budget = wit::Budget {
            limit_minor: budget.limit_minor,
            spent_minor: budget.spent_minor,
            committed_minor: budget.committed_minor,
        };
        (self.run(loaded, config, deadline_ms, Decide(charge, budget))).await
    }
}

/// The node facts of `candidates` when `loaded` reads them (0.2 and later), none otherwise.
fn facts_for(
    loaded: &Loaded,
    candidates: &orl_placer_default::Candidates,
    facts: FactsOf<'_>,
) -> NodeFacts {
    match loaded.version {
        PolicyVersion::V0_1 => NodeFacts::default(),
        PolicyVersion::V0_2 => facts(candidates),
    }
}

/// Makes the instance of `pre` in `store`, running its start functions.
async fn bind(pre: &Pre, store: &mut Store<PluginState>) -> wasmtime::Result<Bound> {
    // The exports the host calls with its own borrowed types are checked against those
    // types here, once per instance, so that a decision need not (see `place_export`).
    Ok(match pre {
        Pre::Placer(pre) => {
            let placer = pre.instantiate_async(&mut *store).await?;
            (placer.func_place().func())
                .typed::<placer::PlaceParams<'_>, placer::PlaceResults>(&*store)?;
            Bound::Placer(placer)
        }
        Pre::Preemptor(pre) => {
            let preemptor = pre.instantiate_async(&mut *store).await?;
            (preemptor.func_choose_victims().func())
                .typed::<placer::VictimsParams<'_>, placer::VictimsResults>(&*store)?;
            Bound::Preemptor(preemptor)
        }
        Pre::SpendGuard(pre) => Bound::SpendGuard(pre.instantiate_async(&mut *store).await?),
        Pre::PlacerV0_1(pre) => {
            let placer = pre.instantiate_async(&mut *store).await?;
            (placer.func_place().func())
                .typed::<placer::PlaceParamsV0_1<'_>, placer::PlaceResults>(&*store)?;
            Bound::PlacerV0_1(placer)
        }
        Pre::PreemptorV0_1(pre) => {
            let preemptor = pre.instantiate_async(&mut *store).await?;
            (preemptor.func_choose_victims().func())
                .typed::<placer::VictimsParamsV0_1<'_>, placer::VictimsResults>(&*store)?;
            Bound::PreemptorV0_1(preemptor)
        }
        Pre::SpendGuardV0_1(pre) => {
            Bound::SpendGuardV0_1(pre.instantiate_async(&mut *store).await?)
        }
    })
}

/// How a plugin failed, from the error its instance or call ended with and what its store
/// saw. A trap's message leads with its cause, then where it happened.
fn failure(
    loaded: &Loaded,
    state: &mut PluginState,
    err: &wasmtime::Error,
    deadline_ms: u64,
) -> Failure {
    state.end_call();
    let (kind, message) = if state.limits.hit {
        (
            FailureKind::Memory,
            format!(
                "exceeded its memory cap of {} MiB",
                DEFAULT_MEMORY_BYTES >> 20
            ),
        )
    } else if err.downcast_ref::<DeadlinePassed>().is_some()
        || matches!(
            err.downcast_ref::<wasmtime::Trap>(),
            Some(wasmtime::Trap::Interrupt)
        )
    {
        (
            FailureKind::Deadline,
            format!("did not answer within {deadline_ms} ms"),
        )
    } else {
        (FailureKind::Trap, trap_message(err))
    };
    Failure {
        plugin_id: loaded.id.clone(),
        kind,
        message,
    }
}

/// Longest trap message kept.
const TRAP_MESSAGE_CHARS: usize = 2000;

/// `err` with its root cause first, then the context around it (the wasm backtrace last),
/// cut to [`TRAP_MESSAGE_CHARS`].
fn trap_message(err: &wasmtime::Error) -> String {
    let mut chain: Vec<String> = err.chain().map(ToString::to_string).collect();
    let mut message = chain.pop().unwrap_or_default();
    for context in chain.iter().rev() {
        message.push_str("; ");
        message.push_str(context);
    }
    if message.chars().count() > TRAP_MESSAGE_CHARS {
        message = message.chars().take(TRAP_MESSAGE_CHARS).collect();
        message.push('…');
    }
    message
}

/// One call of a world's export on a bound instance.
trait Decision: Send {
    type Answer: Send;

    fn call(
        self,
        store: &mut Store<PluginState>,
        bound: &Bound,
    ) -> impl std::future::Future<Output = wasmtime::Result<Self::Answer>> + Send;
}

/// The placer's `place`.
struct Place<'a>(&'a wit::Request, &'a placer::CandidatesRef<'a>);

impl Decision for Place<'_> {
    type Answer = Result<wit::Placement, String>;

    async fn call(
        self,
        store: &mut Store<PluginState>,
        bound: &Bound,
    ) -> wasmtime::Result<Self::Answer> {
        let (req, candidates) = (self.0, self.1);
        let answer = match bound {
            Bound::Placer(placer) => {
                checked_in_bind::<placer::PlaceParams<'_>, placer::PlaceResults>(
                    placer.func_place().func(),
                )
                .call_async(store, (req, candidates))
                .await?
                .0
            }
            Bound::PlacerV0_1(placer) => {
                checked_in_bind::<placer::PlaceParamsV0_1<'_>, placer::PlaceResults>(
                    placer.func_place().func(),
                )
                .call_async(store, (req, &candidates.v0_1()))
                .await?
                .0
            }
            _ => return Err(wasmtime::Error::msg("the plugin is not a placer")),
        };
        Ok(answer)
    }
}

/// The preemptor's `choose-victims`.
struct ChooseVictims<'a>(
    &'a wit::Request,
    &'a placer::CandidatesRef<'a>,
    &'a [wit::SpotBooking],
);

impl Decision for ChooseVictims<'_> {
    type Answer = Result<Vec<u32>, String>;

    async fn call(
        self,
        store: &mut Store<PluginState>,
        bound: &Bound,
    ) -> wasmtime::Result<Self::Answer> {
        let (req, candidates, spot) = (self.0, self.1, self.2);
        let answer = match bound {
            Bound::Preemptor(preemptor) => {
                checked_in_bind::<placer::VictimsParams<'_>, placer::VictimsResults>(
                    preemptor.func_choose_victims().func(),
                )
                .call_async(store, (req, candidates, spot))
                .await?
                .0
            }
            Bound::PreemptorV0_1(preemptor) => {
                checked_in_bind::<placer::VictimsParamsV0_1<'_>, placer::VictimsResults>(
                    preemptor.func_choose_victims().func(),
                )
                .call_async(store, (req, &candidates.v0_1(), spot))
                .await?
                .0
            }
            _ => return Err(wasmtime::Error::msg("the plugin is not a preemptor")),
        };
        Ok(answer)
    }
}

/// The spend-guard's `decide`.
struct Decide(wit::Charge, wit::Budget);

impl Decision for Decide {
    type Answer = Result<(), String>;

    async fn call(
        self,
        store: &mut Store<PluginState>,
        bound: &Bound,
    ) -> wasmtime::Result<Self::Answer> {
        let Decide(charge, budget) = self;
        match bound {
            Bound::SpendGuard(guard) => guard.call_decide(store, charge, budget).await,
            Bound::SpendGuardV0_1(guard) => {
                use bindings::v0_1::placer::orl::policy::types as v0_1;
                let charge = v0_1::Charge {
                    amount_minor: charge.amount_minor,
                    gpu_count: charge.gpu_count,
                    duration_seconds: charge.duration_seconds,
                    price_per_gpu_hour_minor: charge.price_per_gpu_hour_minor,
                };
                let budget = v0_1::Budget {
                    limit_minor: budget.limit_minor,
                    spent_minor: budget.spent_minor,
                    committed_minor: budget.committed_minor,
                };
                guard.call_decide(store, charge, budget).await
            }
            _ => Err(wasmtime::Error::msg("the plugin is not a spend-guard")),
        }
    }
}

/// A placer's `place` or a preemptor's `choose-victims` export, typed for the host's
/// borrowed columns without checking its type again: every [`Bound`] of those worlds comes
/// from [`bind`], which checked the export against exactly these types (up to lifetimes)
/// for its version. The generated bindings call their exports the same way.
#[allow(unsafe_code)]
fn checked_in_bind<P, R>(func: &wasmtime::component::Func) -> TypedFunc<P, R>
where
    P: wasmtime::component::ComponentNamedList + wasmtime::component::Lower,
    R: wasmtime::component::ComponentNamedList + wasmtime::component::Lift,
{
    // SAFETY: see above; `bind` refuses an instance whose check fails.
    unsafe { TypedFunc::new_unchecked(*func) }
}

/// Gives the system back the memory a compile freed. Cranelift compiles a component's
/// functions on rayon's threads, and the allocator keeps the pages each thread freed in
/// that thread's heap until the thread allocates again, which an idle one never does: an
/// 18 MB interpreter component left about 140 MB behind. Each of rayon's threads, and this
/// one, collects its own heap.
fn return_compile_memory() {
    fn collect() {
        // SAFETY: `mi_collect` only frees and decommits the calling thread's empty pages.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_collect(true)
        }
    }
    rayon::broadcast(|_| collect());
    collect();
}

/// Loads a precompiled component this process's engine wrote.
#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> anyhow::Result<Component> {
    // SAFETY: the file is an artifact of `Engine::precompile_component`, written by this
    // server into its own data directory; wasmtime also refuses artifacts of another
    // engine version or configuration.
    Ok(unsafe { Component::deserialize_file(engine, path) }?)
}

/// Creates `dir` (and its missing parents) accessible by its owner only, and makes an
/// existing one so.
fn create_private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::{IDLE_PER_KEY, IDLE_TOTAL, Idle};

    #[test]
    fn idle_instances_come_back_only_for_their_plugin_and_config() {
        let mut idle = Idle::default();
        idle.put("sha256:a", "", 1);
        idle.put("sha256:a", r#"{"x":1}"#, 2);
        idle.put("sha256:b", "", 3);
        assert_eq!(idle.take("sha256:a", r#"{"x":2}"#), None);
        assert_eq!(idle.take("sha256:c", ""), None);
        assert_eq!(idle.take("sha256:a", r#"{"x":1}"#), Some(2));
        assert_eq!(idle.take("sha256:a", r#"{"x":1}"#), None);
        assert_eq!(idle.take("sha256:b", ""), Some(3));
        assert_eq!(idle.take("sha256:a", ""), Some(1));
        assert_eq!(idle.count, 0);
    }

    #[test]
    fn idle_instances_are_kept_up_to_the_limit_per_key_and_in_all() {
        let mut idle = Idle::default();
        for i in 0..IDLE_PER_KEY + 3 {
            idle.put("p", "", i);
        }
        assert_eq!(idle.count, IDLE_PER_KEY);
        for plugin in 0..IDLE_TOTAL * 2 {
            idle.put(&format!("q{plugin}"), "", plugin);
        }
        assert_eq!(idle.count, IDLE_TOTAL);
        // A place freed by a take is taken again.
        assert!(idle.take("p", "").is_some());
        idle.put("r", "", 0);
        assert_eq!(idle.take("r", ""), Some(0));
        let mut kept = 0;
        while idle.take("p", "").is_some() {
            kept += 1;
        }
        assert_eq!(kept, IDLE_PER_KEY - 1);
    }
}
