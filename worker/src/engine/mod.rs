//! The inference engine: a synchronous core (`state`) that advances every sequence one step at a time.

pub mod actor;
pub mod backend;
pub mod embedder;
pub mod logprobs;
pub mod penalize;
mod seq;
pub mod state;
pub mod think;
mod tiering;

pub use actor::{EngineGone, EngineHandle, Generation, Published};
pub use logprobs::Logprob;
pub use state::{EngineCore, EngineStats, Event, Request, RequestAdapter, RequestError};
