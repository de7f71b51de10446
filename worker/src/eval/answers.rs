//! Greedy answers to a fixed set of short factual questions under several plain system prompts: the test that a
//! model path answers as the float reference path does on the same weights. Perplexity averages over a text; this
//! looks at what users see, where one swapped leading token ("La" for "The") turns an answer into another one.

use zl_text::{ChatMessage, TextTokenizer};

use crate::kv::pool::BlockId;
use crate::model::llama::{BatchItem, KvStore, Tuned};

/// The questions: short, factual, each with one plain answer.
pub const QUESTIONS: [&str; 20] = [
    "What is the capital of France?",
    "What is the capital of Japan?",
    "What is the capital of Italy?",
    "What is the largest planet in the solar system?",
    "How many days are there in a week?",
    "What color is the sky on a clear day?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water in degrees Celsius?",
    "What is the chemical symbol for gold?",
    "How many legs does a spider have?",
    "What is the largest ocean on Earth?",
    "What gas do plants absorb from the air?",
    "What is the freezing point of water in degrees Celsius?",
    "Which planet is known as the Red Planet?",
    "What is the tallest mountain in the world?",
    "What language is spoken in Brazil?",
    "How many continents are there?",
    "What is the square root of 81?",
    "Who painted the Mona Lisa?",
    "What is the main ingredient of guacamole?",
];

/// The system prompts the questions are asked under: the usual one, none (the model's template may add its own)
/// and a one-line instruction.
pub const SYSTEM_PROMPTS: [Option<&str>; 3] =
    [Some("You are a helpful assistant."), None, Some("Answer the question in one English sentence.")];

/// Tokens per KV block of the scratch cache.
const BLOCK: usize = 16;

/// The prompt tokens of `question` asked under `system`, rendered with the model's chat template.
pub fn prompt(tokenizer: &TextTokenizer, system: Option<&str>, question: &str) -> Result<Vec<u32>, String> {
    let mut messages = Vec::new();
    if let Some(s) = system {
        messages.push(ChatMessage { role: "system".into(), content: s.into() });
    }
    messages.push(ChatMessage { role: "user".into(), content: question.into() });
    let text = tokenizer.render_chat(&messages).map_err(|e| e.to_string())?;
    tokenizer.encode(&text).map_err(|e| e.to_string())
}

/// The index of the largest logit (the lowest index among ties), as greedy sampling picks it.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Greedy continuations of `prompts`, decoded together as one batch (every row is computed as it would be alone:
/// the kernels are batch-invariant): at most `max_tokens` tokens each, a sequence ending early at one of `stop`
/// (not included).
pub fn greedy<'a>(model: impl Into<Tuned<'a>>, prompts: &[Vec<u32>], max_tokens: usize, stop: &[u32]) -> Vec<Vec<u32>> {
    let Tuned { llama: model, adapter } = model.into();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let per = (longest + max_tokens).div_ceil(BLOCK);
    let mut kv = KvStore::new(model.config(), per * prompts.len(), BLOCK);
    let blocks: Vec<Vec<BlockId>> =
        (0..prompts.len()).map(|i| (i * per..(i + 1) * per).map(|b| b as BlockId).collect()).collect();
    let vocab = model.config().vocab;
    let items: Vec<BatchItem<'_>> = prompts
        .iter()
        .zip(&blocks)
        .map(|(p, blocks)| BatchItem { tokens: p, start: 0, blocks, window_blocks: &[], logits: 1, adapter })
        .collect();
    let mut logits = model.forward(&items, &mut kv);
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); prompts.len()];
    let mut live: Vec<usize> = (0..prompts.len()).filter(|&i| !prompts[i].is_empty()).collect();
    while !live.is_empty() {
        // Each live sequence's next token from its row of the last step's logits.
        live.retain(|&i| out[i].len() < max_tokens);
        let mut next = Vec::new();
        for (row, &i) in live.iter().enumerate() {
            let token = argmax(&logits[row * vocab..(row + 1) * vocab]);
            if !stop.contains(&token) {
                out[i].push(token);
                next.push(i);
            }
        }
        live = next.into_iter().filter(|&i| out[i].len() < max_tokens).collect();
        let items: Vec<BatchItem<'_>> = live
            .iter()
            .map(|&i| BatchItem {
                tokens: &out[i][out[i].len() - 1..],
                start: prompts[i].len() + out[i].len() - 1,
                blocks: &blocks[i],
                window_blocks: &[],
                logits: 1,
                adapter,
            })
            .collect();
        if items.is_empty() {
            break;
        }
        logits = model.forward(&items, &mut kv);
    }
    out
}

/// The answer as it is compared: the text up to the end of its first sentence (or line), trimmed. Two paths
/// agree on a question when these are equal.
pub fn first_sentence(text: &str) -> &str {
    let text = text.trim_start();
    let end = text
        .char_indices()
        .find(|&(i, c)| c == '\n' || (matches!(c, '.' | '!' | '?') && text[i + 1..].starts_with(char::is_whitespace)))
        .map_or(text.len(), |(i, c)| if c == '\n' { i } else { i + 1 });
    text[..end].trim_end()
}

/// One question's answers on the two paths.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// The system prompt (none: the template's own default, if it has one).
    pub system: Option<&'static str>,
    /// The question.
    pub question: &'static str,
    /// The answer of the path under test.
    pub answer: String,
    /// The answer of the reference path.
    pub reference: String,
}

impl Comparison {
    /// Whether the first sentences agree.
    pub fn agrees(&self) -> bool {
        first_sentence(&self.answer) == first_sentence(&self.reference)
    }
}

/// Ask every question under every system prompt on `model` and on `reference` (greedy, `max_tokens` each).
pub fn compare<'a>(
    model: (impl Into<Tuned<'a>>, &TextTokenizer),
    reference: impl Into<Tuned<'a>>,
    max_tokens: usize,
) -> Result<Vec<Comparison>, String> {
    let (llama, tokenizer) = model;
    let mut asked = Vec::new();
    let mut prompts = Vec::new();
    for system in SYSTEM_PROMPTS {
        for question in QUESTIONS {
            asked.push((system, question));
            prompts.push(prompt(tokenizer, system, question)?);
        }
    }
    let text = |ids: &Vec<u32>| tokenizer.decode(ids).map_err(|e| e.to_string());
    let answers = greedy(llama, &prompts, max_tokens, &tokenizer.stop_ids);
    let references = greedy(reference, &prompts, max_tokens, &tokenizer.stop_ids);
    asked
        .into_iter()
        .zip(answers.iter().zip(&references))
        .map(|((system, question), (a, r))| Ok(Comparison { system, question, answer: text(a)?, reference: text(r)? }))
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_sentence_ends_at_a_full_stop_or_a_line() {
        assert_eq!(first_sentence(" The capital is Paris. It is big."), "The capital is Paris.");
        assert_eq!(first_sentence("Paris\nmore"), "Paris");
        assert_eq!(first_sentence("3.14 is pi"), "3.14 is pi");
        assert_eq!(first_sentence("Why? Because."), "Why?");
    }

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }
}
