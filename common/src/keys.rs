//! API-key secrets: how they are hashed for storage and checked, identically by the orchestrators (which store the
//! hashes in the routing state) and the frontends (which verify requests against their cached copy).
//!
//! With a **pepper** (a secret of at least 32 bytes in a file only orchestrators and frontends read,
//! `--key-pepper-file`), a secret is stored as `hmac-sha256:{pepper id}:{HMAC-SHA256(pepper, secret)}`: the Raft
//! log, a snapshot or a backup of them is then no offline dictionary for operator-chosen secrets. Without one, the
//! legacy form, bare SHA-256 hex, which is only safe for the high-entropy secrets `zl` generates. Both forms
//! verify, so keys made before a pepper was given keep working until they are rotated.

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

/// The prefix of a keyed (peppered) hash.
pub const KEYED_PREFIX: &str = "hmac-sha256:";
/// The shortest shared secret key accepted (the key pepper, the region hop key).
pub const MIN_SHARED_KEY_LEN: usize = 32;

/// An HMAC-SHA256 key from the bytes of a shared secret `what` (surrounding whitespace trimmed, as a file holds it;
/// at least [`MIN_SHARED_KEY_LEN`] bytes).
pub fn shared_key(secret: &[u8], what: &str) -> Result<ring::hmac::Key, String> {
    let secret = secret.trim_ascii();
    if secret.len() < MIN_SHARED_KEY_LEN {
        return Err(format!("the {what} must be at least {MIN_SHARED_KEY_LEN} bytes (it is {})", secret.len()));
    }
    Ok(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret))
}

/// [`shared_key`] read from the file `path`.
pub fn shared_key_file(path: &std::path::Path, what: &str) -> Result<ring::hmac::Key, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("reading the {what} {}: {e}", path.display()))?;
    shared_key(&bytes, what).map_err(|e| format!("{}: {e}", path.display()))
}

/// How this node hashes and verifies key secrets: keyed with its pepper when it has one.
#[derive(Clone, Default)]
pub struct SecretHasher {
    pepper: Option<(ring::hmac::Key, String)>,
}

impl std::fmt::Debug for SecretHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretHasher").field("pepper_id", &self.pepper_id()).finish()
    }
}

impl SecretHasher {
    /// Keyed with `pepper` ([`shared_key`]).
    pub fn with_pepper(pepper: &[u8]) -> Result<SecretHasher, String> {
        Ok(SecretHasher::keyed(shared_key(pepper, "key pepper")?))
    }

    /// Read the pepper from `path` (`None`: the legacy, unkeyed hash).
    pub fn from_file(path: Option<&std::path::Path>) -> Result<SecretHasher, String> {
        match path {
            None => Ok(SecretHasher::default()),
            Some(p) => Ok(SecretHasher::keyed(shared_key_file(p, "key pepper")?)),
        }
    }

    /// Keyed with `key`; the pepper's id is a MAC of a fixed label (the same on every node given the same pepper,
    /// and nothing about the pepper itself).
    fn keyed(key: ring::hmac::Key) -> SecretHasher {
        let id = hex(&ring::hmac::sign(&key, b"zerolayer key pepper id").as_ref()[..4]);
        SecretHasher { pepper: Some((key, id)) }
    }

    /// The short id of this node's pepper (the same on every node given the same file), if any.
    pub fn pepper_id(&self) -> Option<&str> {
        self.pepper.as_ref().map(|(_, id)| id.as_str())
    }

    /// The stored form of `secret`.
    pub fn hash(&self, secret: &str) -> String {
        match &self.pepper {
            Some((key, id)) => format!("{KEYED_PREFIX}{id}:{}", hex(ring::hmac::sign(key, secret.as_bytes()).as_ref())),
            None => secret_sha256(secret),
        }
    }

