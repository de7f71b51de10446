//! Measuring a model path's quality: [`perplexity`] over a text, and [`answers`], greedy answers to a fixed set
//! of short factual questions compared between two paths (the native kernels and the float reference).

pub mod answers;
pub mod perplexity;
pub mod reference;

pub use perplexity::{Perplexity, perplexity};
