//! The engine's synchronous state: scheduler, model, KV storage and per-request decoding state, advanced one step
//! at a time. The actor (`engine::actor`) owns one of these on a dedicated thread; tests drive it directly.

use std::collections::HashMap;
use std::sync::Arc;

use rayon::prelude::*;

use zl_wire::message::StopReason;

use crate::device::Device;
use crate::engine::backend::{Backend, DeviceError};
use crate::engine::logprobs::{self, Logprob, LogprobWants, RowKind};
use crate::engine::seq::{SeqState, advance, before_step, forced, masks, only_stops};
use crate::engine::tiering;
use crate::kv::pool::BlockPool;
use crate::kv::tier::store::Tiers;
use crate::kv::window::{KvLayout, WindowKv};
use crate::model::LoadedModel;
use crate::model::llama::{BatchItem, KvStore, PARALLEL_ROWS};
use crate::model::lora::LoraAdapter;
use crate::sampling::{LogSoftmax, Sampling, sample};
use crate::scheduler::{AdmitError, Scheduler, SchedulerConfig, SeqId, StepItem};
use crate::stop::StopMatcher;
use zl_text::Detokenizer;

/// A request as the engine runs it.
#[derive(Clone, Debug)]
pub struct Request {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling settings (seed included).
    pub sampling: Sampling,
    /// Output token limit, at least 1.
    pub max_tokens: u32,
    /// Stop strings.
    pub stop_sequences: Vec<String>,
    /// Report each token's log-probability (a softmax over the vocabulary per token, so only when asked).
    pub logprobs: bool,
    /// With `logprobs`: the most likely tokens at each position, this many.
    pub top_logprobs: u8,
    /// With `logprobs`: the prompt's too (the prompt is then computed whole, without prefix cache hits).
    pub prompt_logprobs: bool,
    /// Draft tokens per step at most for predictive streaming (prompt-lookup speculation); 0 turns it off. The
    /// output is the same either way, byte for byte: only how many steps it takes changes.
    pub speculate: usize,
    /// The grammar the output must match, compiled; `None` for free output.
    pub constraint: Option<zl_grammar::Constraint>,
    /// The prompt's cache scope salt (`zl_common::block_hash::cache_salt`): prefix blocks are shared only with
    /// requests of the same scope. `None`: unsalted.
    pub cache_salt: Option<u64>,
    /// Output tokens another worker already produced (a migration; at most `max_tokens`): the sequence continues
    /// after them exactly as that worker would have, and sends only what follows them.
    pub resume: Vec<u32>,
    /// The LoRA adapter it runs with (`None`: the base model).
    pub adapter: Option<RequestAdapter>,
    /// A thinking section closed by force once its budget is spent (`None`: no budget).
    pub think: Option<zl_wire::message::ThinkBudget>,
    /// Logit adjustments before sampling (`None`: none).
    pub penalties: Option<zl_wire::message::Penalties>,
}

/// A LoRA adapter a request runs with.
#[derive(Clone, Debug)]
pub struct RequestAdapter {
    /// Its updates, loaded for this engine's model.
    pub adapter: Arc<LoraAdapter>,
    /// Its content key (its SHA-256's first eight bytes, big-endian): its prefix blocks are its own
    /// (`zl_common::block_hash::adapter_salt`).
    pub key: u64,
}

impl Request {
    /// The salt its prefix blocks' chain starts from: the cache scope's, and the adapter's within it.
    pub fn chain_salt(&self) -> Option<u64> {
        match &self.adapter {
            Some(a) => Some(zl_common::block_hash::adapter_salt(self.cache_salt, a.key)),
            None => self.cache_salt,
        }
    }

    /// A request for `max_tokens` after `prompt`, sampled as `sampling`: no stop sequences, logprobs, speculation,
    /// grammar, cache scope or tokens to resume after (set the fields for those).
    pub fn new(prompt: Vec<u32>, sampling: Sampling, max_tokens: u32) -> Self {
        Request {
            prompt,
            sampling,
            max_tokens,
            stop_sequences: vec![],
            logprobs: false,
            top_logprobs: 0,
            prompt_logprobs: false,
            think: None,
            penalties: None,
            speculate: 0,
            constraint: None,
            cache_salt: None,
            resume: vec![],
            adapter: None,
        }
    }
}

