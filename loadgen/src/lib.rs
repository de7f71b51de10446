//! `zl bench`: a load generator and report for any endpoint speaking the Anthropic Messages API or OpenAI Chat
//! Completions (zerolayer's or anyone's), and for one zerolayer worker straight over the cluster RPC.
//!
//! The pure parts: [`workload`] (seeded sessions), [`jsonl`] (request files), [`trace`] (Mooncake-format traces: the seeded generator and
//! the replay's text), [`load`] (closed and open loops, trace replays, sweeps), [`sse`] and [`api`]
//! (the wire formats), [`record`] and [`stats`] (per-request timings and the figures computed from them),
//! [`report`] and [`compare`] (results files and tables), [`plot`] (what to draw), [`progress`] (the progress line).
//! The IO shell: [`client`] (HTTP/1.1 and TLS), [`direct`] (the worker RPC), [`runner`] (levels), [`cli`] (the
//! command). See docs/benchmarks.md.

pub mod api;
pub mod cli;
pub mod client;
pub mod compare;
pub mod direct;
pub mod jsonl;
pub mod load;
pub mod plot;
pub mod progress;
pub mod record;
pub mod report;
pub mod runner;
pub mod sse;
pub mod stats;
pub mod trace;
pub mod workload;
