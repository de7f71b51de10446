//! Authenticated region hops (docs/regions.md, "Spillover"): a frontend that forwards a request to a peer region's
//! frontend signs the hop with the key every region's frontends share (`--hop-key-file`). The peer takes a hop's
//! marks (no further hop, the forwarded request id, the key the origin authenticated) only from a valid signature
//! made within [`MAX_SKEW_MS`]; from anyone else the internal headers are ignored like any unknown header. The
//! client's API key never crosses: the origin checked it and names the key by id, which the peer looks up in its
//! own copy of the keys.

use axum::http::HeaderMap;
use ring::hmac;

/// The signed hop: `v1.{from region, hex}.{unix ms}.{key id, hex}.{hmac, hex}`.
pub const HOP_HEADER: &str = "x-zl-hop";
/// The forwarded request's id, covered by the signature.
pub const FORWARDED_ID_HEADER: &str = "x-zl-request-id";
/// How far a hop's clock may be from ours.
pub const MAX_SKEW_MS: u64 = 60_000;
/// The key the frontends of every region share.
#[derive(Clone)]
pub struct HopKey(hmac::Key);

impl std::fmt::Debug for HopKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HopKey(<redacted>)")
    }
}

/// A hop this frontend verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hop {
    /// The region that forwarded it.
    pub from: String,
    /// The request id it was forwarded with.
    pub request_id: String,
    /// The key the origin authenticated (empty: an anonymous request where keys are not required).
    pub key_id: String,
}

use zl_common::keys::hex as hex_encode;

fn message(from: &str, ms: u64, request_id: &str, key_id: &str, path: &str) -> String {
    format!("zl-hop v1\n{from}\n{ms}\n{request_id}\n{key_id}\n{path}")
}

fn valid_id(id: &str) -> bool {
    id.strip_prefix("req_")
        .is_some_and(|rest| !rest.is_empty() && rest.len() <= 60 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

impl HopKey {
    /// A key from the bytes of `--hop-key-file` ([`zl_common::keys::shared_key`]).
    pub fn new(secret: &[u8]) -> Result<HopKey, String> {
        zl_common::keys::shared_key(secret, "hop key").map(HopKey)
    }

    /// The key in the file `path`.
    pub fn from_file(path: &std::path::Path) -> Result<HopKey, String> {
        zl_common::keys::shared_key_file(path, "hop key").map(HopKey)
    }

    /// The `x-zl-hop` value for forwarding request `request_id` (authenticated as `key_id`) to `path` at `now_ms`.
    pub fn sign(&self, from: &str, now_ms: u64, request_id: &str, key_id: &str, path: &str) -> String {
        let tag = hmac::sign(&self.0, message(from, now_ms, request_id, key_id, path).as_bytes());
        let (from, key_id, tag) =
            (hex_encode(from.as_bytes()), hex_encode(key_id.as_bytes()), hex_encode(tag.as_ref()));
        format!("v1.{from}.{now_ms}.{key_id}.{tag}")
    }

    /// The hop `headers` carry for `path`, if its signature is ours and fresh at `now_ms`.
    pub fn verify(&self, headers: &HeaderMap, path: &str, now_ms: u64) -> Option<Hop> {
        let value = headers.get(HOP_HEADER)?.to_str().ok()?;
        let request_id = headers.get(FORWARDED_ID_HEADER)?.to_str().ok()?;
        if !valid_id(request_id) {
            return None;
        }
        let mut parts = value.split('.');
        let (v, from, ms, key_hex, tag) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if v != "v1" || parts.next().is_some() {
            return None;
        }
        let ms: u64 = ms.parse().ok()?;
        if ms.abs_diff(now_ms) > MAX_SKEW_MS {
            return None;
        }
        let from = String::from_utf8(zl_common::keys::unhex(from)?).ok()?;
        let key_id = String::from_utf8(zl_common::keys::unhex(key_hex)?).ok()?;
        let tag = zl_common::keys::unhex(tag)?;
        hmac::verify(&self.0, message(&from, ms, request_id, &key_id, path).as_bytes(), &tag).ok()?;
        Some(Hop { from, request_id: request_id.to_owned(), key_id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(hop: &str, id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HOP_HEADER, HeaderValue::from_str(hop).unwrap());
        h.insert(FORWARDED_ID_HEADER, HeaderValue::from_str(id).unwrap());
        h
    }

    #[test]
    fn only_a_fresh_hop_signed_with_the_shared_key_counts() {
        let key = HopKey::new(&[7; 32]).unwrap();
        let signed = key.sign("eu.west", 1_000_000, "req_abc123", "ka", "/v1/messages");
        let hop = key.verify(&headers(&signed, "req_abc123"), "/v1/messages", 1_010_000).unwrap();
        assert_eq!(hop, Hop { from: "eu.west".into(), request_id: "req_abc123".into(), key_id: "ka".into() });
        // What a client can send: the old unsigned marks, or a signed hop reused for another id, path or time.
        assert_eq!(key.verify(&headers("1", "req_abc123"), "/v1/messages", 1_000_000), None);
        assert_eq!(key.verify(&headers(&signed, "req_other1"), "/v1/messages", 1_000_000), None);
        assert_eq!(key.verify(&headers(&signed, "req_abc123"), "/v1/chat/completions", 1_000_000), None);
        assert_eq!(key.verify(&headers(&signed, "req_abc123"), "/v1/messages", 1_000_000 + MAX_SKEW_MS + 1), None);
        let forged = signed.replace(&hex_encode(b"ka"), &hex_encode(b"kb"));
        assert_ne!(forged, signed);
        assert_eq!(key.verify(&headers(&forged, "req_abc123"), "/v1/messages", 1_000_000), None, "another key id");
        let other = HopKey::new(&[8; 32]).unwrap();
        assert_eq!(other.verify(&headers(&signed, "req_abc123"), "/v1/messages", 1_000_000), None, "another key");
        assert!(HopKey::new(b"short").is_err());
        assert_eq!(key.verify(&headers(&signed, "abc"), "/v1/messages", 1_000_000), None, "not one of our ids");
    }
}
