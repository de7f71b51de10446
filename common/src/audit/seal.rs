//! Encrypted payloads: a request's prompt and answer sealed with AES-256-GCM under its project's data key, bound
//! to the record's request id. Deleting the key from the routing state (crypto-shredding) leaves the ciphertext,
//! and so the chain, intact and the content unreadable.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

use crate::keys::hex;

/// What content logging stores.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// The prompt as the model saw it (chat template applied).
    pub input: String,
    /// The answer.
    pub output: String,
}

/// A payload as the record carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedPayload {
    /// Id of the project data key that sealed it.
    pub key_id: String,
    /// The 96-bit nonce, hex.
    pub nonce: String,
    /// Ciphertext and tag, hex.
    pub ciphertext: String,
}

/// A payload that cannot be opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The key is not 32 bytes.
    #[error("a data key must be 32 bytes")]
    BadKey,
    /// Hex, length or tag wrong: the wrong key, or altered bytes.
    #[error("the payload does not open with this key (wrong key or altered bytes)")]
    Open,
}

fn key(bytes: &[u8]) -> Result<LessSafeKey, SealError> {
    Ok(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SealError::BadKey)?))
}

/// Seal `payload` for the record of `request_id` under data key `key_id` (`data_key`, 32 bytes) with a fresh
/// `nonce` (never reuse one with the same key: take it from a CSPRNG).
pub fn seal(
    payload: &Payload,
    key_id: &str,
    data_key: &[u8],
    nonce: [u8; NONCE_LEN],
    request_id: &str,
) -> Result<SealedPayload, SealError> {
    let mut data = serde_json::to_vec(payload).expect("a payload always serializes");
    key(data_key)?
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(request_id.as_bytes()), &mut data)
        .map_err(|_| SealError::Open)?;
    Ok(SealedPayload { key_id: key_id.to_owned(), nonce: hex(&nonce), ciphertext: hex(&data) })
}

fn unhex(s: &str) -> Result<Vec<u8>, SealError> {
    crate::keys::unhex(s).ok_or(SealError::Open)
}

/// Open a sealed payload of the record of `request_id`.
pub fn open(sealed: &SealedPayload, data_key: &[u8], request_id: &str) -> Result<Payload, SealError> {
    let nonce: [u8; NONCE_LEN] = unhex(&sealed.nonce)?.try_into().map_err(|_| SealError::Open)?;
    let mut data = unhex(&sealed.ciphertext)?;
    let plain = key(data_key)?
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(request_id.as_bytes()), &mut data)
        .map_err(|_| SealError::Open)?;
    serde_json::from_slice(plain).map_err(|_| SealError::Open)
}
