//! The paged KV cache: block accounting (`pool`), and the sliding-window layers' own pool (`window`), kept apart
//! from the tensors that hold keys and values.

pub mod pool;
pub mod window;
