//! The engine actor: one OS thread owns an `EngineCore` and steps it while there is work; callers talk to it
//! through an `EngineHandle` (a command channel) and receive their tokens on a per-request channel.
//!
//! A caller that goes away (its `Generation` dropped, e.g. a client disconnected and the RPC stream was reset) is
//! noticed before the next step and its sequence's KV blocks are freed at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use tokio::sync::mpsc as tokio_mpsc;
use zl_common::sync::lock;

use super::state::{EngineCore, EngineStats, Event, Request, RequestError};
use crate::kv::pool::KvEvent;
use crate::scheduler::SeqId;

pub(super) enum Command {
    Generate {
        seq: SeqId,
        req: Box<Request>,
        out: tokio_mpsc::UnboundedSender<Event>,
        accepted: tokio::sync::oneshot::Sender<Result<(), RequestError>>,
    },
    Cancel(SeqId),
    Resync,
    /// Embed these inputs (an embedding model's engine; a generative one refuses).
    Embed {
        inputs: Vec<Vec<u32>>,
        reply: tokio::sync::oneshot::Sender<Result<Vec<Vec<f32>>, RequestError>>,
    },
}

/// Figures the actor publishes after every step.
#[derive(Clone, Debug, Default)]
pub struct Published {
    /// Engine figures.
    pub stats: EngineStats,
    /// Output tokens per second over the last second.
    pub tokens_per_second: f32,
    /// Prefix-block events not yet reported to the orchestrators (bounded: see `MAX_PENDING_EVENTS`).
    pub kv_events: Vec<KvEvent>,
    /// `kv_events` starts with a full snapshot (every held or cached block as `Stored`): the receiver must forget
    /// what it knew of this model's cache first (`KvCacheEvents.cleared`).
    pub resync: bool,
}

/// Most KV events kept for the next report. Past it (nobody has been taking them) the pending events are replaced
/// by a full snapshot with `resync` set, so nothing is silently lost and memory stays bounded.
pub const MAX_PENDING_EVENTS: usize = 65_536;

/// A handle to a running engine. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    next: Arc<AtomicU64>,
    published: Arc<Mutex<Published>>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle").finish_non_exhaustive()
    }
}

/// The engine thread has stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the engine has stopped")]
pub struct EngineGone;

/// A running request's output. Dropping it cancels the request.
pub struct Generation {
    seq: SeqId,
    rx: tokio_mpsc::UnboundedReceiver<Event>,
    tx: mpsc::Sender<Command>,
    done: bool,
}

impl Generation {
    /// The next event; `None` once the request finished (after its `Finished` event) or the engine stopped.
    pub async fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        if matches!(ev, Some(Event::Finished { .. }) | None) {
            self.done = true;
        }
        ev
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(Command::Cancel(self.seq));
        }
    }
}

impl EngineHandle {
    /// Start the engine thread for `core`, with a name for diagnostics.
    pub fn spawn(core: EngineCore, name: &str) -> std::io::Result<EngineHandle> {
        let (tx, rx) = mpsc::channel();
        // Figures are published from the start (an idle engine blocks before its first step), so a registration
        // made right after spawning sees the real KV pool size.
        let published = Arc::new(Mutex::new(Published { stats: core.stats(), ..Published::default() }));
        let pub2 = published.clone();
        let model = name.to_owned();
        std::thread::Builder::new().name(format!("engine-{name}")).spawn(move || run(core, rx, pub2, &model))?;
        Ok(EngineHandle { tx, next: Arc::new(AtomicU64::new(1)), published })
    }

    /// Submit a request. Refusals (context too long, pool too small) come back at once.
    pub async fn generate(&self, req: Request) -> Result<Result<Generation, RequestError>, EngineGone> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (out, rx) = tokio_mpsc::unbounded_channel();
        let (accepted, verdict) = tokio::sync::oneshot::channel();
        self.tx.send(Command::Generate { seq, req: Box::new(req), out, accepted }).map_err(|_| EngineGone)?;
        match verdict.await.map_err(|_| EngineGone)? {
            Ok(()) => Ok(Ok(Generation { seq, rx, tx: self.tx.clone(), done: false })),
            Err(e) => Ok(Err(e)),
        }
    }

    /// A handle on an engine thread started elsewhere (an embedding model's, `embedder.rs`).
    pub(super) fn from_parts(tx: mpsc::Sender<Command>, published: Arc<Mutex<Published>>) -> EngineHandle {
        EngineHandle { tx, next: Arc::new(AtomicU64::new(1)), published }
    }

    /// Embed `inputs` (an embedding model): one unit vector each, in order. Refusals (a generative model, an input
    /// longer than the context) come back as the inner error; dropping the future abandons the work.
    pub async fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Result<Vec<Vec<f32>>, RequestError>, EngineGone> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.tx.send(Command::Embed { inputs, reply }).map_err(|_| EngineGone)?;
        answer.await.map_err(|_| EngineGone)
    }

    /// The latest published figures; `take_events` also takes the pending KV events.
    pub fn published(&self, take_events: bool) -> Published {
        let mut p = lock(&self.published);
        let (events, resync) = if take_events {
            (std::mem::take(&mut p.kv_events), std::mem::take(&mut p.resync))
        } else {
            (Vec::new(), false)
        };
        Published { stats: p.stats, tokens_per_second: p.tokens_per_second, kv_events: events, resync }
    }

    /// Ask for a full snapshot of the cached blocks in the next [`EngineHandle::published`] (after an orchestrator
    /// registration, or a report that did not arrive).
    pub fn request_resync(&self) -> Result<(), EngineGone> {
        self.tx.send(Command::Resync).map_err(|_| EngineGone)
    }
}

