//! `zl-worker bench --workload tiers`: what the KV cache's lower tiers buy, measured side by side in one process on
//! the same hot pool (`--kv-memory-mb`, small on purpose) and the same requests.
//!
//! 1. Multi-turn chat: `--conversations` conversations of `--turns` turns, taken in turns (every conversation's
//!    first turn, then every second turn, ...), so each one's history has been pushed out of the hot pool by the
//!    others' when it comes back. Each request alone (the time to first token is then the prompt's cost only),
//!    greedy, with the tiers off, with host memory (`--kv-host-mb`, 1024 MiB unless given) and with host memory of
//!    a sixteenth of that plus a disk tier: TTFT p50/p90/p99 of each and the ratios, and whether every answer was
//!    byte-identical.
//! 2. A restart: a `--restart-tokens` prompt computed by a worker with a disk tier that then stops; the time to its
//!    first token on a cold worker and on one restarted on that disk tier (its blocks read back first, as a worker
//!    does while a request waits). Its hot pool is at least 512 MiB, so that the prompt fits.
//!
//! The disk tier lives under `--kv-disk-dir` when given, else a directory of its own under the system's temporary
//! directory, removed at the end.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use zl_text::ChatMessage;
use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::sampling::Sampling;

use super::percentile;
use crate::ModelArgs;

/// The multi-turn workload's size.
pub(crate) struct Shape {
    pub(crate) conversations: usize,
    pub(crate) turns: usize,
    pub(crate) words: usize,
    pub(crate) max_tokens: u32,
    pub(crate) restart_tokens: usize,
}

/// Words the users' turns are drawn from.
const WORDS: &[&str] = &[
    "river", "mountain", "engine", "quiet", "garden", "signal", "copper", "harbor", "lantern", "orbit", "meadow",
    "circuit", "velvet", "thunder", "archive", "compass", "ember", "glacier", "pocket", "ribbon", "saddle", "timber",
];

