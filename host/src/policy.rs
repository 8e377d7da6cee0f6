//! Policies as WebAssembly: the sandboxed runtime that runs placement, preemption and
//! spend-limit components, the registry operators upload them to, and their assignment to
//! pools.
//!
//! One [`wasmtime::Engine`] with the pooling allocator and epoch interruption; components
//! compiled once, cached by content hash in memory and (precompiled) on disk; instances
//! made from an `InstancePre` and kept warm between decisions of the same plugin and
//! config (an instance that fails a decision in any way is thrown away); an epoch deadline
//! per call and a cap on the total linear memory of each instance. A plugin sees WASI with no environment, no
//! arguments, no stdio, no network, and only its read-only config directory at `/config`,
//! plus the host's `log`. Whatever a plugin does, it fails only its own decision.

pub mod assignment;
mod bindings;
pub mod placer;
pub mod registry;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker, ResourceTable, TypedFunc};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use bindings::placer::orl::policy::types as wit;

/// Default time a decision may take.
pub const DEFAULT_DEADLINE_MS: u64 = 50;
/// Default cap on all linear memory of one plugin instance.
pub const DEFAULT_MEMORY_BYTES: usize = 64 << 20;
/// The epoch advances this often; deadlines are counted in it.
const EPOCH_TICK: Duration = Duration::from_millis(1);
/// Warm instances kept per plugin and config, and in all. An idle instance keeps the linear
/// memory it grew to (up to the cap), so few are kept: decisions of one pool are serialized
/// by the pool lock, so one or two per key serve it.
const IDLE_PER_KEY: usize = 2;
const IDLE_TOTAL: usize = 16;

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

/// How a decision failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    Trap,
    Deadline,
    Memory,
    InvalidAnswer,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Trap => "trap",
            FailureKind::Deadline => "deadline",
            FailureKind::Memory => "memory",
            FailureKind::InvalidAnswer => "invalid-answer",
        }
    }
}

/// A policy decision that failed: which plugin, how, and what it said.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    pub plugin_id: String,
    pub kind: FailureKind,
    pub message: String,
}

/// What a running instance may use, and what it did.
pub struct PluginState {
    plugin_id: String,
    wasi: WasiCtx,
    table: ResourceTable,
    limits: MemoryCap,
}

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

/// A compiled plugin, ready to instantiate.
pub struct Loaded {
    pub id: String,
    pub world: World,
    pre: Pre,
}

/// A plugin's `InstancePre` with the export indices of its world resolved.
enum Pre {
    Placer(bindings::placer::PlacerPre<PluginState>),
    Preemptor(bindings::preemptor::PreemptorPre<PluginState>),
    SpendGuard(bindings::spend_guard::SpendGuardPre<PluginState>),
}

