//! Consul as a discovery backend, its sans-IO parts so far: what a worker publishes in its service Meta within
//! Consul's limits ([`meta`]), the registration with its TTL check, the healthy-instances answer and the
//! blocking-query index ([`catalog`]). The HTTP client and the tiers' registration and watch loops build on them.

pub mod catalog;
pub mod meta;

pub use catalog::{BlockingIndex, IndexChange, Instance, Registration};
pub use meta::{MetaError, ModelEntry, WorkerMeta};
