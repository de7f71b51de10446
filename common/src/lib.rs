//! Pure functions that more than one tier must compute identically: the worker when it caches
//! KV blocks, the frontend when it hashes a prompt for routing, the orchestrator when it scores prefix overlap;
//! and the poison-tolerant lock helpers every crate shares ([`sync`]).
//!
//! Nothing here does IO, allocates threads or reads clocks.

pub mod audit;
pub mod billing;
pub mod block_hash;
pub mod calendar;
pub mod keys;
pub mod region;
pub mod rng;
pub mod sync;
pub mod trace;