/// Something that happened to a sequence during a step.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// New output.
    Token {
        /// The sequence.
        seq: SeqId,
        /// The sampled token.
        token: u32,
        /// Its log-probability (and the most likely tokens at its position), when the request asked for them.
        logprob: Option<Logprob>,
        /// Text that is final now (may be empty while a character or stop sequence is pending).
        text: String,
    },
    /// Log-probabilities of prompt tokens (a request that asked for the prompt's), before its first output token.
    Prompt {
        /// The sequence.
        seq: SeqId,
        /// The position of the first of `tokens` in the prompt (at least 1).
        start: u32,
        /// The prompt's tokens from `start`.
        tokens: Vec<u32>,
        /// One per token.
        logprobs: Vec<Logprob>,
    },
    /// The sequence ended; it has been removed and its blocks freed.
    Finished {
        /// The sequence.
        seq: SeqId,
        /// Why.
        reason: StopReason,
        /// The matched stop sequence.
        stop_sequence: Option<String>,
        /// Text released by the end (held-back text, when no stop sequence matched).
        text: String,
        /// Prompt tokens.
        input_tokens: u32,
        /// Output tokens.
        output_tokens: u32,
        /// Prompt tokens served from the prefix cache.
        cached_input_tokens: u32,
        /// Draft tokens verified (predictive streaming).
        draft_tokens: u32,
        /// Draft tokens accepted: output tokens that cost no step of their own.
        accepted_draft_tokens: u32,
    },
}

/// Why a request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Prompt plus output do not fit the context window.
    #[error("prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context window of {context} tokens")]
    ContextLength {
        /// Prompt tokens.
        prompt: usize,
        /// Output limit.
        max_tokens: u32,
        /// Window.
        context: usize,
    },
    /// The KV pool can never hold it, or the prompt is empty.
    #[error(transparent)]
    Admit(#[from] AdmitError),
    /// `max_tokens` is 0.
    #[error("max_tokens must be at least 1")]
    NoOutput,
    /// More tokens to resume after than `max_tokens` allows.
    #[error("{resume} tokens to resume after exceed max_tokens {max_tokens}")]
    Resume {
        /// Tokens already produced.
        resume: usize,
        /// Output limit.
        max_tokens: u32,
    },
    /// A LoRA adapter on a device whose kernels do not apply them.
    #[error("LoRA adapters run on the CPU in this build; this worker's model is on a GPU")]
    AdapterDevice,
    /// A generation asked of an embedding model.
    #[error("the model is an embedding model: it answers embeddings requests (/v1/embeddings), not generation")]
    NotGenerative,
    /// Embeddings asked of a generative model.
    #[error("the model generates text: it does not answer embeddings requests")]
    NotEmbedding,
    /// An embedding input empty or longer than the model's context.
    #[error("input {index} has {tokens} tokens; the model embeds 1 to {context} tokens per input")]
    InputLength {
        /// Which input.
        index: usize,
        /// Its tokens.
        tokens: usize,
        /// The model's context window.
        context: usize,
    },
}

/// Why an engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum EngineInitError {
    /// The scheduler settings are inconsistent.
    #[error(transparent)]
    Config(#[from] crate::scheduler::ConfigError),
    /// The device cannot run the model.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Engine figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Sequences waiting to start.
    pub waiting: usize,
    /// Sequences in the running batch.
    pub running: usize,
    /// KV figures.
    pub kv: Option<crate::kv::pool::KvStats>,
    /// Prompt tokens prefilled since the engine started (recomputation after preemption included).
    pub prefill_tokens: u64,
    /// KV blocks of prompt tokens admitted but not computed yet (the prefill work waiting here).
    pub queued_prefill_blocks: usize,
    /// GPU memory (free, total bytes), when the engine runs on a GPU.
    pub device_memory: Option<(u64, u64)>,
}

