//! `orl bench placement`: replays one stream of requests against one inventory snapshot
//! with the default placement policy run natively and as its WebAssembly component (on warm
//! instances, as the server runs it), and prints decisions per second, p50/p99 per decision
//! and the ratio.
//!
//! The two paths take turns decision by decision (alternating which goes first), so that a
//! machine that slows down or speeds up during a run weighs on both alike.

pub mod api;

use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use wasmtime_wasi::runtime::in_tokio;

use crate::placer::{
    CandidateUnit, Candidates, DeviceAsk, DomainLoad, NativeDefault, NodeFacts, PlacementRequest,
    PolicyClass,
};
use crate::policy::{PolicyHost, World};

/// Options of `orl bench placement`.
#[derive(Debug, clap::Args)]
pub struct PlacementBench {
    /// Node counts to measure (8 GPUs each, two NVLink domains of 4).
    #[arg(long, value_delimiter = ',', default_values_t = vec![500, 5_000, 20_000])]
    pub nodes: Vec<usize>,
    /// Requests in the stream.
    #[arg(long, default_value_t = 500)]
    pub requests: usize,
    /// Times the stream is replayed; every decision of every round is counted.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// A placement component to measure instead of the built-in default (a `.wasm` file
    /// implementing the `placer` world); native is always the built-in default.
    #[arg(long)]
    pub component: Option<std::path::PathBuf>,
}

/// A snapshot of `count` nodes of 8 H100s in two NVLink domains, each unit busy with
/// probability 0.3; every free unit is a candidate.
pub fn snapshot(count: usize, rng: &mut StdRng) -> Candidates {
    let mut candidates = Candidates::default();
    for id in 0..count as u32 {
        let busy: Vec<bool> = (0..8).map(|_| rng.random_bool(0.3)).collect();
        let free: Vec<CandidateUnit> = (0..8u32)
            .filter(|g| !busy[*g as usize])
            .map(|g| CandidateUnit {
                class: PolicyClass::Gpu,
                model: 0,
                nvlink_domain: Some(g / 4),
                memory_gib: 80,
            })
            .collect();
        let domains: Vec<DomainLoad> = (0..2u32)
            .map(|d| DomainLoad {
                domain: d,
                busy: (0..4).filter(|g| busy[(d * 4 + g) as usize]).count() as u32,
                total: 4,
            })
            .collect();
        let busy_units = busy.iter().filter(|b| **b).count() as u32;
        candidates.push_node(id, busy_units, 8, domains, free);
    }
    candidates
}

/// The names and rack labels of `count` nodes of [`snapshot`], made once: a decision's
/// node facts are copied from them, as the server copies them from its view.
fn node_names(count: usize) -> Vec<(String, String)> {
    (0..count)
        .map(|id| (format!("node-{id:05}"), format!("r{:03}", id / 40)))
        .collect()
}

/// The node facts of `candidates`: each node's name, a region and two labels.
fn facts(names: &[(String, String)], candidates: &Candidates) -> NodeFacts {
    let mut facts = NodeFacts::default();
    for &id in &candidates.nodes.id {
        let (name, rack) = &names[id as usize];
        let labels = [("rack", rack.as_str()), ("tier", "standard")];
        facts.push(name, Some("eu-west"), labels);
    }
    facts
}

/// The request stream: 1, 2, 4 or 8 GPUs; 4 with `nvlink-all` half the time (a domain holds 4).
pub fn requests(count: usize, rng: &mut StdRng) -> Vec<PlacementRequest> {
    (0..count)
        .map(|_| {
            let gpus = [1, 2, 4, 8][rng.random_range(0..4)];
            PlacementRequest {
                devices: vec![DeviceAsk {
                    class: PolicyClass::Gpu,
                    count: gpus,
                    model: None,
                    nvlink_all: gpus == 4 && rng.random_bool(0.5),
                }],
                spot: false,
                duration_seconds: 3600,
                models: vec!["H100-SXM5-80GB".into()],
            }
        })
        .collect()
}

