//! `zl-worker bench`: prefill and decode throughput of the engine at several concurrency levels, measured side by
//! side in one process, with the ratio of each level's decode rate to the single-sequence rate. `--workload
//! overlap` asks for text that repeats the prompt (an edit of a given text) and runs every level without and with
//! predictive streaming, printing the speed-up and the draft acceptance rate. `--workload json` asks for JSON and runs
//! every level free and then constrained by a JSON Schema, printing the constrained rate against the free one and
//! the grammar engine's time per token mask (p50, p99). `--adapters N` runs every level on the base alone and then
//! with its requests spread over the base and N LoRA adapters (rank 16, every projection) in one batch, printing
//! the mixed rate against the base-only one. After the levels: the memory-bandwidth ceiling (a read of a
//! weights-sized buffer with the same threads) and one sequence's decode rate as a fraction of it.

mod adapters;
mod bandwidth;
mod json;
mod tiers;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use zl_text::ChatMessage;
use zl_worker::engine::{Event, Request};
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
    /// What the requests ask: `stories` (free text, no speculation), `overlap` (edit a given text: the output
    /// repeats the input; each level runs without and with predictive streaming), `json` (describe a city as
    /// JSON; each level runs free and then constrained by a JSON Schema) or `tiers` (multi-turn chat on a small hot
    /// KV pool with the KV tiers off, in host memory and on disk, then a restart on a disk tier: see
    /// `--conversations`).
    #[arg(long, default_value = "stories", value_parser = ["stories", "overlap", "json", "tiers"])]
    workload: String,
    /// `--workload tiers`: conversations, taken in turns.
    #[arg(long, default_value_t = 8)]
    conversations: usize,
    /// `--workload tiers`: user turns per conversation.
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// `--workload tiers`: words per user turn.
    #[arg(long, default_value_t = 60)]
    turn_words: usize,
    /// `--workload tiers`: the restart measurement's prompt, in tokens.
    #[arg(long, default_value_t = 4096)]
    restart_tokens: usize,
    /// Instead: time the prefill of one prompt of each of these lengths in tokens, alone (e.g. 1024,4096,8192;
    /// capped below the context window), as the time to its first token, then its decoding of `--max-tokens`
    /// tokens at that context.
    #[arg(long, value_delimiter = ',')]
    prefill: Vec<usize>,
    /// Run every level on the base alone and then with request i on adapter i mod (N + 1) (0: the base), N
    /// synthetic LoRA adapters of rank 16 over every projection.
    #[arg(long, default_value_t = 0)]
    adapters: usize,
    /// Put this many tokens of a document before each request's question (its own first token, so no prefix is
    /// shared), to time decoding at a long context: the KV cache's types differ there (`--kv-dtype`).
    #[arg(long, default_value_t = 0)]
    context: usize,
}

