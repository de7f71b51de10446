//! The worker's side: a model's vocabulary as llguidance sees it ([`Engine`], built once per model), one
//! sequence's grammar state ([`Constraint`]) and the token mask of one step ([`Mask`]).

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use zl_text::TextTokenizer;

use crate::{GrammarError, first_line};

/// The vocabulary with its trie, and the tokenizer for text a grammar forces.
struct Vocab {
    trie: TokTrie,
    tokenizer: TextTokenizer,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Grammars force only text (special tokens are never forced), which is valid UTF-8 at token boundaries;
        // anything else falls back to the trie's greedy split.
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text).unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Limits that keep one grammar from costing a worker more than a few milliseconds a step or a few megabytes.
fn limits() -> ParserLimits {
    ParserLimits { max_grammar_size: 200_000, max_lexer_states: 50_000, ..ParserLimits::default() }
}

/// What every sequence of one vocabulary shares.
struct Shared {
    stop_ids: Vec<u32>,
    /// The token of each single byte, where the vocabulary has one.
    byte_tokens: [Option<u32>; 256],
    /// For turning a closing text into few tokens.
    tokenizer: Option<TextTokenizer>,
}

/// Grammars compiled against one model's vocabulary.
#[derive(Clone)]
pub struct Engine {
    factory: Arc<ParserFactory>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("stop_ids", &self.shared.stop_ids).finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine for `tokenizer`'s vocabulary; its first stop token is the grammar's end of sequence (a finished
    /// grammar allows every stop token).
    pub fn new(tokenizer: &TextTokenizer) -> Result<Engine, GrammarError> {
        let words = tokenizer.token_bytes();
        let eos = tokenizer.stop_ids.first().copied().unwrap_or(0);
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let mut byte_tokens = [None; 256];
        for (id, w) in words.iter().enumerate() {
            if let [b] = w.as_slice() {
                byte_tokens[usize::from(*b)].get_or_insert(id as u32);
            }
        }
        let env: TokEnv = Arc::new(Vocab { trie, tokenizer: tokenizer.clone() });
        let shared = Shared { stop_ids: tokenizer.stop_ids.clone(), byte_tokens, tokenizer: Some(tokenizer.clone()) };
        Engine::from_env(env, shared)
    }

    /// An engine over single bytes: enough to tell whether a grammar compiles, with no model at hand.
    pub fn bytes_only() -> Result<Engine, GrammarError> {
        let shared = Shared { stop_ids: vec![], byte_tokens: std::array::from_fn(|b| Some(b as u32)), tokenizer: None };
        Engine::from_env(llguidance::toktrie::ApproximateTokEnv::single_byte_env(), shared)
    }

    fn from_env(env: TokEnv, shared: Shared) -> Result<Engine, GrammarError> {
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Compile(first_line(&e)))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Engine { factory: Arc::new(factory), shared: Arc::new(shared) })
    }

    /// Compile `grammar` (llguidance Lark, possibly embedding JSON Schemas) into a fresh sequence state.
    pub fn start(&self, grammar: &str) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(grammar.to_owned()))
            .map_err(|e| GrammarError::Compile(first_line(&e)))?;
        let matcher = Box::new(Matcher::new(Ok(parser)));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(first_line(&e)));
        }
        Ok(Constraint { matcher, shared: self.shared.clone() })
    }
}

/// One sequence's position in its grammar.
#[derive(Clone)]
pub struct Constraint {
    /// Boxed: a matcher is over a kilobyte, and requests move through channels.
    matcher: Box<Matcher>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish_non_exhaustive()
    }
}

impl Constraint {
    /// The tokens allowed next. When the grammar is complete only the stop tokens are.
    pub fn mask(&mut self) -> Result<Mask, GrammarError> {
        let mut allowed = self.matcher.compute_mask_or_eos().map_err(|e| GrammarError::Step(first_line(&e)))?;
        let stop_ids = &self.shared.stop_ids;
        let eos = stop_ids.first().is_some_and(|&id| (id as usize) < allowed.len() && allowed.is_allowed(id));
        if eos {
            for &id in stop_ids {
                if (id as usize) < allowed.len() {
                    allowed.allow_token(id);
                }
            }
        }
        if allowed.num_set() == 0 {
            return Err(GrammarError::Step("the grammar allows no token here".into()));
        }
        Ok(Mask { allowed })
    }

