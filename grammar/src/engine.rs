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

/// Grammars compiled against one model's vocabulary.
#[derive(Clone)]
pub struct Engine {
    factory: Arc<ParserFactory>,
    stop_ids: Arc<[u32]>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("stop_ids", &self.stop_ids).finish_non_exhaustive()
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
        let env: TokEnv = Arc::new(Vocab { trie, tokenizer: tokenizer.clone() });
        Engine::from_env(env, tokenizer.stop_ids.clone())
    }

    /// An engine over single bytes: enough to tell whether a grammar compiles, with no model at hand.
    pub fn bytes_only() -> Result<Engine, GrammarError> {
        Engine::from_env(llguidance::toktrie::ApproximateTokEnv::single_byte_env(), vec![])
    }

    fn from_env(env: TokEnv, stop_ids: Vec<u32>) -> Result<Engine, GrammarError> {
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Compile(first_line(&e)))?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Engine { factory: Arc::new(factory), stop_ids: stop_ids.into() })
    }

    /// Compile `grammar` (llguidance Lark, possibly embedding JSON Schemas) into a fresh sequence state.
    pub fn start(&self, grammar: &str) -> Result<Constraint, GrammarError> {
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_lark(grammar.to_owned()))
            .map_err(|e| GrammarError::Compile(first_line(&e)))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(first_line(&e)));
        }
        Ok(Constraint { matcher, stop_ids: self.stop_ids.clone() })
    }
}

/// One sequence's position in its grammar.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    stop_ids: Arc<[u32]>,
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
        let eos = self.stop_ids.first().is_some_and(|&id| (id as usize) < allowed.len() && allowed.is_allowed(id));
        if eos {
            for &id in self.stop_ids.iter() {
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
        if self.stop_ids.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| GrammarError::Step(first_line(&e)))
    }

    /// Whether the text so far is a complete sentence of the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
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

    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.allowed.len() && self.allowed.is_allowed(token)
    }

    /// How many tokens are allowed.
    pub fn allowed(&self) -> usize {
        self.allowed.num_set()
    }
}
