//! Tokenizers and chat templates live in the `zl-text` crate, shared with the frontend.

pub use zl_text::*;
