//! Measuring a model path's quality: [`perplexity`] over a text, and [`answers`], greedy answers to a fixed set
//! of short factual questions compared between two paths (the native kernels and the float reference), and the
//! [`reference`] engine's figures on the same file (llama.cpp: its perplexity, and its saved logits' KL divergence
//! from ours, [`logits_file`]).

pub mod answers;
pub mod logits_file;
pub mod perplexity;
pub mod reference;

pub use perplexity::{Perplexity, perplexity};
