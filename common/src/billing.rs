//! The semantic billing unit: what a request is worth, next to how many tokens it used.
//!
//! ```text
//! billing_unit = max(w_in  * input_semantic_weight,
//!                    w_out * output_action_score,
//!                    w_ctx * context_retention_ratio)        default weights 0.3 / 0.5 / 0.2
//! ```
//!
//! Each signal is in [0, 1] and is a pure function of text: the orchestrator predicts the unit from the prompt
//! before a request runs, and the frontend computes the final figure from the prompt and the answer with this same
//! code. The methods (see `docs/routing.md` for worked examples):
//!
//! - **input_semantic_weight** (information density of the prompt) = `diversity * volume`. `diversity` is the
//!   moving-average type-token ratio of the prompt's words over windows of 32 words (1 when no word repeats inside
//!   a window); `volume` = `ln(1 + distinct words) / ln(1 + 256)`, capped at 1, so a one-word prompt is light and a
//!   long, varied one is heavy.
//! - **output_action_score** (structured or actionable output) = the strongest structure found, times the
//!   repetition guard: a JSON document or tool call 1.0; a Markdown table 0.8; a fenced code block 0.7; a list of
//!   at least two steps 0.5, or 0.6 when at least half of them start with an imperative verb; plain prose 0.1.
//! - **context_retention_ratio** (how much of the prompt the answer builds on, without parroting it) = the harmonic
//!   mean of *retention* (share of the prompt's distinct word bigrams found in the answer) and *novelty* (share of
//!   the answer's distinct word bigrams not in the prompt). Copying the prompt back has novelty 0, an unrelated
//!   answer has retention 0: both score 0. Times the repetition guard.
//!
//! Guard against gaming: the input's diversity, and for the output signals the **repetition guard**
//! `min(1, 2 * distinct word bigrams / word bigrams)`, multiply every signal that rewards length or structure, so
//! repeating a word, a line, a list item or the whole prompt drives it towards 0. Words are maximal runs of alphanumeric characters,
//! lowercased (Unicode-aware); no randomness, clocks or locale are involved.

use std::collections::HashSet;

/// Weights of the three signals.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BillingWeights {
    /// Weight of the input's semantic weight.
    pub input: f32,
    /// Weight of the output's action score.
    pub output: f32,
    /// Weight of the context retention ratio.
    pub context: f32,
}

impl Default for BillingWeights {
    fn default() -> Self {
        BillingWeights { input: 0.3, output: 0.5, context: 0.2 }
    }
}

impl BillingWeights {
    /// Whether every weight is finite and in [0, 1].
    pub fn is_valid(&self) -> bool {
        [self.input, self.output, self.context].iter().all(|w| w.is_finite() && (0.0..=1.0).contains(w))
    }
}

/// The three signals, each in [0, 1].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signals {
    /// Information density of the input.
    pub input_semantic_weight: f32,
    /// Structure and actionability of the output.
    pub output_action_score: f32,
    /// Grounded novelty of the output relative to the input.
    pub context_retention_ratio: f32,
}

impl Signals {
    /// All three signals of a finished request.
    pub fn measure(input: &str, output: &str) -> Signals {
        Signals {
            input_semantic_weight: input_semantic_weight(input),
            output_action_score: output_action_score(output),
            context_retention_ratio: context_retention_ratio(input, output),
        }
    }
}

/// Priors for the signals that are unknown before a request runs (the output's), used for the predicted unit.
pub const PREDICTED_OUTPUT_ACTION_SCORE: f32 = 0.2;
/// See [`PREDICTED_OUTPUT_ACTION_SCORE`].
pub const PREDICTED_CONTEXT_RETENTION_RATIO: f32 = 0.2;

/// The billing unit, in [0, 1].
pub fn billing_unit(weights: &BillingWeights, s: &Signals) -> f32 {
    let unit = (weights.input * s.input_semantic_weight)
        .max(weights.output * s.output_action_score)
        .max(weights.context * s.context_retention_ratio);
    if unit.is_nan() { 0.0 } else { unit.clamp(0.0, 1.0) }
}

/// The unit predicted before a request runs, from the input's signal and the documented priors for the others.
pub fn predicted_billing_unit(weights: &BillingWeights, input_semantic_weight: f32) -> f32 {
    billing_unit(
        weights,
        &Signals {
            input_semantic_weight,
            output_action_score: PREDICTED_OUTPUT_ACTION_SCORE,
            context_retention_ratio: PREDICTED_CONTEXT_RETENTION_RATIO,
        },
    )
}

/// Lowercased words: maximal runs of alphanumeric characters.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_lowercase).collect()
}

const WINDOW: usize = 32;