/// An instance's exports, typed by world.
enum Bound {
    Placer(bindings::placer::Placer),
    Preemptor(bindings::preemptor::Preemptor),
    SpendGuard(bindings::spend_guard::SpendGuard),
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

/// The runtime: engine, linker, and the compiled plugins.
pub struct PolicyHost {
    engine: Engine,
    linker: Linker<PluginState>,
    loaded: Mutex<HashMap<String, Arc<Loaded>>>,
    idle: Mutex<Idle>,
    /// Where precompiled components are kept; `None` when profiling, because `perf` names
    /// guest functions only in code compiled in memory.
    cache_dir: Option<PathBuf>,
    config_root: PathBuf,
    defaults: std::sync::OnceLock<HashMap<World, Arc<Loaded>>>,
}

/// The default policies, built from `plugins/` for wasm32-wasip2 by the build script.
pub const DEFAULT_PLACER_WASM: &[u8] = include_bytes!(env!("ORL_PLACER_DEFAULT_WASM"));
pub const DEFAULT_SPEND_GUARD_WASM: &[u8] = include_bytes!(env!("ORL_SPEND_GUARD_DEFAULT_WASM"));
/// The default preemption component (`plugins/preemptor-default`), built for wasm32-wasip2.
pub const DEFAULT_PREEMPTOR_WASM: &[u8] = include_bytes!(env!("ORL_PREEMPTOR_DEFAULT_WASM"));

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
        let ticker = engine.weak();
        std::thread::Builder::new()
            .name("orl-epoch".into())
            .spawn(move || {
                while let Some(engine) = ticker.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .context("starting the epoch ticker")?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(|e| anyhow::Error::from(e).context("linking WASI"))?;
        bindings::placer::orl::policy::log::add_to_linker::<_, wasmtime::component::HasSelf<_>>(
            &mut linker,
            |s| s,
        )
        .map_err(|e| anyhow::Error::from(e).context("linking log"))?;
        let cache_dir = data_dir.join("plugins");
        let config_root = data_dir.join("plugin-config");
        // Precompiled artifacts are loaded as machine code: only the owner may write them.
        for dir in [&cache_dir, &config_root] {
            create_private_dir(dir)?;
        }
        let host = PolicyHost {
            engine,
            linker,
            loaded: Mutex::new(HashMap::new()),
            idle: Mutex::new(Idle::default()),
            cache_dir: (!profiling).then_some(cache_dir),
            config_root,
            defaults: std::sync::OnceLock::new(),
        };
        let mut defaults = HashMap::new();
        for bytes in [
            DEFAULT_PLACER_WASM,
            DEFAULT_PREEMPTOR_WASM,
            DEFAULT_SPEND_GUARD_WASM,
        ] {
            let loaded = host
                .load(bytes)
                .map_err(|e| anyhow::anyhow!("a built-in policy: {}", e.message))?;
            defaults.insert(loaded.world, loaded);
        }
        let _ = host.defaults.set(defaults);
        Ok(Arc::new(host))
    }

    /// The default component of `world` shipped inside the binary.
    pub fn default_for(&self, world: World) -> Option<Arc<Loaded>> {
        self.defaults.get().and_then(|d| d.get(&world)).cloned()
    }

    /// The default placement component shipped inside the binary.
    pub fn default_placer(&self) -> Arc<Loaded> {
        self.default_for(World::Placer)
            .expect("the built-in placer is loaded at start")
    }

    /// Compiles (or fetches from the caches) the component `bytes` and checks it implements
    /// one world with no import outside it. The error says what is wrong.
    pub fn load(&self, bytes: &[u8]) -> Result<Arc<Loaded>, Failure> {
        let id = content_id(bytes);
        if let Some(loaded) = self.loaded.lock().expect("plugin cache").get(&id) {
            return Ok(loaded.clone());
        }
        let refuse = |message: String| Failure {
            plugin_id: id.clone(),
            kind: FailureKind::InvalidAnswer,
            message,
        };
        let component = self
            .compile(&id, bytes)
            .map_err(|e| refuse(format!("not a WebAssembly component: {e:#}")))?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            refuse(format!("the component needs imports a plugin may not use (only WASI without network and orl:policy/log): {e:#}"))
        })?;
        let (world, pre) = if let Ok(pre) = bindings::placer::PlacerPre::new(pre.clone()) {
            (World::Placer, Pre::Placer(pre))
        } else if let Ok(pre) = bindings::preemptor::PreemptorPre::new(pre.clone()) {
            (World::Preemptor, Pre::Preemptor(pre))
        } else if let Ok(pre) = bindings::spend_guard::SpendGuardPre::new(pre) {
            (World::SpendGuard, Pre::SpendGuard(pre))
        } else {
            return Err(refuse("the component exports none of the worlds placer, preemptor or spend-guard of orl:policy@0.1.0".into()));
        };
        let loaded = Arc::new(Loaded {
            id: id.clone(),
            world,
            pre,
        });
        self.loaded
            .lock()
            .expect("plugin cache")
            .insert(id, loaded.clone());
        Ok(loaded)
    }

    /// Compiles once per content hash: a precompiled artifact on disk is reused across
    /// restarts; otherwise Cranelift compiles and the artifact is saved.
    fn compile(&self, id: &str, bytes: &[u8]) -> anyhow::Result<Component> {
        let Some(cache_dir) = &self.cache_dir else {
            return Ok(Component::new(&self.engine, bytes)?);
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
        let artifact = self.engine.precompile_component(bytes)?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, &artifact)?;
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

    /// A new instance of `loaded`: no environment, no stdio, no network, the config
    /// directory `dir` read-only at `/config`, and the memory cap.
    fn instantiate(
        &self,
        loaded: &Loaded,
        dir: &Path,
        memory_bytes: usize,
    ) -> anyhow::Result<Warm> {
        let mut wasi = WasiCtx::builder();
        wasi.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        wasi.preopened_dir(dir, "/config", FsPerms::ReadOnly)?;
        let state = PluginState {
            plugin_id: loaded.id.clone(),
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits: MemoryCap {
                limit: memory_bytes,
                total: 0,
                hit: false,
            },
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_trap();
        // The start of an instance counts against the deadline of its first decision only
        // through the call below; instantiation itself gets a generous one.
        store.set_epoch_deadline(1_000);
        // The exports the host calls with its own borrowed types are checked against those
        // types here, once per instance, so that a decision need not (see `place_export`).
        let bound = match &loaded.pre {
            Pre::Placer(pre) => {
                let placer = pre.instantiate(&mut store)?;
                (placer.func_place().func())
                    .typed::<placer::PlaceParams<'_>, placer::PlaceResults>(&store)?;
                Bound::Placer(placer)
            }
            Pre::Preemptor(pre) => {
                let preemptor = pre.instantiate(&mut store)?;
                (preemptor.func_choose_victims().func())
                    .typed::<placer::VictimsParams<'_>, placer::VictimsResults>(&store)?;
                Bound::Preemptor(preemptor)
            }
            Pre::SpendGuard(pre) => Bound::SpendGuard(pre.instantiate(&mut store)?),
        };
        Ok(Warm { store, bound })
    }

    /// Runs `call` on a warm instance of `loaded` (a new one when none is idle), turning a
    /// trap, a missed deadline or the memory cap into a [`Failure`] of that plugin. An
    /// instance that answered goes back to the idle set; one that failed is dropped.
    fn run<R>(
        &self,
        loaded: &Loaded,
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
        call: impl FnOnce(&mut Store<PluginState>, &Bound) -> wasmtime::Result<R>,
    ) -> Result<R, Failure> {
        let fail = |kind, message: String| Failure {
            plugin_id: loaded.id.clone(),
            kind,
            message,
        };
        let prepare =
            |e: anyhow::Error| fail(FailureKind::Trap, format!("preparing the instance: {e:#}"));
        let config_key = config.map(serde_json::Value::to_string).unwrap_or_default();
        let idle = (self.idle.lock().expect("idle instances")).take(&loaded.id, &config_key);
        let mut warm = match idle {
            Some(warm) => warm,
            None => {
                let dir = self.config_dir(&loaded.id, config).map_err(prepare)?;
                self.instantiate(loaded, &dir, DEFAULT_MEMORY_BYTES)
                    .map_err(prepare)?
            }
        };
        warm.store.set_epoch_deadline(deadline_ms.max(1));
        let Warm { store, bound } = &mut warm;
        match call(store, bound) {
            Ok(answer) => {
                (self.idle.lock().expect("idle instances")).put(&loaded.id, &config_key, warm);
                Ok(answer)
            }
            Err(err) => {
                let kind = if warm.store.data().limits.hit {
                    FailureKind::Memory
                } else if matches!(
                    err.downcast_ref::<wasmtime::Trap>(),
                    Some(wasmtime::Trap::Interrupt)
                ) {
                    FailureKind::Deadline
                } else {
                    FailureKind::Trap
                };
                let message = match kind {
                    FailureKind::Deadline => format!("did not answer within {deadline_ms} ms"),
                    FailureKind::Memory => format!(
                        "exceeded its memory cap of {} MiB",
                        DEFAULT_MEMORY_BYTES >> 20
                    ),
                    _ => format!("{err:#}").chars().take(500).collect(),
                };
                Err(fail(kind, message))
            }
        }
    }

    /// Runs the placer `loaded`.
    pub fn place(
        &self,
        loaded: &Loaded,
        request: &orl_placer_default::Request,
        candidates: &orl_placer_default::Candidates,
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
    ) -> Result<Result<orl_placer_default::Placement, String>, Failure> {
        let req = placer::request_to_wit(request);
        let candidates = placer::CandidatesRef::of(candidates);
        let answer = self.run(loaded, config, deadline_ms, |store, bound| match bound {
            Bound::Placer(placer) => Ok(place_export(placer).call(store, (&req, &candidates))?.0),
            _ => Err(wasmtime::Error::msg("the plugin is not a placer")),
        })?;
        Ok(answer.map(|p| orl_placer_default::Placement {
            node: p.node,
            units: p.units,
        }))
    }

    /// Runs the preemptor `loaded`: the indices of the spot bookings to
    /// terminate, or why nothing can make room.
    pub fn preempt(
        &self,
        loaded: &Loaded,
        request: &orl_placer_default::Request,
        candidates: &orl_placer_default::Candidates,
        spot: &[crate::booking::placement::SpotCandidate],
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
    ) -> Result<Result<Vec<u32>, String>, Failure> {
        let req = placer::request_to_wit(request);
        let candidates = placer::CandidatesRef::of(candidates);
        let spot: Vec<_> = spot.iter().map(placer::spot_to_wit).collect();
        self.run(loaded, config, deadline_ms, |store, bound| match bound {
            Bound::Preemptor(preemptor) => Ok(victims_export(preemptor)
                .call(store, (&req, &candidates, &spot))?
                .0),
            _ => Err(wasmtime::Error::msg("the plugin is not a preemptor")),
        })
    }

    /// Runs the spend-guard `loaded`: `Ok(Ok(()))` allows the charge.
    pub fn spend(
        &self,
        loaded: &Loaded,
        charge: &orl_spend_guard_default::Charge,
        budget: &orl_spend_guard_default::Budget,
        config: Option<&serde_json::Value>,
        deadline_ms: u64,
    ) -> Result<Result<(), String>, Failure> {
        self.run(loaded, config, deadline_ms, |store, bound| {
            let Bound::SpendGuard(guard) = bound else {
                return Err(wasmtime::Error::msg("the plugin is not a spend-guard"));
            };
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
            guard.call_decide(store, charge, budget)
        })
    }
}

/// Loads a precompiled component this process's engine wrote.
/// The `place` export of `placer` typed for the host's borrowed columns, without checking its
/// type again: every [`Bound::Placer`] comes from `instantiate`, which checked it against
/// these types (up to lifetimes). The generated bindings call their exports the same way.
#[allow(unsafe_code)]
fn place_export(
    placer: &bindings::placer::Placer,
) -> TypedFunc<placer::PlaceParams<'_>, placer::PlaceResults> {
    // SAFETY: see above; `instantiate` refuses an instance whose check fails.
    unsafe { TypedFunc::new_unchecked(*placer.func_place().func()) }
}

/// The `choose-victims` export of `preemptor`, as [`place_export`] for a placer.
#[allow(unsafe_code)]
fn victims_export(
    preemptor: &bindings::preemptor::Preemptor,
) -> TypedFunc<placer::VictimsParams<'_>, placer::VictimsResults> {
    // SAFETY: as in `place_export`.
    unsafe { TypedFunc::new_unchecked(*preemptor.func_choose_victims().func()) }
}

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