fn run(mut core: EngineCore, rx: mpsc::Receiver<Command>, published: Arc<Mutex<Published>>, model: &str) {
    let mut outputs: HashMap<SeqId, tokio_mpsc::UnboundedSender<Event>> = HashMap::new();
    let mut window_start = Instant::now();
    let mut window_tokens = 0u64;
    let mut rate = 0f32;
    let labels = [("model", model.to_owned())];
    loop {
        // Block for a command when idle; otherwise take what has arrived and keep stepping.
        let first = if core.has_work() {
            None
        } else {
            match rx.recv() {
                Ok(cmd) => Some(cmd),
                Err(_) => return,
            }
        };
        for cmd in first.into_iter().chain(rx.try_iter()) {
            match cmd {
                Command::Generate { seq, req, out, accepted } => {
                    let verdict = core.add(seq, *req);
                    if verdict.is_ok() {
                        outputs.insert(seq, out);
                    }
                    let _ = accepted.send(verdict);
                }
                Command::Cancel(seq) => {
                    core.cancel(seq);
                    if outputs.remove(&seq).is_some() {
                        metrics::counter!("zl_worker_cancelled_total", &labels).increment(1);
                    }
                }
                Command::Resync => resync(&mut core, &published),
                Command::Embed { reply, .. } => {
                    let _ = reply.send(Err(RequestError::NotEmbedding));
                }
            }
        }
        // Callers that went away without a word.
        let gone: Vec<SeqId> = outputs.iter().filter(|(_, tx)| tx.is_closed()).map(|(s, _)| *s).collect();
        for seq in gone {
            core.cancel(seq);
            outputs.remove(&seq);
            metrics::counter!("zl_worker_cancelled_total", &labels).increment(1);
        }
        let started = Instant::now();
        let events = core.step();
        let step_time = started.elapsed();
        let mut tokens = 0u64;
        // Tokens each sequence got this step: more than one where predictive streaming's drafts were accepted.
        let mut per_seq: HashMap<SeqId, u32> = HashMap::new();
        for ev in events {
            let seq = match &ev {
                Event::Prompt { seq, .. } => *seq,
                Event::Token { seq, .. } => {
                    tokens += 1;
                    *per_seq.entry(*seq).or_default() += 1;
                    *seq
                }
                Event::Finished { seq, draft_tokens, accepted_draft_tokens, .. } => {
                    // Predictive streaming's figures: the accepted share is its acceptance rate.
                    if *draft_tokens > 0 {
                        metrics::counter!("zl_worker_draft_tokens_total", &labels).increment(u64::from(*draft_tokens));
                        metrics::counter!("zl_worker_draft_tokens_accepted_total", &labels)
                            .increment(u64::from(*accepted_draft_tokens));
                    }
                    *seq
                }
            };
            let finished = matches!(ev, Event::Finished { .. });
            if let Some(tx) = outputs.get(&seq) {
                let _ = tx.send(ev);
            }
            if finished {
                outputs.remove(&seq);
            }
        }
        if tokens > 0 {
            metrics::counter!("zl_worker_output_tokens_total", &labels).increment(tokens);
            metrics::histogram!("zl_worker_step_seconds", &labels).record(step_time.as_secs_f64());
            for n in per_seq.values() {
                metrics::histogram!("zl_worker_time_per_output_token_seconds", &labels)
                    .record(step_time.as_secs_f64() / f64::from(*n));
            }
        }
        window_tokens += tokens;
        let elapsed = window_start.elapsed().as_secs_f32();
        if elapsed >= 1.0 {
            rate = window_tokens as f32 / elapsed;
            window_start = Instant::now();
            window_tokens = 0;
        }
        if !core.has_work() {
            // About to wait for a command: what is published now stands until then, so it must say idle (a rate
            // left from the last window read as load on an idle worker in `zl admin workers`).
            rate = 0.0;
            window_start = Instant::now();
            window_tokens = 0;
        }
        let stats = core.stats();
        if let Some(kv) = stats.kv {
            metrics::gauge!("zl_worker_kv_blocks_total", &labels).set(kv.total as f64);
            metrics::gauge!("zl_worker_kv_blocks_used", &labels).set(kv.used as f64);
            metrics::gauge!("zl_worker_kv_blocks_free", &labels).set(kv.free as f64);
            metrics::gauge!("zl_worker_kv_blocks_cached", &labels).set(kv.cached as f64);
            metrics::gauge!("zl_worker_kv_fragmentation_ratio", &labels).set(f64::from(kv.fragmentation));
            metrics::gauge!("zl_worker_prefix_hit_rate", &labels).set(kv.hit_rate());
        }
        metrics::counter!("zl_worker_prefill_tokens_total", &labels).absolute(stats.prefill_tokens);
        metrics::gauge!("zl_worker_queue_depth", &labels).set(stats.waiting as f64);
        metrics::gauge!("zl_worker_running_sequences", &labels).set(stats.running as f64);
        metrics::gauge!("zl_worker_tokens_per_second", &labels).set(f64::from(rate));
        let new_events = core.drain_kv_events();
        let snapshot_size = core.kv_snapshot_size();
        let overflow = {
            let mut p = lock(&published);
            p.stats = stats;
            p.tokens_per_second = rate;
            p.kv_events.extend(new_events);
            // A snapshot is as large as the pool and the tiers, so the bound leaves room for one plus as many events
            // again (a snapshot never trips it by itself, so one is not rebuilt every step).
            p.kv_events.len() > MAX_PENDING_EVENTS.max(2 * snapshot_size)
        };
        if overflow {
            resync(&mut core, &published);
        }
    }
}

fn resync(core: &mut EngineCore, published: &Mutex<Published>) {
    let snapshot: Vec<KvEvent> = core.kv_snapshot();
    let mut p = lock(published);
    p.kv_events = snapshot;
    p.resync = true;
}