/// Moving-average type-token ratio over windows of [`WINDOW`] words (plain TTR for shorter texts); 0 for no words.
fn diversity(words: &[String]) -> f32 {
    if words.is_empty() {
        return 0.0;
    }
    if words.len() <= WINDOW {
        let distinct: HashSet<&str> = words.iter().map(String::as_str).collect();
        return distinct.len() as f32 / words.len() as f32;
    }
    let windows = words.len() - WINDOW + 1;
    let mut total = 0f64;
    for w in words.windows(WINDOW) {
        let distinct: HashSet<&str> = w.iter().map(String::as_str).collect();
        total += distinct.len() as f64 / WINDOW as f64;
    }
    (total / windows as f64) as f32
}

/// Information density of a prompt, in [0, 1].
pub fn input_semantic_weight(text: &str) -> f32 {
    let w = words(text);
    let distinct = w.iter().collect::<HashSet<_>>().len();
    let volume = ((1.0 + distinct as f32).ln() / 257f32.ln()).min(1.0);
    diversity(&w) * volume
}

const IMPERATIVES: &[&str] = &[
    "add",
    "call",
    "check",
    "click",
    "configure",
    "copy",
    "create",
    "delete",
    "deploy",
    "disable",
    "download",
    "edit",
    "enable",
    "ensure",
    "go",
    "install",
    "open",
    "press",
    "remove",
    "replace",
    "restart",
    "run",
    "save",
    "select",
    "send",
    "set",
    "start",
    "stop",
    "type",
    "update",
    "use",
    "verify",
    "write",
];

/// A list item's text after its marker (`- `, `* `, `+ `, `1. `, `1) `), if the line is one.
fn list_item(line: &str) -> Option<&str> {
    let t = line.trim_start();
    for marker in ["- ", "* ", "+ "] {
        if let Some(rest) = t.strip_prefix(marker) {
            return Some(rest);
        }
    }
    let digits = t.len() - t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if digits > 0 && digits <= 3 {
        let rest = &t[digits..];
        if let Some(rest) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            return Some(rest);
        }
    }
    None
}

fn is_json_document(text: &str) -> bool {
    let t = text.trim();
    let t = t.strip_prefix("```json").and_then(|r| r.strip_suffix("```")).map_or(t, str::trim);
    (t.starts_with('{') || t.starts_with('[')) && serde_json::from_str::<serde_json::Value>(t).is_ok()
}

/// Strength of the strongest structure in an answer, before the diversity guard.
fn structure(text: &str) -> f32 {
    if text.trim().is_empty() {
        return 0.0;
    }
    // A tool call as models write it (`<tool_call>{...}</tool_call>`, the frontend's tool format) or as the API
    // returns it (a `tool_use` block).
    let tool_call = text.contains("<tool_call>") && text.contains("</tool_call>");
    if is_json_document(text) || tool_call || text.contains("\"tool_use\"") {
        return 1.0;
    }
    let lines: Vec<&str> = text.lines().collect();
    let table_rows = lines.iter().filter(|l| l.trim().starts_with('|') && l.trim().ends_with('|')).count();
    if table_rows >= 2 {
        return 0.8;
    }
    if lines.iter().filter(|l| l.trim_start().starts_with("```")).count() >= 2 {
        return 0.7;
    }
    let items: Vec<&str> = lines.iter().filter_map(|l| list_item(l)).collect();
    if items.len() >= 2 {
        let imperative =
            items.iter().filter(|item| words(item).first().is_some_and(|w| IMPERATIVES.contains(&w.as_str()))).count();
        return if imperative * 2 >= items.len() { 0.6 } else { 0.5 };
    }
    0.1
}

/// Structure and actionability of an answer, in [0, 1].
pub fn output_action_score(text: &str) -> f32 {
    structure(text) * repetition_guard(&words(text))
}

/// `min(1, 2 * distinct word bigrams / word bigrams)`: 1 for text that rarely repeats itself, towards 0 for text
/// that repeats a word, a line or a paragraph (1 for texts under two words).
fn repetition_guard(words: &[String]) -> f32 {
    if words.len() < 2 {
        return 1.0;
    }
    (2.0 * bigrams(words).len() as f32 / (words.len() - 1) as f32).min(1.0)
}

fn bigrams(words: &[String]) -> HashSet<(&str, &str)> {
    words.windows(2).map(|w| (w[0].as_str(), w[1].as_str())).collect()
}

