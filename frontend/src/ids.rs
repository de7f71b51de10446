//! Random ids for requests and responses (`req_…`, `msg_…`, `chatcmpl-…`) and the creation time answers carry.

use std::time::{SystemTime, UNIX_EPOCH};

/// `prefix` and `len` random alphanumerics from the OS's generator.
pub fn random_id(prefix: &str, len: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut bytes = vec![0u8; len];
    let rng = ring::rand::SystemRandom::new();
    if ring::rand::SecureRandom::fill(&rng, &mut bytes).is_err() {
        // Never on a working OS; fall back to the clock so ids stay unique enough for logs.
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (nanos >> (i % 16 * 8)) as u8 ^ i as u8);
    }
    let mut id = String::with_capacity(prefix.len() + len);
    id.push_str(prefix);
    id.extend(bytes.iter().map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char));
    id
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
