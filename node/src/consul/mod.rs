//! Consul as a discovery backend: what a worker publishes in its service Meta within Consul's limits ([`meta`]),
//! the registration with its TTL check, the healthy-instances answer and the blocking-query index ([`catalog`]),
//! all sans-IO, and the small typed HTTP client for the agent endpoints the tiers use ([`client`]). The tiers'
//! registration and watch loops build on them.

pub mod catalog;
pub mod client;
pub mod meta;

pub use catalog::{BlockingIndex, IndexChange, Instance, Registration};
pub use client::{ConsulClient, ConsulSettings};
pub use meta::{MetaError, ModelEntry, WorkerMeta};