/// The text the overlap workload asks the model to edit (a few misspellings to correct).
const EDIT_TEXT: &str = "The orchestrator keeps the routing state in a Raft group, so loosing one node loses \
    nothing. Workers register there models with the orchestrators and report their load every quarter of a second. \
    The frontend asks an orchestrator for a route and then streams straight from the worker it was given.";

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
    if args.workload == "tiers" {
        let shape = tiers::Shape {
            conversations: args.conversations,
            turns: args.turns,
            words: args.turn_words,
            max_tokens: args.max_tokens,
            restart_tokens: args.restart_tokens,
        };
        return tiers::run(&args.model, &shape);
    }
    let mut loaded = crate::load(&args.model)?.swap_remove(0);
    let crate::Run::Generate(core) = &mut loaded.run else {
        anyhow::bail!("{} is an embedding model: `zl-worker bench` measures generation", loaded.path.display());
    };
    println!("model: {}, CPU kernels: {}", loaded.path.display(), zl_worker::model::kernels::Isa::current().name());
    if !args.prefill.is_empty() {
        return prefill(core, &args.prefill, args.max_tokens);
    }
    println!(
        "{:>11} {:>15} {:>15} {:>9} {:>12} {:>12} {:>11}",
        "concurrency", "prefill tok/s", "decode tok/s", "vs c=1", "TPOT p50 ms", "TPOT p99 ms", "e2e tok/s"
    );
    // What each level runs: plain decoding only; without and then with drafts; free and then constrained.
    let json = args.workload == "json";
    let grammars = if json { Some(zl_grammar::Engine::new(&core.model().tokenizer)?) } else { None };
    let adapters = adapters::synthetic(core.model().llama.config(), args.adapters)?;
    let modes: Vec<Mode> = match args.workload.as_str() {
        "overlap" => vec![Mode::Plain, Mode::Predicted(args.model.speculation().max_draft.max(1))],
        "json" => vec![Mode::Plain, Mode::Constrained],
        _ if !adapters.is_empty() => vec![Mode::Plain, Mode::Adapters],
        _ => vec![Mode::Plain],
    };
    let mut outputs = Vec::new();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); args.concurrency.len() * modes.len()];
    let mut level_no = 0;
    for _ in 0..args.rounds {
        let mut base = None;
        for (slot, &c) in args.concurrency.iter().enumerate() {
            for (m, &mode) in modes.iter().enumerate() {
                let prompts = match args.workload.as_str() {
                    "overlap" => Prompts::Edit,
                    "json" => Prompts::Json,
                    _ => Prompts::Stories,
                };
                let grammar = match (mode, &grammars) {
                    (Mode::Constrained, Some(g)) => Some((g, json::schema_grammar()?)),
                    _ => None,
                };
                let level = Level {
                    no: level_no,
                    c,
                    max_tokens: args.max_tokens,
                    mode,
                    prompts,
                    grammar,
                    adapters: &adapters,
                    context: args.context,
                };
                let (rate, out) = run_level(core, &level, &mut base)?;
                rates[slot * modes.len() + m].push(rate);
                if mode == Mode::Constrained {
                    outputs.extend(out);
                }
                level_no += 1;
            }
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
        for (slot, &c) in args.concurrency.iter().enumerate() {
            for (m, &mode) in modes.iter().enumerate() {
                let rate = medians[slot * modes.len() + m];
                let vs_plain = rate / medians[slot * modes.len()];
                let tag = match mode {
                    Mode::Predicted(_) => format!("  predicted: {vs_plain:.2}x plain"),
                    Mode::Constrained => format!("  constrained: {vs_plain:.2}x free"),
                    Mode::Adapters => format!("  adapters: {vs_plain:.2}x base only"),
                    Mode::Plain => String::new(),
                };
                println!("{c:>11} {:>15} {rate:>15.1} {:>8.2}x{tag}", "", rate / medians[0]);
            }
        }
    }
    if let Some(g) = &grammars {
        json::mask_times(g, &outputs)?;
    }
    // A mixture of experts' token reads its chosen experts only: the ceiling is over what one step reads.
    let llama = &core.model().llama;
    let (weights, read) = (llama.weight_bytes_by_format().values().sum::<usize>(), llama.decode_bytes());
    // Bandwidth measured over a buffer the weights' size (past every cache), the ceiling over what a step reads.
    let mut ceiling = bandwidth::measure(weights);
    ceiling.tokens_per_s = ceiling.gb_per_s * 1e9 / read.max(1) as f64;
    let mib = |b: usize| b as f64 / f64::from(1u32 << 20);
    let what = if read < weights {
        format!("the {:.1} MiB a token reads (of the weights' {:.1} MiB)", mib(read), mib(weights))
    } else {
        format!("the weights' {:.1} MiB", mib(weights))
    };
    print!(
        "bandwidth ceiling: {:.1} GB/s read over {what}: {:.1} tok/s at one sequence",
        ceiling.gb_per_s, ceiling.tokens_per_s
    );
    match args.concurrency.iter().position(|&c| c == 1) {
        Some(slot) => {
            let mut r = rates[slot * modes.len()].clone();
            r.sort_by(f64::total_cmp);
            println!("; decode at c=1 is {:.0}% of it", 100.0 * r[r.len() / 2] / ceiling.tokens_per_s);
        }
        None => println!(),
    }
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS: {rss:.0} MiB");
    }
    Ok(())
}

/// The median step time at the full batch, as a tag.
fn full_batch(steps: &mut [Duration]) -> String {
    steps.sort();
    format!(" (full-batch step p50 {:.2} ms over {} steps)", percentile(steps, 0.5).as_secs_f64() * 1e3, steps.len())
}

