//! Route-decision latency with 10, 100, 1,000 and 10,000 registered workers (all serving the model, so every one
//! is a candidate) and 100,000 cached prefix blocks spread over them, for each policy; then 10,000 workers holding
//! 10 million blocks across their KV tiers (a third each in the KV cache, host memory and on disk), with the
//! orchestrator's index memory per block (resident memory before and after indexing them).
//! `cargo bench -p zl-orchestrator --bench route`

use std::time::{Duration, Instant};

use zl_orchestrator::load::{LoadSettings, LoadView};
use zl_orchestrator::route::{POLICY_NAMES, Scratch, decide, policy_by_name};
use zl_orchestrator::state::{Command, ModelVersion, RoutingState, WorkerSpec, hex};
use zl_wire::message::{ComputePool, KvCacheEvents, LoadReport, NodeId, RouteHint, RouteRequest};

const CACHED_BLOCKS: usize = 100_000;
const FLEET_BLOCKS: usize = 10_000_000;
const DECISIONS: usize = 20_000;

/// This process's resident memory in bytes (Linux).
fn resident() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn world_with(workers: usize, cached: usize, now: Instant) -> (RoutingState, LoadView) {
    let mut state = RoutingState::default();
    let mut load = LoadView::new(LoadSettings::default());
    let pools = [ComputePool::Cpu, ComputePool::Hybrid, ComputePool::Gpu];
    for i in 0..workers {
        let id = NodeId::new(format!("worker-{i}")).expect("id");
        let spec = WorkerSpec {
            id: id.clone(),
            endpoint: format!("10.0.{}.{}:7100", i / 250, i % 250),
            device_class: pools[i % 3],
            models: vec![ModelVersion {
                id: "llama".into(),
                weights_sha256: hex(&[1; 32]),
                context_length: 8192,
                family: "llama".into(),
                weights_bytes: 0,
                embedding_dims: 0,
            }],
            kv_block_size: 16,
            kv_blocks_total: 100_000,
            max_running_sequences: 64,
            kv_dtype: "f16".into(),
            kv_bytes_per_token: 0,
        };
        state.apply(i as u64 + 1, &Command::RegisterWorker(spec)).expect("register");
        let report = LoadReport {
            worker_id: id.clone(),
            sequence: 1,
            queue_depth: (i % 5) as u32,
            running_sequences: (i % 40) as u32,
            kv_blocks_used: (i * 37 % 1000) as u32,
            kv_blocks_free: 1000,
            fragmentation_ratio: 0.1,
            tokens_per_second: 100.0,
            vram_total_bytes: 0,
            vram_free_bytes: 0,
            queued_prefill_blocks: 0,
            adapters: vec![],
        };
        load.report(report, now);
        // Each worker caches a chain of blocks; chains share their first blocks with neighbours.
        let per = cached / workers;
        let blocks: Vec<u64> =
            (0..per).map(|b| if b < 8 { (i / 4 * 1000 + b) as u64 } else { (i * per + b) as u64 | 1 << 40 }).collect();
        // Beyond the first million blocks, a third each hot, in host memory and on disk.
        let tiered = cached > 1_000_000;
        let third = |k: usize| blocks.iter().enumerate().filter(move |(b, _)| !tiered || b % 3 == k).map(|(_, &h)| h);
        let ev = KvCacheEvents {
            worker_id: id,
            sequence: 1,
            model: "llama".into(),
            stored: third(0).collect(),
            evicted: vec![],
            cleared: false,
            host: if tiered { third(1).collect() } else { vec![] },
            disk: if tiered { third(2).collect() } else { vec![] },
        };
        load.kv_events(&ev, now);
    }
    (state, load)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    println!("{:>8} {:>18} {:>10} {:>10} {:>10}", "workers", "policy", "p50 us", "p99 us", "max us");
    for (workers, cached) in
        [(10usize, CACHED_BLOCKS), (100, CACHED_BLOCKS), (1000, CACHED_BLOCKS), (10_000, CACHED_BLOCKS)]
            .into_iter()
            .chain([(10_000, FLEET_BLOCKS)])
    {
        let now = Instant::now();
        let before = resident();
        let (state, load) = world_with(workers, cached, now);
        if cached == FLEET_BLOCKS {
            let per_block = (resident() - before) as f64 / load.cached_blocks() as f64;
            println!(
                "{workers} workers, {} blocks indexed across tiers: {per_block:.0} bytes of resident memory per block \
                 (routing state and load view included)",
                load.cached_blocks()
            );
        }
        for name in POLICY_NAMES {
            let policy = policy_by_name(name).expect("policy");
            let mut scratch = Scratch::default();
            let mut times = Vec::with_capacity(DECISIONS);
            for d in 0..DECISIONS {
                let group = d % (workers / 4).max(1);
                let request = RouteRequest {
                    request_id: format!("req-{d}"),
                    model: "llama".into(),
                    prompt_tokens: 512,
                    max_tokens: 256,
                    block_hashes: (0..32).map(|b| (group * 1000 + b) as u64).collect(),
                    session_id: Some(format!("session-{}", d % 500)),
                    hint: RouteHint::None,
                    input_semantic_weight: 0.5,
                    excluded_workers: vec![],
                    trace_id: String::new(),
                    prefer_fallback: false,
                    project: String::new(),
                };
                let t = Instant::now();
                let decision = decide(&state, &load, &request, policy.as_ref(), now, &mut scratch);
                times.push(t.elapsed());
                assert!(decision.is_ok(), "{decision:?}");
            }
            times.sort();
            println!(
                "{workers:>8} {name:>18} {:>10.2} {:>10.2} {:>10.2}",
                percentile(&times, 0.5).as_secs_f64() * 1e6,
                percentile(&times, 0.99).as_secs_f64() * 1e6,
                times[times.len() - 1].as_secs_f64() * 1e6
            );
        }
    }
    println!("cached prefix blocks: {CACHED_BLOCKS} (the last rows: {FLEET_BLOCKS}), decisions per row: {DECISIONS}");
}
