//! zerolayer's wire protocol, sans IO: what crosses the network between tiers, and nothing that moves it.
//!
//! Layers, from the bytes up:
//! - [`frame`]: framing (8-byte header + one FlatBuffers table), size limits, incremental decoding.
//! - [`message`]: verified decoding into owned, checked Rust types, and checked encoding.
//! - [`call`]: the life cycle of one call (open, streaming, finished, cancelled, failed) as a state machine.
//!
//! As quinn-proto is to quinn: no runtime, socket, clock or TLS here. `zl-proto` is the async QUIC and TLS shell
//! that pumps these; route policies, the admin code and the load generator use the messages without it.

pub mod call;
pub mod frame;
pub mod message;

#[allow(
    unsafe_code,
    missing_docs,
    unreachable_pub,
    unused_imports,
    dead_code,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    deprecated,
    mismatched_lifetime_syntaxes,
    rust_2018_idioms,
    clippy::all,
    clippy::unwrap_used
)]
#[rustfmt::skip]
#[path = "generated/zerolayer_generated.rs"]
mod generated;

pub use call::{CallPhase, CallShape, CallState};
pub use frame::{FrameDecoder, FrameError, FrameKind, HARD_MAX_PAYLOAD, RawFrame};
pub use message::{Encoder, Message, MessageError};