    /// Record the token sampled under the last mask. A stop token ends the sequence and needs no record.
    pub fn advance(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.shared.stop_ids.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| GrammarError::Step(first_line(&e)))
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }

    /// A short way to finish: tokens that take the output from here to a complete sentence of the grammar (at
    /// most `limit` bytes of text), or `None` when none is found. What a sequence about to run out of tokens is
    /// made to write, so that constrained output is complete (a string cut short, an array ended) rather than
    /// cut off. Found greedily, byte by byte, preferring what closes (quotes, brackets, separators) over what
    /// opens, then turned into few tokens where the tokenizer's split is accepted too.
    pub fn closing(&self, limit: usize) -> Option<Vec<u32>> {
        let bytes = self.closing_bytes(limit)?;
        let by_byte = || bytes.iter().map(|&b| self.shared.byte_tokens[usize::from(b)]).collect::<Option<Vec<u32>>>();
        let Some(tokenizer) = &self.shared.tokenizer else { return by_byte() };
        let Ok(text) = std::str::from_utf8(&bytes) else { return by_byte() };
        let tokens = tokenizer.encode(text).ok()?;
        let mut check = self.matcher.clone();
        if !tokens.is_empty() && check.consume_tokens(&tokens).is_ok() && check.is_accepting().unwrap_or(false) {
            return Some(tokens);
        }
        by_byte()
    }

    fn closing_bytes(&self, limit: usize) -> Option<Vec<u8>> {
        const PREFERRED: &[u8] = b"\"}],01abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ23456789 :-.[{";
        let mut m = self.matcher.clone();
        let mut out = Vec::new();
        while out.len() < limit {
            if m.is_accepting().ok()? {
                return Some(out);
            }
            // A stretch the grammar forces (a required key and its colon) is allowed only as its canonical
            // tokens: its bytes are taken as they are.
            let forced = m.compute_ff_bytes();
            if !forced.is_empty() {
                for b in forced {
                    m.consume_token(self.shared.byte_tokens[usize::from(b)]?).ok()?;
                    out.push(b);
                }
                continue;
            }
            let mask = m.compute_mask().ok()?;
            let allowed = |b: u8| {
                self.shared.byte_tokens[usize::from(b)].filter(|&t| (t as usize) < mask.len() && mask.is_allowed(t))
            };
            let (b, token) = PREFERRED.iter().copied().chain(0..=255).find_map(|b| allowed(b).map(|t| (b, t)))?;
            m.consume_token(token).ok()?;
            out.push(b);
        }
        None
    }
}

/// The tokens one step may sample.
#[derive(Clone, Debug)]
pub struct Mask {
    allowed: SimpleVob,
}

impl Mask {
    /// Set every disallowed token's logit to minus infinity (ids past the vocabulary included).
    pub fn apply(&self, logits: &mut [f32]) {
        let known = self.allowed.len().min(logits.len());
        self.allowed.iter_unset_entries(|id| {
            if id < known {
                logits[id] = f32::NEG_INFINITY;
            }
        });
        for logit in &mut logits[known..] {
            *logit = f32::NEG_INFINITY;
        }
    }

    /// A mask that allows `token` alone, of a vocabulary of `vocab` tokens.
    pub fn only(token: u32, vocab: usize) -> Mask {
        let mut allowed = SimpleVob::alloc(vocab.max(token as usize + 1));
        allowed.allow_token(token);
        Mask { allowed }
    }

    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.allowed.len() && self.allowed.is_allowed(token)
    }

    /// How many tokens are allowed.
    pub fn allowed(&self) -> usize {
        self.allowed.num_set()
    }
}