/// The synchronous engine.
pub struct EngineCore {
    model: LoadedModel,
    backend: Backend,
    sched: Scheduler,
    seqs: HashMap<SeqId, SeqState>,
    prefill_tokens: u64,
    /// Events of sequences that ended before running (a resumed one whose last produced token ended it), sent
    /// with the next step's.
    pending: Vec<Event>,
    /// The lower tiers evicted blocks go down to, when on.
    tiers: Option<Arc<Tiers>>,
}

impl std::fmt::Debug for EngineCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineCore").field("sequences", &self.seqs.len()).finish_non_exhaustive()
    }
}

impl EngineCore {
    /// An engine for `model` with a KV pool of `blocks` blocks of `block_size` tokens for every layer.
    pub fn new(
        model: LoadedModel,
        blocks: usize,
        block_size: usize,
        config: SchedulerConfig,
    ) -> Result<EngineCore, crate::scheduler::ConfigError> {
        let layout = KvLayout::full(blocks);
        let backend = Backend::Cpu(KvStore::with_layout(model.llama.config(), &layout, block_size));
        EngineCore::with_backend(model, backend, layout, block_size, config)
    }

    /// An engine with the model and its KV cache on `device`, the KV split as `layout` says (the sliding-window
    /// layers' blocks apart, when it has them: [`KvStore::sizing`] makes one for a budget).
    pub fn on_device(
        model: LoadedModel,
        device: Device,
        layout: KvLayout,
        block_size: usize,
        config: SchedulerConfig,
    ) -> Result<EngineCore, EngineInitError> {
        let backend = Backend::new(&model, device, &layout, block_size)?;
        Ok(EngineCore::with_backend(model, backend, layout, block_size, config)?)
    }

    fn with_backend(
        model: LoadedModel,
        backend: Backend,
        layout: KvLayout,
        block_size: usize,
        config: SchedulerConfig,
    ) -> Result<EngineCore, crate::scheduler::ConfigError> {
        let max_item = config.max_item();
        let mut sched = Scheduler::new(config, BlockPool::new(layout.blocks, block_size))?;
        if let Some(window) = layout.window {
            sched = sched.with_window(WindowKv::new(window, block_size, max_item));
        }
        Ok(EngineCore {
            model,
            backend,
            sched,
            seqs: HashMap::new(),
            prefill_tokens: 0,
            pending: Vec::new(),
            tiers: None,
        })
    }

    /// Bytes one block's keys and values take in the lower tiers; `None` when this engine's blocks cannot go there
    /// (sliding-window layers kept apart).
    pub fn tier_block_bytes(&self) -> Option<usize> {
        self.sched.window().is_none().then(|| self.backend.block_bytes()).flatten()
    }

    /// Send evicted blocks down to `tiers` and take prompts' prefixes back from them (see `crate::kv::tier`).
    pub fn attach_tiers(&mut self, tiers: Arc<Tiers>) -> Result<(), String> {
        let payload = self.tier_block_bytes().ok_or(
            "KV tiers keep blocks of every layer: this model's sliding-window layers keep blocks of their own, so \
             it runs without tiers",
        )?;
        if (payload, self.sched.pool().block_size()) != (tiers.payload(), tiers.block_size()) {
            return Err(format!(
                "the tiers keep blocks of {} tokens and {} bytes; this engine's are {} and {payload}",
                tiers.block_size(),
                tiers.payload(),
                self.sched.pool().block_size()
            ));
        }
        self.sched.pool_mut().set_tiered();
        self.tiers = Some(tiers);
        Ok(())
    }

    /// The tiers attached, if any.
    pub fn tiers(&self) -> Option<&Arc<Tiers>> {
        self.tiers.as_ref()
    }

    /// Blocks the sliding-window layers' own pool holds now and in all, when it has one.
    pub fn window_blocks(&self) -> Option<(usize, usize)> {
        self.sched.window().map(|w| (w.pool().stats().used, w.total()))
    }

    /// GPU memory (free, total bytes), when the engine runs on a GPU.
    pub fn device_memory(&self) -> Option<(u64, u64)> {
        self.backend.device_memory()
    }

