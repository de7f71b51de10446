//! The paged KV cache: block accounting (`pool`), the sliding-window layers' own pool (`window`), how keys and
//! values are stored (`dtype`), kept apart from the tensors that hold them, and the lower tiers evicted blocks go
//! down to (`tier`: host memory and disk).

pub mod dtype;
pub mod pool;
pub mod tier;
pub mod window;
