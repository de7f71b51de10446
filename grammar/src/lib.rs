//! Grammar-constrained decoding. A request that must answer in a given shape (JSON matching a schema, a call of
//! one of the offered tools) carries a grammar in llguidance's Lark dialect, which may embed JSON Schemas
//! (`%json { ... }`). The frontend builds and checks it ([`spec`]); the worker compiles it against the model's
//! vocabulary and, at every step, masks the tokens the grammar does not allow before sampling ([`engine`]).
//!
//! Masks depend only on the tokens a sequence has produced, never on its batch, so a constrained request gives
//! the same tokens alone and in a batch, and seeded sampling stays reproducible.

pub mod engine;
pub mod spec;

pub use engine::{Constraint, Engine, Mask};
pub use spec::{ToolSpec, check, json_object, json_schema, tool_calls};

/// A grammar that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The grammar or a schema in it does not compile.
    #[error("{0}")]
    Compile(String),
    /// Decoding under the grammar failed (no token is allowed, or a token the mask allowed was refused).
    #[error("constrained decoding: {0}")]
    Step(String),
}

/// The first line of an llguidance error, without the parser state it may append or the grammar position it
/// starts with (`at 1(8): `: a place in the grammar the client never wrote).
fn first_line(e: &impl std::fmt::Display) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default().trim();
    let line = match line.strip_prefix("at ").and_then(|rest| rest.split_once("): ")) {
        Some((pos, rest)) if pos.chars().all(|c| c.is_ascii_digit() || c == '(') => rest,
        _ => line,
    };
    line.to_owned()
}
