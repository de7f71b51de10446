//! Random ids for requests and responses (`req_…`, `msg_…`, `chatcmpl-…`) and the creation time answers carry.

use std::time::{SystemTime, UNIX_EPOCH};

/// `prefix` and `len` random alphanumerics from the OS's generator.
pub fn random_id(prefix: &str, len: usize) -> String {
    random_from(prefix, len, b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
}

/// `len` random lowercase hex characters, never all zero (W3C trace and span ids).
pub fn random_hex(len: usize) -> String {
    loop {
        let id = random_from("", len, b"0123456789abcdef");
        if id.bytes().any(|b| b != b'0') {
            return id;
        }
    }
}

fn random_from(prefix: &str, len: usize, alphabet: &[u8]) -> String {
    let mut bytes = vec![0u8; len];
    let rng = ring::rand::SystemRandom::new();
    if ring::rand::SecureRandom::fill(&rng, &mut bytes).is_err() {
        // Never on a working OS; fall back to the clock so ids stay unique enough for logs.
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (nanos >> (i % 16 * 8)) as u8 ^ i as u8);
    }
    let mut id = String::with_capacity(prefix.len() + len);
    id.push_str(prefix);
    id.extend(bytes.iter().map(|b| alphabet[usize::from(*b) % alphabet.len()] as char));
    id
}

pub use zl_common::calendar::unix_ms;

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