#[derive(Default)]
struct Run {
    per_decision: Vec<Duration>,
}

impl Run {
    fn total(&self) -> Duration {
        self.per_decision.iter().sum()
    }

    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.per_decision.clone();
        sorted.sort();
        sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
    }

    fn per_second(&self) -> f64 {
        self.per_decision.len() as f64 / self.total().as_secs_f64()
    }

    fn time(&mut self, decide: impl FnOnce() -> bool) {
        let started = Instant::now();
        assert!(decide(), "every benchmark request fits the snapshot");
        self.per_decision.push(started.elapsed());
    }
}

/// Times every request of `requests`, `rounds` times, on both paths in turn.
fn measure(
    requests: &[PlacementRequest],
    rounds: usize,
    mut native: impl FnMut(&PlacementRequest) -> bool,
    mut wasm: impl FnMut(&PlacementRequest) -> bool,
    progress: &indicatif::ProgressBar,
) -> (Run, Run) {
    let (mut native_run, mut wasm_run) = (Run::default(), Run::default());
    for (i, request) in std::iter::repeat_n(requests, rounds).flatten().enumerate() {
        progress.inc(1);
        if i % 2 == 0 {
            native_run.time(|| native(request));
            wasm_run.time(|| wasm(request));
        } else {
            wasm_run.time(|| wasm(request));
            native_run.time(|| native(request));
        }
    }
    (native_run, wasm_run)
}

pub fn run(args: PlacementBench) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let host = PolicyHost::new(dir.path())?;
    let component = match &args.component {
        None => host.default_placer(),
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let loaded = host
                .load(&bytes)
                .map_err(|f| anyhow::anyhow!("{}: {}", path.display(), f.message))?;
            anyhow::ensure!(
                loaded.world == World::Placer,
                "{} is a {} component, not a placer",
                path.display(),
                loaded.world.as_str()
            );
            loaded
        }
    };
    println!(
        "placement: default policy, native vs WebAssembly component \
         ({} requests x {} rounds, the two in turn)",
        args.requests, args.rounds
    );
    println!(
        "{:>7} {:>10} | {:>12} {:>10} {:>10} | {:>12} {:>10} {:>10} | {:>6}",
        "nodes", "candidates", "native/s", "p50", "p99", "wasm/s", "p50", "p99", "ratio"
    );
    for count in &args.nodes {
        let mut rng = StdRng::seed_from_u64(7);
        let nodes = snapshot(*count, &mut rng);
        let stream = requests(args.requests, &mut rng);
        let candidates = nodes.units.len();
        // Warm both paths once.
        // The component gets node facts as the server builds them, per call.
        let names = node_names(*count);
        let facts = |c: &Candidates| facts(&names, c);
        let _ = NativeDefault.decide(&stream[0], &nodes);
        let _ = in_tokio(host.place(&component, &stream[0], &nodes, &facts, None, 60_000));
        let progress = crate::progress::bar(
            (stream.len() * args.rounds.max(1)) as u64,
            format!("{count} nodes"),
            "requests",
        );
        let (native, wasm) = measure(
            &stream,
            args.rounds.max(1),
            |r| NativeDefault.decide(r, &nodes).is_ok(),
            |r| match in_tokio(host.place(&component, r, &nodes, &facts, None, 60_000)) {
                Ok(Ok(_)) => true,
                Ok(Err(reason)) => panic!("unschedulable: {reason}"),
                Err(failure) => panic!("the component failed: {failure:?}"),
            },
            &progress,
        );
        progress.finish_and_clear();
        println!(
            "{:>7} {:>10} | {:>12.0} {:>10.3?} {:>10.3?} | {:>12.0} {:>10.3?} {:>10.3?} | {:>5.2}x",
            count,
            candidates,
            native.per_second(),
            native.percentile(0.5),
            native.percentile(0.99),
            wasm.per_second(),
            wasm.percentile(0.5),
            wasm.percentile(0.99),
            wasm.total().as_secs_f64() / native.total().as_secs_f64(),
        );
    }
    Ok(())
}