    /// The model.
    pub fn model(&self) -> &LoadedModel {
        &self.model
    }

    /// Queue a request under `seq`.
    pub fn add(&mut self, seq: SeqId, req: Request) -> Result<(), RequestError> {
        if req.max_tokens == 0 {
            return Err(RequestError::NoOutput);
        }
        let context = self.model.llama.config().context_length;
        if req.prompt.len() + req.max_tokens as usize > context {
            return Err(RequestError::ContextLength { prompt: req.prompt.len(), max_tokens: req.max_tokens, context });
        }
        if req.resume.len() > req.max_tokens as usize {
            return Err(RequestError::Resume { resume: req.resume.len(), max_tokens: req.max_tokens });
        }
        if req.adapter.is_some() && !matches!(self.backend, Backend::Cpu(_)) {
            return Err(RequestError::AdapterDevice);
        }
        let salt = req.chain_salt();
        let prompt_len = req.prompt.len() as u32;
        // Constrained and budgeted requests do not speculate: every draft would need its own mask.
        let penalized = req.penalties.filter(|p| !p.is_neutral()).map(crate::engine::penalize::Penalized::new);
        let speculate =
            if req.constraint.is_some() || req.think.is_some() || penalized.is_some() { 0 } else { req.speculate };
        let mut st = SeqState {
            sampling: req.sampling,
            logprobs: req.logprobs.then(|| LogprobWants {
                top: usize::from(req.top_logprobs),
                prompt: req.prompt_logprobs.then(|| req.prompt.clone()),
                next: 1,
            }),
            max_tokens: req.max_tokens,
            generated: 0,
            prompt_len,
            detok: Detokenizer::default(),
            stop: StopMatcher::new(&req.stop_sequences),
            drafted: 0,
            accepted: 0,
            constraint: req.constraint,
            closing: Default::default(),
            think: req.think.map(crate::engine::think::Think::new),
            penalized,
            adapter: req.adapter.map(|a| a.adapter),
        };
        // A migration: the tokens already produced go through the sequence's state as they did on the worker that
        // produced them (the sampler's step, the grammar and its closing, the detokenizer, the stop matcher), their
        // text unsent: it was sent. Their KV is computed with the prompt's.
        for &token in &req.resume {
            if forced(&st) {
                before_step(&mut st, false);
            }
            if let Some((reason, stop_sequence)) = advance(&mut st, &self.model.tokenizer, token).end {
                // It ended there (its finish was lost with the worker): finish again, nothing to compute.
                self.pending.push(finished(seq, &mut st, reason, stop_sequence, 0));
                return Ok(());
            }
        }
        metrics::counter!("zl_worker_resumed_tokens_total").increment(req.resume.len() as u64);
        let remaining = (req.max_tokens - st.generated) as usize;
        let mut tokens = req.prompt;
        tokens.extend(&req.resume);
        self.sched.add(seq, tokens, remaining)?;
        if req.logprobs && req.prompt_logprobs {
            self.sched.uncached(seq);
        }
        self.sched.salt(seq, salt);
        // Constrained requests do not speculate: every draft would need its own mask.
        self.sched.speculate(seq, speculate);
        self.seqs.insert(seq, st);
        Ok(())
    }

    /// Drop a sequence (its caller went away); its KV blocks are free when this returns.
    pub fn cancel(&mut self, seq: SeqId) {
        self.seqs.remove(&seq);
        self.sched.remove(seq);
    }

    /// True when a step would do work.
    pub fn has_work(&self) -> bool {
        !self.sched.is_idle() || !self.pending.is_empty()
    }

