//! The paged KV cache: block accounting (`pool`), kept apart from the tensors that hold keys and values.

pub mod pool;
