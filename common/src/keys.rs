//! API-key secrets: how they are hashed for storage and checked, identically by the orchestrators (which store the
//! hashes in the routing state) and the frontends (which verify requests against their cached copy).

use std::collections::HashMap;

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    bytes.iter().flat_map(|b| [DIGITS[usize::from(b >> 4)] as char, DIGITS[usize::from(b & 0x0f)] as char]).collect()
}

/// Bytes from hex digits (either case).
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// 32 bytes from 64 hex digits.
pub fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    unhex(s)?.try_into().ok()
}

/// SHA-256 of an API key secret as stored: lowercase hex.
pub fn secret_sha256(secret: &str) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, secret.as_bytes()).as_ref())
}

/// Equality whose time depends only on the lengths, never on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The entry stored under this secret's hash. The lookup is by the secret's SHA-256, so its timing depends on the
/// hash, which reveals nothing usable about the secret; the stored hash is then compared in constant time.
pub fn verify_secret<'a, V>(by_hash: &'a HashMap<String, V>, secret: &str) -> Option<&'a V> {
    let hash = secret_sha256(secret);
    let (stored, value) = by_hash.get_key_value(&hash)?;
    constant_time_eq(stored.as_bytes(), hash.as_bytes()).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_lowercase_hex_sha256() {
        assert_eq!(secret_sha256("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        let h = secret_sha256("abc");
        assert_eq!(parse_hex32(&h).map(|b| hex(&b)), Some(h));
        assert_eq!(parse_hex32("zz"), None);
    }

    #[test]
    fn only_the_right_secret_verifies() {
        let by_hash = HashMap::from([(secret_sha256("s3cret"), "key-1")]);
        assert_eq!(verify_secret(&by_hash, "s3cret"), Some(&"key-1"));
        assert_eq!(verify_secret(&by_hash, "s3cre"), None);
        assert_eq!(verify_secret(&by_hash, ""), None);
        assert!(!constant_time_eq(b"ab", b"abc"));
    }
}