/// Grounded novelty of an answer relative to its prompt, in [0, 1].
pub fn context_retention_ratio(input: &str, output: &str) -> f32 {
    let (wi, wo) = (words(input), words(output));
    let (bi, bo) = (bigrams(&wi), bigrams(&wo));
    if bi.is_empty() || bo.is_empty() {
        return 0.0;
    }
    let shared = bi.intersection(&bo).count() as f32;
    let retention = shared / bi.len() as f32;
    let novelty = 1.0 - shared / bo.len() as f32;
    if retention + novelty == 0.0 {
        return 0.0;
    }
    2.0 * retention * novelty / (retention + novelty) * repetition_guard(&wo)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROSE: &str = "Kubernetes schedules pods onto nodes according to resource requests, affinity rules and \
        taints; the scheduler scores feasible nodes and binds the pod to the best one.";

    #[test]
    fn input_semantic_weight_golden_table() {
        let long_varied: String = (0..300).map(|i| format!("w{i} ")).collect();
        // Golden values: a change here changes what customers are billed.
        let table: &[(&str, &str, f32)] = &[
            ("empty", "", 0.0),
            ("one word", "hi", 0.124_912),
            ("prose", PROSE, 0.449_915),
            ("repetition", &"spam ".repeat(500), 0.003_904),
            ("long and varied", &long_varied, 1.0),
        ];
        for (name, text, want) in table {
            let v = input_semantic_weight(text);
            assert!((v - want).abs() < 1e-5, "{name}: {v}, want {want}");
        }
    }

    #[test]
    fn output_action_score_golden_table() {
        let table: &[(&str, &str, f32)] = &[
            ("empty", "", 0.0),
            ("prose", PROSE, 0.1),
            ("json", r#"{"city": "Paris", "country": "France", "population": 2102650}"#, 1.0),
            ("fenced json", "```json\n{\"ok\": true, \"items\": [1, 2, 3]}\n```", 1.0),
            ("tool call", r#"[{"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}}]"#, 1.0),
            (
                "generated tool call",
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                1.0,
            ),
            ("table", "| name | size |\n|---|---|\n| alpha | 3 |\n| beta | 4 |", 0.8),
            ("code", "Here is the fix:\n```rust\nfn main() { println!(\"hi\"); }\n```", 0.7),
            ("steps", "1. Install the chart.\n2. Set the values file.\n3. Run helm upgrade.", 0.6),
            ("list", "- apples are red\n- bananas are yellow\n- grapes vary", 0.5),
        ];
        for (name, text, want) in table {
            let v = output_action_score(text);
            assert!((v - want).abs() < 1e-6, "{name}: {v}, want {want}");
        }
    }

    #[test]
    fn repeated_structure_does_not_score() {
        let spam = "1. run\n".repeat(200);
        assert!(output_action_score(&spam) < 0.05, "{}", output_action_score(&spam));
        let json_spam = format!("[{}1]", "1, ".repeat(2000));
        assert!(output_action_score(&json_spam) < 0.1);
    }

    #[test]
    fn context_retention_rewards_grounded_novelty_not_copying() {
        let copy = context_retention_ratio(PROSE, PROSE);
        assert_eq!(copy, 0.0, "copying the input back must not score");
        let unrelated = context_retention_ratio(PROSE, "The recipe needs flour, eggs and a hot oven.");
        assert_eq!(unrelated, 0.0);
        let summary = context_retention_ratio(
            PROSE,
            "In short, the scheduler scores feasible nodes and binds the pod, honouring resource requests.",
        );
        assert!((summary - 0.331_797).abs() < 1e-5, "{summary}");
        let parrot = context_retention_ratio(PROSE, &PROSE.repeat(5));
        assert!(parrot < 0.05, "{parrot}");
    }

    #[test]
    fn billing_unit_is_the_weighted_max_and_bounded() {
        let w = BillingWeights::default();
        let s = Signals { input_semantic_weight: 1.0, output_action_score: 0.5, context_retention_ratio: 1.0 };
        assert!((billing_unit(&w, &s) - 0.3).abs() < 1e-6);
        let s = Signals { input_semantic_weight: 0.2, output_action_score: 1.0, context_retention_ratio: 0.1 };
        assert!((billing_unit(&w, &s) - 0.5).abs() < 1e-6);
        let nan = Signals { input_semantic_weight: f32::NAN, ..Signals::default() };
        assert_eq!(billing_unit(&w, &nan), 0.0);
        let heavy = BillingWeights { input: 1.0, output: 1.0, context: 1.0 };
        assert!(billing_unit(&heavy, &Signals { input_semantic_weight: 3.0, ..Signals::default() }) <= 1.0);
        assert!((predicted_billing_unit(&w, 0.0) - 0.1).abs() < 1e-6);
        assert!(!BillingWeights { input: -0.1, ..w }.is_valid());
        let end_to_end = Signals::measure(PROSE, r#"{"pods": 3, "node": "n1"}"#);
        assert!((billing_unit(&w, &end_to_end) - 0.5).abs() < 1e-6);
    }
}
