//! The bytes each token stands for: what a grammar engine walks when it decides which tokens may come next.
//! Byte-level BPE vocabularies (GPT-2, Llama 3, Qwen, SmolLM) spell every byte as one printable character;
//! SentencePiece vocabularies spell a space as `▁` and unknown bytes as `<0xNN>`. Special tokens are marked with a
//! leading 0xFF byte (which no UTF-8 text contains), so no grammar over text ever matches them.

use crate::TextTokenizer;

/// The byte that starts a special token's entry.
pub const SPECIAL_MARKER: u8 = 0xff;

/// The GPT-2 byte-to-unicode mapping's printable form of byte `b`.
pub(crate) fn byte_char(b: u8) -> char {
    match b {
        b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff => char::from(b),
        _ => {
            // Unprintable bytes map past U+0100 in order, as GPT-2's bytes_to_unicode does.
            let skipped = (0u16..=255)
                .filter(|&c| !matches!(c as u8, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff))
                .position(|c| c == u16::from(b))
                .unwrap_or(0);
            char::from_u32(256 + skipped as u32).unwrap_or('?')
        }
    }
}

/// The byte a byte-level character stands for, if it is one.
fn char_byte(table: &[char; 256], c: char) -> Option<u8> {
    table.iter().position(|&t| t == c).map(|b| b as u8)
}

fn sentencepiece_bytes(token: &str) -> Vec<u8> {
    // `<0x0A>`: a byte-fallback token.
    if let Some(hex) = token.strip_prefix("<0x").and_then(|t| t.strip_suffix('>'))
        && hex.len() == 2
        && let Ok(b) = u8::from_str_radix(hex, 16)
    {
        return vec![b];
    }
    token.replace('\u{2581}', " ").into_bytes()
}

impl TextTokenizer {
    /// Every token's bytes, indexed by id (`vocab_size()` entries; an id with no token has none). Special tokens
    /// are [`SPECIAL_MARKER`] followed by their name.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let byte_level = self
            .inner
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|json| json.contains("\"ByteLevel\""));
        let table: [char; 256] = std::array::from_fn(|b| byte_char(b as u8));
        let added = self.inner.get_added_tokens_decoder();
        (0..self.vocab_size() as u32)
            .map(|id| {
                if let Some(tok) = added.get(&id) {
                    return if tok.special {
                        std::iter::once(SPECIAL_MARKER).chain(tok.content.bytes()).collect()
                    } else {
                        tok.content.clone().into_bytes()
                    };
                }
                let Some(token) = self.inner.id_to_token(id) else { return Vec::new() };
                if byte_level {
                    let mut out = Vec::with_capacity(token.len());
                    for c in token.chars() {
                        match char_byte(&table, c) {
                            Some(b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    out
                } else {
                    sentencepiece_bytes(&token)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testing::tiny_vocab;

    #[test]
    fn byte_level_tokens_are_their_bytes_and_specials_are_marked() {
        let tok = TextTokenizer::from_gguf(&tiny_vocab()).unwrap();
        let bytes = tok.token_bytes();
        assert_eq!(bytes.len(), tok.vocab_size());
        for b in 0..=255u8 {
            assert_eq!(bytes[usize::from(b)], vec![b], "byte token {b}");
        }
        assert_eq!(bytes[259], b"hello");
        assert_eq!(bytes[262][0], SPECIAL_MARKER);
        assert_eq!(&bytes[262][1..], b"<|im_end|>");
        // Every plain token decodes to its bytes.
        for id in [104u32, 256, 259, 32, 10] {
            assert_eq!(tok.decode(&[id]).unwrap().as_bytes(), bytes[id as usize].as_slice());
        }
    }

    #[test]
    fn sentencepiece_spaces_and_byte_fallbacks() {
        assert_eq!(sentencepiece_bytes("\u{2581}the"), b" the");
        assert_eq!(sentencepiece_bytes("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_bytes("<0xZZ>"), b"<0xZZ>");
    }
}
