//! The worker binary's offline commands, beside `serve` (in `main.rs`): each measures the engine in this process,
//! with no cluster around it.

pub(crate) mod bench;
pub(crate) mod eval;