    /// The entry stored under this secret's hash, keyed or legacy. The lookups are by hash, so their timing
    /// depends on hashes, which reveal nothing usable about the secret; the stored hash is then compared in
    /// constant time.
    pub fn verify<'a, V>(&self, by_hash: &'a HashMap<String, V>, secret: &str) -> Option<&'a V> {
        // The legacy hash only when the keyed one finds nothing: one hash per request in a peppered cluster.
        let keyed = self.pepper.as_ref().map(|_| self.hash(secret));
        keyed.into_iter().chain(std::iter::once_with(|| secret_sha256(secret))).find_map(|hash| {
            let (stored, value) = by_hash.get_key_value(&hash)?;
            constant_time_eq(stored.as_bytes(), hash.as_bytes()).then_some(value)
        })
    }

    /// Whether `stored` (either form) is the hash of `secret`.
    pub fn matches(&self, stored: &str, secret: &str) -> bool {
        let hash = if stored.starts_with(KEYED_PREFIX) { self.hash(secret) } else { secret_sha256(secret) };
        constant_time_eq(stored.as_bytes(), hash.as_bytes())
    }
}

/// Whether `s` is a stored secret hash: 64 lowercase hex (legacy SHA-256), or `hmac-sha256:` with an 8-hex pepper id
/// and 64 lowercase hex.
pub fn is_secret_hash(s: &str) -> bool {
    let lower_hex = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match s.strip_prefix(KEYED_PREFIX) {
        Some(rest) => rest.split_once(':').is_some_and(|(id, mac)| lower_hex(id, 8) && lower_hex(mac, 64)),
        None => lower_hex(s, 64),
    }
}

/// The pepper id of a keyed hash (`None` for a legacy one).
pub fn pepper_of(stored: &str) -> Option<&str> {
    stored.strip_prefix(KEYED_PREFIX)?.split_once(':').map(|(id, _)| id)
}

/// Equality whose time depends only on the lengths, never on where the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The entry stored under this secret's legacy (unkeyed) hash ([`SecretHasher::verify`] without a pepper).
pub fn verify_secret<'a, V>(by_hash: &'a HashMap<String, V>, secret: &str) -> Option<&'a V> {
    SecretHasher::default().verify(by_hash, secret)
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

    #[test]
    fn peppered_hashes_are_keyed_and_legacy_ones_still_verify() {
        let peppered = SecretHasher::with_pepper(&[b'p'; 32]).unwrap();
        let h = peppered.hash("s3cret-of-an-operator");
        assert!(h.starts_with(KEYED_PREFIX) && is_secret_hash(&h), "{h}");
        assert_eq!(pepper_of(&h), peppered.pepper_id());
        assert!(!h.contains(&secret_sha256("s3cret-of-an-operator")), "not the bare SHA-256");
        // Another pepper gives another hash: the stored form is no dictionary without the pepper.
        let other = SecretHasher::with_pepper(&[b'q'; 32]).unwrap();
        assert_ne!(other.hash("s3cret-of-an-operator"), h);
        assert_ne!(other.pepper_id(), peppered.pepper_id());
        let by_hash = HashMap::from([(h.clone(), "new"), (secret_sha256("legacy-secret-0123"), "old")]);
        assert_eq!(peppered.verify(&by_hash, "s3cret-of-an-operator"), Some(&"new"));
        assert_eq!(peppered.verify(&by_hash, "legacy-secret-0123"), Some(&"old"), "legacy keys keep working");
        assert_eq!(other.verify(&by_hash, "s3cret-of-an-operator"), None);
        assert_eq!(SecretHasher::default().verify(&by_hash, "s3cret-of-an-operator"), None);
        assert!(peppered.matches(&h, "s3cret-of-an-operator") && !peppered.matches(&h, "other"));
        assert!(peppered.matches(&secret_sha256("x"), "x"));
        assert!(SecretHasher::with_pepper(b"short").is_err());
        assert!(!is_secret_hash("hmac-sha256:zz:00") && !is_secret_hash("ABC"));
        assert!(is_secret_hash(&secret_sha256("x")));
    }
}