/// Conversation `c`'s user turn `t`: `words` seeded words and a question.
fn user_turn(c: usize, t: usize, words: usize) -> String {
    let mut x = (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (t as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut text: Vec<&str> = Vec::with_capacity(words);
    for _ in 0..words {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        text.push(WORDS[(x >> 40) as usize % WORDS.len()]);
    }
    format!("Note {t} of conversation {c}: {}. Which word came first?", text.join(" "))
}

/// A greedy answer to `prompt`: its tokens, its text and the time to its first token (with a disk tier, reading
/// the prompt's blocks back from it first, as a worker does while the request waits).
fn answer(e: &mut EngineCore, prompt: Vec<u32>, max_tokens: u32) -> Result<(Vec<u32>, String, Duration)> {
    let started = Instant::now();
    if let Some(t) = e.tiers().filter(|t| t.has_disk()) {
        t.prefetch(&prompt, None);
    }
    let req = Request::new(prompt, Sampling { temperature: 0.0, top_p: 1.0, top_k: 0, seed: 7 }, max_tokens);
    e.add(1, req).map_err(|err| anyhow::anyhow!("{err}"))?;
    let (mut tokens, mut text, mut first) = (Vec::new(), String::new(), None);
    while e.has_work() {
        for ev in e.step() {
            if let Event::Token { token, text: t, .. } = ev {
                first.get_or_insert_with(|| started.elapsed());
                tokens.push(token);
                text.push_str(&t);
            }
        }
    }
    Ok((tokens, text, first.unwrap_or_else(|| started.elapsed())))
}

/// An engine on `model` with the given tiers (`host_mb` 0: none; `disk`: a directory).
fn engine(model: &ModelArgs, host_mb: usize, disk: Option<&Path>) -> Result<EngineCore> {
    engine_with(model, model.kv_memory_mb, host_mb, disk)
}

/// [`engine`] with a hot pool of `kv_mb` MiB.
fn engine_with(model: &ModelArgs, kv_mb: usize, host_mb: usize, disk: Option<&Path>) -> Result<EngineCore> {
    let mut args = model.clone();
    args.kv_memory_mb = kv_mb;
    args.kv_host_mb = host_mb;
    args.kv_disk_dir = disk.map(Path::to_path_buf);
    let loaded = crate::load(&args)?.swap_remove(0);
    match loaded.run {
        crate::Run::Generate(core) => Ok(*core),
        crate::Run::Embed(_) => bail!("{} is an embedding model", loaded.path.display()),
    }
}

/// One configuration's multi-turn run: every answer, and every time to first token.
fn multi_turn(e: &mut EngineCore, shape: &Shape) -> Result<(Vec<Vec<u32>>, Vec<Duration>)> {
    let say = |role: &str, content: &str| ChatMessage { role: role.into(), content: content.into() };
    let mut chats: Vec<Vec<ChatMessage>> =
        vec![vec![say("system", "You are a helpful assistant.")]; shape.conversations];
    let (mut answers, mut ttfts) = (Vec::new(), Vec::new());
    for t in 0..shape.turns {
        for (c, chat) in chats.iter_mut().enumerate() {
            chat.push(say("user", &user_turn(c, t, shape.words)));
            let tok = &e.model().tokenizer;
            let prompt = tok.encode(&tok.render_chat(chat)?)?;
            let (tokens, text, ttft) = answer(e, prompt, shape.max_tokens)?;
            chat.push(say("assistant", &text));
            answers.push(tokens);
            ttfts.push(ttft);
        }
    }
    Ok((answers, ttfts))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Run both measurements and print them.
pub(crate) fn run(model: &ModelArgs, shape: &Shape) -> Result<()> {
    let host_mb = if model.kv_host_mb > 0 { model.kv_host_mb } else { 1024 };
    let (dir, own) = match &model.kv_disk_dir {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("zl-bench-kv-{}", std::process::id())), true),
    };
    let result = measure(model, shape, host_mb, &dir);
    if own {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

fn measure(model: &ModelArgs, shape: &Shape, host_mb: usize, dir: &Path) -> Result<()> {
    println!(
        "multi-turn: {} conversations x {} turns of {} words, {} output tokens, hot pool {} MiB, taken in turns",
        shape.conversations, shape.turns, shape.words, shape.max_tokens, model.kv_memory_mb
    );
    println!("{:>24} {:>12} {:>12} {:>12} {:>10}", "tiers", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "p90 gain");
    let small_host = (host_mb / 16).max(1);
    let configs: [(String, usize, Option<PathBuf>); 3] = [
        ("off".into(), 0, None),
        (format!("host {host_mb} MiB"), host_mb, None),
        (format!("host {small_host} MiB + disk"), small_host, Some(dir.join("multi-turn"))),
    ];
    let mut baseline: Option<(Vec<Vec<u32>>, f64)> = None;
    let mut identical = true;
    for (name, host, disk) in &configs {
        let mut e = engine(model, *host, disk.as_deref())?;
        let (answers, mut ttfts) = multi_turn(&mut e, shape)?;
        ttfts.sort();
        let p90 = ms(percentile(&ttfts, 0.9));
        let gain = match &baseline {
            Some((first, off_p90)) => {
                identical &= *first == answers;
                format!("{:>9.2}x", off_p90 / p90)
            }
            None => {
                baseline = Some((answers, p90));
                String::new()
            }
        };
        let (p50, p99) = (ms(percentile(&ttfts, 0.5)), ms(percentile(&ttfts, 0.99)));
        println!("{name:>24} {p50:>12.1} {p90:>12.1} {p99:>12.1} {gain}");
    }
    println!("greedy answers byte-identical with and without tiers: {}", if identical { "yes" } else { "NO" });
    restart(model, shape, host_mb, &dir.join("restart"))
}

/// The restart measurement (on a hot pool of at least 512 MiB, which the prompt fits).
fn restart(model: &ModelArgs, shape: &Shape, host_mb: usize, dir: &Path) -> Result<()> {
    let kv_mb = model.kv_memory_mb.max(512);
    let mut first = engine_with(model, kv_mb, host_mb, Some(dir))?;
    let tok = first.model().tokenizer.clone();
    let mut words = String::new();
    let mut n = 0;
    while tok.encode(&words)?.len() < shape.restart_tokens {
        words.push_str(&user_turn(n, 0, 64));
        words.push(' ');
        n += 1;
    }
    let mut prompt = tok.encode(&words)?;
    prompt.truncate(shape.restart_tokens);
    prompt.extend(tok.encode(" Which word came first?")?);
    let (computed, _, _) = answer(&mut first, prompt.clone(), shape.max_tokens)?;
    if !first.tiers().is_some_and(|t| t.flush(Duration::from_secs(120))) {
        bail!("the disk tier's writer did not catch up in 120 s");
    }
    drop(first);
    let mut cold = engine_with(model, kv_mb, 0, None)?;
    let (cold_answer, _, cold_ttft) = answer(&mut cold, prompt.clone(), shape.max_tokens)?;
    drop(cold);
    let mut warm = engine_with(model, kv_mb, host_mb, Some(dir))?;
    let (warm_answer, _, warm_ttft) = answer(&mut warm, prompt.clone(), shape.max_tokens)?;
    let cached = warm.tiers().map_or(0, |t| t.blocks().0);
    println!(
        "restart: a {}-token prompt's first token {:.1} ms cold, {:.1} ms on the restarted disk tier (its {} blocks \
         read back first): {:.2}x; answers identical: {}",
        prompt.len(),
        ms(cold_ttft),
        ms(warm_ttft),
        cached,
        cold_ttft.as_secs_f64() / warm_ttft.as_secs_f64(),
        if computed == cold_answer && cold_answer == warm_answer { "yes" } else { "NO" }
    );
    Ok(())
}
