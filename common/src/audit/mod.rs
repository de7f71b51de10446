//! The audit log's format: one record per request, hash-chained, one record per line.
//!
//! A line is `<sha256 hex of the JSON> <JSON record>\n`. Each record carries its sequence number and the hash of
//! the record before it (`prev`; 64 zeros before the first), so changing any byte breaks that line's hash, and
//! removing or reordering records breaks the chain. Truncating the newest records leaves a valid chain; the
//! frontends therefore commit their chain head (sequence number and hash) to the Raft group every few seconds, and
//! [`verify`] checks a chain against such a head (docs/audit.md).
//!
//! Pure: the writer (frontend) and the checker (`zl audit verify`) share this code; neither IO nor clocks here.
//! The files these lines live in (segments: naming, rotation, reading, resuming) are `zl_node::audit`'s.

mod seal;
mod verify;

pub use seal::{Payload, SealError, SealedPayload, open, seal};
pub use verify::{Broken, ChainHead, Summary, Verifier};

use serde::{Deserialize, Serialize};

/// Version of the billing formula (`zl_common::billing`) recorded with every unit, so a record says which formula
/// produced its figure.
pub const BILLING_FORMULA_VERSION: u32 = 1;

/// The `prev` of a chain's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Longest line a verifier reads (a record with an encrypted 4 MiB prompt and its answer fits).
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// One request as the audit log records it. Strings are empty where a figure does not apply (a refusal has no
/// worker); no secret and, unless the project turned on content logging, no plaintext.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// Position in this frontend's chain, from 1.
    pub seq: u64,
    /// Hash of the record before (hex), [`GENESIS`] for the first.
    pub prev: String,
    /// Unix time in milliseconds when the request arrived.
    pub time_ms: u64,
    /// The request id answered to the client.
    pub request_id: String,
    /// W3C trace id.
    pub trace_id: String,
    /// API key id (never its secret).
    pub key_id: String,
    /// Project billed.
    pub project: String,
    /// Region of the frontend that served it.
    pub region: String,
    /// Frontend id.
    pub frontend: String,
    /// Orchestrator that routed it (its QUIC address), empty when none did.
    pub orchestrator: String,
    /// Worker that ran it ("cache" for a cache hit).
    pub worker: String,
    /// Concrete model id.
    pub model: String,
    /// SHA-256 of the model's weights (hex).
    pub weights_sha256: String,
    /// SHA-256 of the canonical input (hex): the rendered prompt with every parameter that decides the output.
    pub input_sha256: String,
    /// SHA-256 of the output text (hex).
    pub output_sha256: String,
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Output tokens.
    pub output_tokens: u32,
    /// The billing unit.
    pub billing_unit: f32,
    /// The weights (input, output, context) that produced it.
    pub billing_weights: [f32; 3],
    /// [`BILLING_FORMULA_VERSION`] of the formula that produced it.
    pub billing_formula: u32,
    /// Answered from the response cache.
    pub cache_hit: bool,
    /// HTTP status answered.
    pub status: u16,
    /// Error type (`rate_limit_error`, ...), empty on success.
    pub error_type: String,
    /// Why generation stopped (`end_turn`, `max_tokens`, `stop_sequence`), empty when it did not finish.
    pub stop_reason: String,
    /// Arrival to last byte, milliseconds.
    pub latency_ms: f64,
    /// Arrival to first token, milliseconds (0 when none came).
    pub ttft_ms: f64,
    /// Time spent on route decisions, milliseconds.
    pub route_ms: f64,
    /// The seed the answer was sampled with (the client's, or one the frontend drew); absent for cache hits and
    /// refusals (and in records written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The LoRA adapter it ran with, and the SHA-256 (hex) of the adapter's weights file; empty without one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub adapter: String,
    /// See `adapter`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub adapter_sha256: String,
    /// Workers the request moved to, in order, when the one before failed mid-answer (`worker` is the first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub migrated_to: Vec<String>,
    /// The prompt and answer, encrypted under the project's data key (content logging on), else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<SealedPayload>,
}

/// SHA-256 in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::keys::hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// The line for `record` (its `seq` and `prev` already set) and that line's hash.
pub fn encode_line(record: &AuditRecord) -> (String, String) {
    let json = serde_json::to_string(record).expect("an audit record always serializes");
    let hash = sha256_hex(json.as_bytes());
    (format!("{hash} {json}\n"), hash)
}

/// A line split into its claimed hash and its record, checked: the hash must be that of the JSON.
pub fn decode_line(line: &[u8]) -> Result<(String, AuditRecord), String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let Some(space) = line.iter().position(|&b| b == b' ') else {
        return Err("not a record line (no hash)".into());
    };
    let (hash, json) = (&line[..space], &line[space + 1..]);
    let hash = std::str::from_utf8(hash).map_err(|_| "the hash is not text".to_owned())?;
    let actual = sha256_hex(json);
    if !crate::keys::constant_time_eq(hash.as_bytes(), actual.as_bytes()) {
        return Err(format!("hash mismatch: the line says {hash:.16}…, its content hashes to {actual:.16}…"));
    }
    let record: AuditRecord = serde_json::from_slice(json).map_err(|e| format!("not a record: {e}"))?;
    Ok((actual, record))
}

#[cfg(test)]
mod tests;