/// Time the prefill of one prompt of each length, alone: the time to its first token; then the rate of the
/// `max_tokens - 1` tokens it decodes after that, at that context.
fn prefill(core: &mut zl_worker::engine::EngineCore, lengths: &[usize], max_tokens: u32) -> Result<()> {
    let tok = &core.model().tokenizer;
    let unit = tok.encode("The orchestrators keep the routing state replicated, so losing one loses nothing. ")?;
    let context = core.model().llama.config().context_length;
    println!("{:>14} {:>12} {:>15} {:>15}", "prompt tokens", "TTFT s", "prefill tok/s", "decode tok/s");
    for (i, &asked) in lengths.iter().enumerate() {
        let max_tokens = max_tokens.clamp(1, (context / 2) as u32);
        let n = asked.clamp(1, context - max_tokens as usize);
        // A different first token per run, so the prefix cache never serves one from another.
        let mut prompt = vec![unit[i % unit.len()]];
        prompt.extend(unit.iter().cycle().take(n - 1));
        core.add(1_000_000 + i as u64, Request::new(prompt, Sampling::greedy(), max_tokens))?;
        let started = Instant::now();
        let (mut first, mut decoded) = (None, 0u32);
        while core.has_work() {
            let tokens = core.step().iter().filter(|e| matches!(e, Event::Token { .. })).count() as u32;
            match first {
                None if tokens > 0 => first = Some(started.elapsed()),
                None => {}
                Some(_) => decoded += tokens,
            }
        }
        let ttft = first.unwrap_or_else(|| started.elapsed());
        let decode = started.elapsed().saturating_sub(ttft).as_secs_f64();
        let rate = if decoded > 0 { format!("{:.1}", f64::from(decoded) / decode) } else { "-".into() };
        println!("{n:>14} {:>12.2} {:>15.1} {rate:>15}", ttft.as_secs_f64(), n as f64 / ttft.as_secs_f64());
    }
    if let Some(rss) = peak_rss_mib() {
        println!("peak RSS: {rss:.0} MiB");
    }
    Ok(())
}

/// How a level decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Plain decoding.
    Plain,
    /// With this many draft tokens per step.
    Predicted(usize),
    /// Constrained by the JSON workload's schema.
    Constrained,
    /// Requests spread over the base and the bench's adapters.
    Adapters,
}

/// What a level's requests ask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Prompts {
    Stories,
    /// The overlap workload's edit request.
    Edit,
    /// A city described as JSON.
    Json,
}

/// One run of a concurrency level.
struct Level<'a> {
    /// Its number in the whole bench (keeps prompts unique, so the prefix cache never serves one).
    no: usize,
    /// Sequences at once.
    c: usize,
    max_tokens: u32,
    mode: Mode,
    prompts: Prompts,
    /// The grammar engine and the grammar constrained requests use.
    grammar: Option<(&'a zl_grammar::Engine, String)>,
    /// The adapters of [`Mode::Adapters`]: request i runs on the base when i mod (their count + 1) is 0, else on
    /// that adapter.
    adapters: &'a [zl_worker::engine::RequestAdapter],
    /// Tokens of a document before each prompt.
    context: usize,
}

