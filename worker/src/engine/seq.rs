//! One sequence's decoding state (`SeqState`) and what each output token does to it: the sampler's step, the grammar
//! (dormant while a thinking section is open) and the closing it may have to write, the thinking budget, the
//! detokenizer and the stop matcher. The same for a token sampled here and for one replayed after a migration.

use std::collections::HashMap;

use zl_text::{Detokenizer, TextTokenizer};
use zl_wire::message::StopReason;

use crate::engine::logprobs::LogprobWants;
use crate::model::lora::LoraAdapter;
use crate::sampling::Sampling;
use crate::scheduler::SeqId;
use crate::stop::StopMatcher;

/// What one output token did to its sequence.
pub(super) struct Advance {
    /// The text it releases (`None`: it was a stop token, which is not output).
    pub(super) emit: Option<String>,
    /// Why the sequence ends with it, and the stop sequence it matched.
    pub(super) end: Option<(StopReason, Option<String>)>,
}

pub(super) struct SeqState {
    pub(super) sampling: Sampling,
    /// What it reports of its logits (`None`: nothing).
    pub(super) logprobs: Option<LogprobWants>,
    pub(super) max_tokens: u32,
    pub(super) generated: u32,
    pub(super) prompt_len: u32,
    pub(super) detok: Detokenizer,
    pub(super) stop: StopMatcher,
    pub(super) drafted: u32,
    pub(super) accepted: u32,
    pub(super) constraint: Option<zl_grammar::Constraint>,
    /// Tokens a constrained sequence about to run out must write to end complete.
    pub(super) closing: std::collections::VecDeque<u32>,
    /// The LoRA adapter its rows add.
    pub(super) adapter: Option<std::sync::Arc<LoraAdapter>>,
    /// Its thinking budget, while the section is open.
    pub(super) think: Option<crate::engine::think::Think>,
    /// Its logit adjustments and output counts.
    pub(super) penalized: Option<crate::engine::penalize::Penalized>,
}

/// One output token through its sequence's state: the step count, the grammar (and the closing being written),
/// the detokenizer and the stop matcher; what it releases and whether it ends the sequence. The same for a token
/// sampled here and for one another worker produced (a migration's replay), so both leave the same state.
pub(super) fn advance(st: &mut SeqState, tokenizer: &TextTokenizer, s: u32) -> Advance {
    st.generated += 1;
    let off_grammar = match dormant(st) {
        true => None,
        false => st.constraint.as_mut().map(|c| c.advance(s)).and_then(Result::err),
    };
    if st.closing.front() == Some(&s) {
        st.closing.pop_front();
    }
    if let Some(e) = &off_grammar {
        tracing::warn!(error = %e, "constrained decoding stopped");
    }
    if tokenizer.stop_ids.contains(&s) {
        return Advance { emit: None, end: Some((StopReason::EndTurn, None)) };
    }
    let delta = st.detok.push(tokenizer, s).unwrap_or_default();
    if let Some(t) = st.think.as_mut() {
        t.read(&delta);
        t.wrote();
    }
    if let Some(p) = st.penalized.as_mut() {
        p.saw(s);
    }
    let stop = st.stop.push(&delta);
    let end = if let Some(matched) = stop.stopped {
        Some((StopReason::StopSequence, Some(matched)))
    } else if st.generated >= st.max_tokens {
        Some((StopReason::MaxTokens, None))
    } else if off_grammar.is_some() {
        Some((StopReason::EndTurn, None))
    } else {
        None
    };
    Advance { emit: Some(stop.emit), end }
}

/// Whether a sequence's grammar waits for its thinking section to end: a grammar constrains the answer, which
/// begins after the section (and after all of a forced closing).
fn dormant(st: &SeqState) -> bool {
    st.think.as_ref().is_some_and(|t| !t.answering())
}

/// How close to its token limit a constrained sequence starts checking how it would end.
const CLOSING_WINDOW: u32 = 64;
/// The most bytes of closing text looked for.
const CLOSING_BYTES: usize = 512;

/// Before a constrained sequence's sampling step: near its token limit, the closing it must write from now on,
/// if it has none yet (the shortest found, when it and a stop token just fit what is left, one step to spare).
fn closing_for(st: &mut SeqState) {
    let left = st.max_tokens.saturating_sub(st.generated);
    let Some(c) = st.constraint.as_mut() else { return };
    if st.closing.is_empty()
        && left <= CLOSING_WINDOW
        && !c.is_complete()
        && let Some(tokens) = c.closing(CLOSING_BYTES)
        && tokens.len() as u32 + 2 >= left
    {
        metrics::counter!("zl_worker_grammar_closings_total").increment(1);
        st.closing = tokens.into();
    }
}

/// What a constrained or budgeted sequence does before each sampling step, and a migration's replay before each
/// token it replays: near its limit, the grammar's closing (once the grammar is awake); once its thinking budget
/// is spent, the section's closing (`count`ed in the metrics where it is written, not where it is replayed).
/// Whether the grammar still waits for the section to end.
pub(super) fn before_step(st: &mut SeqState, count: bool) -> bool {
    let dormant = dormant(st);
    if !dormant {
        closing_for(st);
    }
    if let Some(close) = st.think.as_mut().and_then(|t| t.due(st.generated)) {
        if count {
            metrics::counter!("zl_worker_thinking_closed_total").increment(1);
        }
        st.closing = close.into();
    }
    dormant
}

/// Each constrained sequence's mask for this step. A sequence that would otherwise run out of tokens inside its
/// grammar (a string, an object with fields still required) is given the shortest closing found while it still
/// has the tokens for it, and writes it; its answer is then complete and valid, if cut short.
pub(super) fn masks(
    seqs: &mut HashMap<SeqId, SeqState>,
    constrained: &[SeqId],
    vocab: usize,
) -> HashMap<SeqId, Result<zl_grammar::Mask, zl_grammar::GrammarError>> {
    let mut out = HashMap::with_capacity(constrained.len());
    for &seq in constrained {
        let Some(st) = seqs.get_mut(&seq) else { continue };
        let started = std::time::Instant::now();
        let dormant = before_step(st, true);
        let mask = match (st.closing.front(), st.constraint.as_mut()) {
            (Some(&token), _) => Ok(zl_grammar::Mask::only(token, vocab)),
            (None, Some(c)) if !dormant => c.mask(),
            _ => continue,
        };
        out.insert(seq, mask);
        metrics::histogram!("zl_worker_grammar_mask_seconds").record(started.elapsed().as_secs_f64());
    }
    out
}

/// Whether a sequence's next token may be forced or masked: it has a grammar, a closing to write, or a thinking
/// budget that is spent.
pub(super) fn forced(st: &SeqState) -> bool {
    st.constraint.is_some() || !st.closing.is_empty() || st.think.as_ref().is_some_and(|t| t.spent(st.generated))
}

/// Leave only the stop tokens possible.
pub(super) fn only_stops(row: &mut [f32], stop_ids: &[u32]) {
    for (id, logit) in row.iter_mut().enumerate() {
        if !stop_ids.contains(&(id as u32)) {
            *logit = f32::NEG_INFINITY;
        }
    }
}
