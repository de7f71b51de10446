//! Consul as a discovery backend: what a worker publishes in its service Meta within Consul's limits ([`meta`]),
//! the registration with its TTL check, the healthy-instances answer and the blocking-query index ([`catalog`]),
//! all sans-IO, with the reachability status and retry backoff ([`status`]); the small typed HTTP client for the
//! agent endpoints the tiers use ([`client`]); and the two async loops every tier runs on them: keeping its own
//! service registered ([`registrar`]) and watching another tier's ([`watch`]).

pub mod catalog;
pub mod client;
pub mod meta;
pub mod registrar;
pub mod status;
pub mod watch;

pub use catalog::{BlockingIndex, IndexChange, Instance, Registration};
pub use client::{ConsulClient, ConsulSettings};
pub use meta::{MetaError, ModelEntry, WorkerMeta};
pub use registrar::{Registrar, Report};
pub use status::DiscoveryStatus;
