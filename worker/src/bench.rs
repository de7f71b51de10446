//! `zl-worker bench`: prefill and decode throughput of the engine at several concurrency levels, measured side by
//! side in one process, with the ratio of each level's decode rate to the single-sequence rate.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use zl_worker::engine::{Event, Request};
use zl_worker::model::tokenizer::ChatMessage;
use zl_worker::sampling::Sampling;

use crate::ModelArgs;

#[derive(Args, Debug)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Concurrency levels, comma-separated.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Output tokens per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Run the concurrency levels this many times, alternating, and finish with each level's median decode rate and
    /// the ratio of the medians (a noisy machine moves single runs by ±15%).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
}

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

pub(crate) fn run(args: &BenchArgs) -> Result<()> {
    let mut loaded = crate::load(&args.model)?.swap_remove(0);
    let core = &mut loaded.core;
    println!("model: {}, CPU kernels: {}", loaded.path.display(), zl_worker::model::kernels::Isa::current().name());
    println!(
        "{:>11} {:>15} {:>15} {:>9} {:>12} {:>12}",
        "concurrency", "prefill tok/s", "decode tok/s", "vs c=1", "TPOT p50 ms", "TPOT p99 ms"
    );
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); args.concurrency.len()];
    let mut level_no = 0;
    for _ in 0..args.rounds {
        let mut base = None;
        for (slot, &c) in args.concurrency.iter().enumerate() {
            let decode_rate = run_level(core, level_no, c, args.max_tokens, &mut base)?;
            rates[slot].push(decode_rate);
            level_no += 1;
        }
    }
    if args.rounds > 1 {
        println!("medians of {} rounds:", args.rounds);
        let medians: Vec<f64> = rates
            .iter_mut()
            .map(|r| {
                r.sort_by(f64::total_cmp);
                r[r.len() / 2]
            })
            .collect();
        for (&c, &m) in args.concurrency.iter().zip(&medians) {
            println!("{c:>11} {:>15} {m:>15.1} {:>8.2}x", "", m / medians[0]);
        }
    }
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS: {rss:.0} MiB");
    }
    Ok(())
}

/// One concurrency level: `c` greedy requests of `max_tokens` each, run to completion; prints the level's line
/// (the ratio against `base`, the round's first level) and returns its decode rate.
fn run_level(
    core: &mut zl_worker::engine::EngineCore,
    level_no: usize,
    c: usize,
    max_tokens: u32,
    base: &mut Option<f64>,
) -> Result<f64> {
    let topics = ["the sea", "a robot", "autumn", "a city at night", "a lost key", "mountains", "a library", "rain"];
    let mut prompt_tokens = 0usize;
    for i in 0..c {
        let tok = &core.model().tokenizer;
        let text = tok.render_chat(&[ChatMessage {
            role: "user".into(),
            content: format!("Story {level_no}-{i}: write a long story about {}.", topics[i % topics.len()]),
        }])?;
        let prompt = tok.encode(&text)?;
        prompt_tokens += prompt.len();
        let req = Request { prompt, sampling: Sampling::greedy(), max_tokens, stop_sequences: vec![], logprobs: false };
        core.add((level_no * 10_000 + i) as u64, req)?;
    }
    let started = Instant::now();
    let mut first_token = HashSet::new();
    let mut prefill_done = None;
    let mut decode_tokens = 0u64;
    let mut decode_steps = Vec::new();
    while core.has_work() {
        let step_start = Instant::now();
        let events = core.step();
        let step_time = step_start.elapsed();
        let mut tokens = 0;
        for ev in &events {
            let (Event::Token { seq, .. } | Event::Finished { seq, .. }) = ev;
            if matches!(ev, Event::Token { .. }) {
                tokens += 1;
            }
            first_token.insert(*seq);
        }
        match prefill_done {
            None if first_token.len() == c => prefill_done = Some(started.elapsed()),
            None => {}
            Some(_) => {
                decode_tokens += tokens;
                decode_steps.push(step_time);
            }
        }
    }
    let total = started.elapsed();
    let prefill = prefill_done.unwrap_or(total);
    let decode_time = total.saturating_sub(prefill).as_secs_f64();
    let prefill_rate = prompt_tokens as f64 / prefill.as_secs_f64();
    let decode_rate = if decode_time > 0.0 { decode_tokens as f64 / decode_time } else { 0.0 };
    let ratio = decode_rate / *base.get_or_insert(decode_rate);
    decode_steps.sort();
    println!(
        "{c:>11} {prefill_rate:>15.1} {decode_rate:>15.1} {ratio:>8.2}x {:>12.2} {:>12.2}",
        percentile(&decode_steps, 0.5).as_secs_f64() * 1e3,
        percentile(&decode_steps, 0.99).as_secs_f64() * 1e3,
    );
    Ok(decode_rate)
}
