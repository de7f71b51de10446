//! The paged KV cache: block accounting (`pool`), the sliding-window layers' own pool (`window`) and how keys and
//! values are stored (`dtype`), kept apart from the tensors that hold them.

pub mod dtype;
pub mod pool;
pub mod window;