    /// Current figures.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            waiting: self.sched.waiting(),
            running: self.sched.running(),
            kv: Some(self.sched.pool().stats()),
            prefill_tokens: self.prefill_tokens,
            queued_prefill_blocks: self.sched.queued_prefill_blocks(),
            device_memory: self.backend.device_memory(),
        }
    }

    /// Every block hash the pool holds or caches, dropping pending events (the snapshot supersedes them): what a
    /// worker sends the orchestrators to resynchronise their picture of its cache.
    pub fn kv_snapshot(&mut self) -> Vec<crate::kv::pool::KvEvent> {
        self.sched.pool_mut().drain_events();
        match &self.tiers {
            Some(t) => tiering::snapshot(t, self.sched.pool()),
            None => self.sched.pool().indexed_hashes().into_iter().map(crate::kv::pool::KvEvent::Stored).collect(),
        }
    }

    /// Blocks a full snapshot ([`EngineCore::kv_snapshot`]) names at most now: the pool's, and the tiers'.
    pub fn kv_snapshot_size(&self) -> usize {
        let pool = self.sched.pool().stats().total;
        self.tiers.as_ref().map_or(pool, |t| tiering::snapshot_size(t, pool))
    }

    /// Block-pool events since the last call (for the orchestrators): with tiers, a block leaves only when neither
    /// the pool nor a tier holds it.
    pub fn drain_kv_events(&mut self) -> Vec<crate::kv::pool::KvEvent> {
        match &self.tiers {
            Some(t) => tiering::events(t, self.sched.pool_mut()),
            None => self.sched.pool_mut().drain_events(),
        }
    }

    /// Run one step: schedule, run the model over the batch, sample, verify drafts, detokenize, check stops.
    pub fn step(&mut self) -> Vec<Event> {
        let mut found = Vec::new();
        let plan = match &self.tiers {
            Some(t) => {
                let mut held = |h, tokens: &[u32]| t.take_back(h, tokens).map(|b| found.push(b)).is_some();
                let plan = self.sched.schedule_with(Some(&mut held));
                tiering::exchange(t, &mut self.backend, self.sched.pool_mut(), &plan.restores, &found);
                plan
            }
            None => self.sched.schedule(),
        };
        if plan.items.is_empty() {
            return std::mem::take(&mut self.pending);
        }
        // Each item's logits rows (its last ones): the sampled rows, and before them the prompt rows a sequence
        // asking for the prompt's log-probabilities has not reported yet.
        let kinds: Vec<Vec<RowKind>> = plan
            .items
            .iter()
            .map(|it| logprobs::rows(it, self.seqs.get(&it.seq).and_then(|s| s.logprobs.as_ref())))
            .collect();
        // Each item's adapter, held apart from the sequences (which sampling then updates).
        let adapters: Vec<Option<Arc<LoraAdapter>>> =
            plan.items.iter().map(|it| self.seqs.get(&it.seq).and_then(|s| s.adapter.clone())).collect();
        let items: Vec<BatchItem<'_>> = plan
            .items
            .iter()
            .zip(&adapters)
            .zip(&kinds)
            .map(|((it, adapter), kinds)| BatchItem {
                tokens: &it.tokens,
                start: it.start,
                blocks: &it.blocks,
                window_blocks: &it.window_blocks,
                logits: kinds.len(),
                adapter: adapter.as_deref(),
            })
            .collect();
        // Grammar masks depend only on each sequence's own output so far: they are computed while the model runs
        // (on another thread of the pool), and a constrained request samples alike alone and in any batch.
        let constrained: Vec<SeqId> = plan
            .items
            .iter()
            .filter(|it| it.sample && self.seqs.get(&it.seq).is_some_and(forced))
            .map(|it| it.seq)
            .collect();
        let (model, backend, seqs) = (&self.model, &mut self.backend, &mut self.seqs);
        let (mut logits, masks) = if constrained.is_empty() {
            (backend.forward(model, &items), HashMap::new())
        } else {
            let vocab = model.llama.config().vocab;
            rayon::join(|| backend.forward(model, &items), || masks(seqs, &constrained, vocab))
        };
        self.prefill_tokens += plan.prefill_tokens as u64;
        let vocab = self.model.llama.config().vocab;
        // Every logits row with its item and what it is for. A token depends only on its own row, the sequence's
        // settings and its output position, so every row is sampled at once (on the pool for large batches),
        // drafts included: the token at offset j is the one plain decoding would pick at that position if the
        // drafts before it are accepted, and only then is it used.
        let rows: Vec<(&StepItem, RowKind)> =
            plan.items.iter().zip(&kinds).flat_map(|(it, k)| k.iter().map(move |&kind| (it, kind))).collect();
        // Log-probabilities come from the raw logits, before any mask: the normaliser of every row whose sequence
        // reports them, and the prompt rows' values whole.
        let seqs = &self.seqs;
        let measure = |(row, (item, kind)): (&[f32], &(&StepItem, RowKind))| {
            if *kind == RowKind::Unused {
                return None;
            }
            let wants = seqs.get(&item.seq)?.logprobs.as_ref()?;
            let norm = LogSoftmax::of(row);
            let prompt = match kind {
                RowKind::Prompt(pos) => wants.prompt.as_ref().map(|p| wants.of(row, &norm, p[*pos])),
                _ => None,
            };
            let top = matches!(kind, RowKind::Sample(_)).then(|| norm.top(row, wants.top));
            Some((norm, top, prompt))
        };
        let measured: Vec<_> = if rows.len() >= PARALLEL_ROWS {
            logits.par_chunks_exact(vocab).zip(&rows).map(measure).collect()
        } else {
            logits.chunks_exact(vocab).zip(&rows).map(measure).collect()
        };
        let penalized = plan.items.iter().any(|it| self.seqs.get(&it.seq).is_some_and(|st| st.penalized.is_some()));
        if !masks.is_empty() || penalized {
            let stop_ids = &self.model.tokenizer.stop_ids;
            for (row, (item, kind)) in logits.chunks_exact_mut(vocab).zip(&rows) {
                if !matches!(kind, RowKind::Sample(_)) {
                    continue;
                }
                if let Some(st) = self.seqs.get(&item.seq)
                    && let Some(p) = &st.penalized
                {
                    p.apply(row, st.sampling.temperature);
                }
                match masks.get(&item.seq) {
                    Some(Ok(mask)) => mask.apply(row),
                    // The grammar has no way on (it never should): the sequence ends here.
                    Some(Err(e)) => {
                        tracing::warn!(seq = item.seq, error = %e, "constrained decoding stopped");
                        only_stops(row, stop_ids);
                    }
                    None => {}
                }
            }
        }
        let pick = |((row, (item, kind)), measured): ((&[f32], &(&StepItem, RowKind)), &Option<_>)| {
            let RowKind::Sample(j) = kind else { return None };
            let st = seqs.get(&item.seq)?;
            let s = sample(row, &st.sampling, u64::from(st.generated) + *j as u64);
            // A masked row keeps the allowed tokens' logits: the sampled one's value is the raw one.
            let logprob = measured.as_ref().map(|(norm, top, _): &(LogSoftmax, Option<Vec<(u32, f32)>>, _)| Logprob {
                logprob: norm.at(row[s as usize]),
                top: top.clone().unwrap_or_default(),
            });
            Some((s, logprob))
        };
        let picks: Vec<_> = if rows.len() >= PARALLEL_ROWS {
            logits.par_chunks_exact(vocab).zip(&rows).zip(&measured).map(pick).collect()
        } else {
            logits.chunks_exact(vocab).zip(&rows).zip(&measured).map(pick).collect()
        };
        let mut events = std::mem::take(&mut self.pending);
        // The prompt rows' values, reported per item before its sampled tokens.
        let mut at = 0;
        for (item, kinds) in plan.items.iter().zip(&kinds) {
            let measured = &measured[at..at + kinds.len()];
            at += kinds.len();
            self.report_prompt(
                item.seq,
                kinds,
                measured.iter().map(|m| m.as_ref().and_then(|m| m.2.clone())),
                &mut events,
            );
        }
        let picks: Vec<Option<(u32, Option<Logprob>)>> = picks
            .into_iter()
            .zip(&rows)
            .filter(|(_, (_, kind))| matches!(kind, RowKind::Sample(_)))
            .map(|(p, _)| p)
            .collect();
        let mut sampled = HashMap::new();
        let mut finished = Vec::new();
        let mut at = 0;
        for item in plan.items.iter().filter(|it| it.sample) {
            let picked = &picks[at..at + 1 + item.drafts];
            at += 1 + item.drafts;
            if let Some(emitted) = self.accept(item, picked, &mut events) {
                sampled.insert(item.seq, emitted);
            } else if self.seqs.contains_key(&item.seq) {
                finished.push(item.seq);
            }
        }
        self.sched.complete(&plan, &sampled);
        if let Some(t) = &self.tiers {
            tiering::write_through(t, &self.backend, self.sched.pool_mut());
        }
        for seq in finished {
            self.cancel(seq);
        }
        events
    }

    /// Report an item's prompt rows (`kinds`, with each row's measured value) as one `Prompt` event, and move the
    /// sequence's next prompt position past them.
    fn report_prompt(
        &mut self,
        seq: SeqId,
        kinds: &[RowKind],
        values: impl Iterator<Item = Option<Logprob>>,
        events: &mut Vec<Event>,
    ) {
        let Some(wants) = self.seqs.get_mut(&seq).and_then(|s| s.logprobs.as_mut()) else { return };
        let Some(prompt) = wants.prompt.as_ref() else { return };
        let mut start = None;
        let (mut tokens, mut values_out) = (Vec::new(), Vec::new());
        for (kind, value) in kinds.iter().zip(values) {
            if let (RowKind::Prompt(pos), Some(value)) = (kind, value)
                && *pos == wants.next
            {
                start.get_or_insert(*pos as u32);
                tokens.push(prompt[*pos]);
                values_out.push(value);
                wants.next += 1;
            }
        }
        if wants.next >= prompt.len() {
            // Every position reported: the prompt is not kept.
            wants.prompt = None;
        }
        if let Some(start) = start {
            events.push(Event::Prompt { seq, start, tokens, logprobs: values_out });
        }
    }

    /// Take an item's sampled tokens in order, as plain decoding would have produced them one step at a time:
    /// each is output (detokenized, checked for stops); the next one is used only while the previous equals the
    /// draft fed after it. Returns the tokens the sequence continues with, or `None` when it finished (its
    /// `Finished` event pushed) or is gone.
    fn accept(
        &mut self,
        item: &StepItem,
        picked: &[Option<(u32, Option<Logprob>)>],
        events: &mut Vec<Event>,
    ) -> Option<Vec<u32>> {
        let st = self.seqs.get_mut(&item.seq)?;
        st.drafted += item.drafts as u32;
        // The drafts are the item's last tokens (a prefill chunk has none: its tokens are the prompt's).
        let drafts = &item.tokens[item.tokens.len() - item.drafts..];
        let mut emitted = Vec::new();
        for (j, picked) in picked.iter().enumerate() {
            let (s, logprob) = picked.clone()?;
            let step = advance(st, &self.model.tokenizer, s);
            if let Some(text) = step.emit {
                events.push(Event::Token { seq: item.seq, token: s, logprob, text });
            }
            if let Some((reason, stop_sequence)) = step.end {
                let cached = self.sched.cached_prompt_tokens(item.seq).min(st.prompt_len as usize) as u32;
                events.push(finished(item.seq, st, reason, stop_sequence, cached));
                return None;
            }
            emitted.push(s);
            // Draft j was fed after this position: the next row is valid only if it was this token.
            if drafts.get(j) != Some(&s) {
                break;
            }
            st.accepted += 1;
        }
        Some(emitted)
    }
}

/// A sequence's `Finished` event (its held-back text released unless a stop sequence ended it).
fn finished(seq: SeqId, st: &mut SeqState, reason: StopReason, stop_sequence: Option<String>, cached: u32) -> Event {
    let text = if stop_sequence.is_some() { String::new() } else { st.stop.flush() };
    Event::Finished {
        seq,
        reason,
        stop_sequence,
        text,
        input_tokens: st.prompt_len,
        output_tokens: st.generated,
        cached_input_tokens: cached,
        draft_tokens: st.drafted,
        accepted_draft_tokens: st.accepted,
    }
}