/// One concurrency level: `c` greedy requests of `max_tokens` each, run to completion; prints the level's line
/// (the ratio against `base`, the round's first level) and returns its decode rate and each request's tokens.
fn run_level(
    core: &mut zl_worker::engine::EngineCore,
    level: &Level<'_>,
    base: &mut Option<f64>,
) -> Result<(f64, Vec<Vec<u32>>)> {
    let topics = ["the sea", "a robot", "autumn", "a city at night", "a lost key", "mountains", "a library", "rain"];
    let mut prompt_tokens = 0usize;
    for i in 0..level.c {
        let tok = &core.model().tokenizer;
        let content = match level.prompts {
            Prompts::Edit => {
                format!("Note {}-{i}. Correct the spelling in this text and return all of it:\n\n{EDIT_TEXT}", level.no)
            }
            Prompts::Json => json::prompt(level.no, i),
            Prompts::Stories => {
                format!("Story {}-{i}: write a long story about {}.", level.no, topics[i % topics.len()])
            }
        };
        let text = tok.render_chat(&[ChatMessage { role: "user".into(), content }])?;
        let mut prompt = tok.encode(&text)?;
        if level.context > 0 {
            let unit =
                tok.encode("The orchestrators keep the routing state replicated, so losing one loses nothing. ")?;
            // A first token of its own per request and level, so the prefix cache never shares the document.
            let vocab = core.model().llama.config().vocab;
            let mut document = vec![((level.no * 97 + i * 7919) % vocab) as u32];
            document.extend(unit.iter().cycle().take(level.context.saturating_sub(1)));
            document.extend(prompt);
            prompt = document;
        }
        prompt_tokens += prompt.len();
        let req = Request {
            prompt,
            sampling: Sampling::greedy(),
            max_tokens: level.max_tokens,
            stop_sequences: vec![],
            logprobs: false,
            top_logprobs: 0,
            prompt_logprobs: false,
            think: None,
            penalties: None,
            speculate: if let Mode::Predicted(drafts) = level.mode { drafts } else { 0 },
            constraint: match &level.grammar {
                Some((engine, grammar)) => Some(engine.start(grammar)?),
                None => None,
            },
            cache_salt: None,
            resume: vec![],
            adapter: match level.mode {
                Mode::Adapters => (i % (level.adapters.len() + 1)).checked_sub(1).map(|a| level.adapters[a].clone()),
                _ => None,
            },
        };
        core.add((level.no * 10_000 + i) as u64, req)?;
    }
    let c = level.c;
    let (mut drafted, mut accepted) = (0u64, 0u64);
    let started = Instant::now();
    let mut first_token = HashSet::new();
    let mut prefill_done = None;
    let mut decode_tokens = 0u64;
    let mut all_tokens = 0u64;
    let mut decode_steps = Vec::new();
    let mut outputs: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    // Decode steps with every sequence still running: the per-step cost at the full batch, whatever the lengths.
    let mut full_steps = Vec::new();
    while core.has_work() {
        let full = core.stats().running == c;
        let step_start = Instant::now();
        let events = core.step();
        let step_time = step_start.elapsed();
        let mut tokens = 0;
        for ev in &events {
            let (Event::Token { seq, .. } | Event::Finished { seq, .. } | Event::Prompt { seq, .. }) = ev;
            if let Event::Finished { draft_tokens, accepted_draft_tokens, .. } = ev {
                drafted += u64::from(*draft_tokens);
                accepted += u64::from(*accepted_draft_tokens);
            }
            if let Event::Token { token, .. } = ev {
                tokens += 1;
                outputs.entry(*seq).or_default().push(*token);
            }
            first_token.insert(*seq);
        }
        all_tokens += tokens;
        match prefill_done {
            None if first_token.len() == c => prefill_done = Some(started.elapsed()),
            None => {}
            Some(_) => {
                decode_tokens += tokens;
                decode_steps.push(step_time);
                if full {
                    full_steps.push(step_time);
                }
            }
        }
    }
    let total = started.elapsed();
    let prefill = prefill_done.unwrap_or(total);
    let decode_time = total.saturating_sub(prefill).as_secs_f64();
    let prefill_rate = prompt_tokens as f64 / prefill.as_secs_f64();
    let decode_rate = if decode_time > 0.0 { decode_tokens as f64 / decode_time } else { 0.0 };
    let ratio = decode_rate / *base.get_or_insert(decode_rate);
    // Every output token over the whole level, prefill included: the decode rate counts only tokens after every
    // sequence's first one, and speculation moves some tokens before that point.
    let e2e_rate = all_tokens as f64 / total.as_secs_f64();
    decode_steps.sort();
    let predicted = match (level.mode, level.prompts) {
        (Mode::Predicted(_), _) => {
            let rate = if drafted > 0 { accepted as f64 / drafted as f64 * 100.0 } else { 0.0 };
            format!("  predicted: {accepted} of {drafted} drafts accepted ({rate:.0}%)")
        }
        (Mode::Constrained, _) => format!("  constrained{}", full_batch(&mut full_steps)),
        (Mode::Adapters, _) => format!("  {} adapters{}", level.adapters.len(), full_batch(&mut full_steps)),
        (Mode::Plain, Prompts::Stories) if !level.adapters.is_empty() => {
            format!("  base only{}", full_batch(&mut full_steps))
        }
        (Mode::Plain, Prompts::Stories) => String::new(),
        (Mode::Plain, Prompts::Edit) => "  plain".to_owned(),
        (Mode::Plain, Prompts::Json) => format!("  free{}", full_batch(&mut full_steps)),
    };
    println!(
        "{c:>11} {prefill_rate:>15.1} {decode_rate:>15.1} {ratio:>8.2}x {:>12.2} {:>12.2} {e2e_rate:>11.1}{predicted}",
        percentile(&decode_steps, 0.5).as_secs_f64() * 1e3,
        percentile(&decode_steps, 0.99).as_secs_f64() * 1e3,
    );
    Ok((decode_rate, outputs.into_values().collect()))
}
