//! llama.cpp's saved log-probabilities (`llama-perplexity --kl-divergence-base FILE`), and the KL divergence of
//! another engine's logits from them: the measure llama.cpp itself uses to compare quantizations and backends,
//! far more telling than two perplexities (which average away where the distributions differ).
//!
//! The file: `_logits_`, then `n_ctx`, `n_vocab`, `n_chunk` (u32 each), the text's tokens (`n_chunk * n_ctx` i32,
//! BOS included as the tokenizer added it), then for each chunk and each scored position (the second half of the
//! chunk but its last token) a row of `2 * ((n_vocab + 1) / 2) + 4` u16: the first four hold two f32, `scale` and
//! `min_log_prob`, the rest each token's log-probability as `min_log_prob + scale * q` (log-probabilities more
//! than 16 below the largest are clamped to it). Little-endian, as llama.cpp writes it on x86.

use std::io::Read;

/// What a file says before its rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// Tokens per chunk.
    pub context: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// The tokens, `chunks * context`.
    pub tokens: Vec<u32>,
}

impl Header {
    /// Chunks of the text.
    pub fn chunks(&self) -> usize {
        self.tokens.len() / self.context.max(1)
    }

    /// Scored rows per chunk: positions `context / 2 .. context - 1` (each predicting the next token).
    pub fn rows_per_chunk(&self) -> usize {
        self.context - 1 - self.context / 2
    }

    /// u16 values per row.
    pub fn row_len(&self) -> usize {
        2 * self.vocab.div_ceil(2) + 4
    }
}

/// A file that is not llama.cpp's saved logits, or is cut short.
#[derive(Debug, thiserror::Error)]
pub enum LogitsFileError {
    /// Reading failed.
    #[error("reading llama.cpp's logits: {0}")]
    Io(#[from] std::io::Error),
    /// The contents are not what llama.cpp writes.
    #[error("llama.cpp's logits file: {0}")]
    Format(String),
}

fn u32_of(r: &mut impl Read) -> Result<u32, LogitsFileError> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Read the header; `size` (the file's length) bounds what it may claim.
pub fn read_header(r: &mut impl Read, size: u64) -> Result<Header, LogitsFileError> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != b"_logits_" {
        return Err(LogitsFileError::Format("no _logits_ magic".into()));
    }
    let (context, vocab, chunks) = (u32_of(r)? as usize, u32_of(r)? as usize, u32_of(r)? as usize);
    if context < 4 || vocab == 0 || chunks == 0 {
        return Err(LogitsFileError::Format(format!("{chunks} chunks of {context} tokens over {vocab} tokens")));
    }
    let header = Header { context, vocab, tokens: Vec::new() };
    let rows = (chunks * header.rows_per_chunk()) as u64;
    let expected = 20 + 4 * (chunks * context) as u64 + 2 * rows * header.row_len() as u64;
    if expected != size {
        return Err(LogitsFileError::Format(format!("{size} bytes where its header implies {expected}")));
    }
    let mut raw = vec![0u8; 4 * chunks * context];
    r.read_exact(&mut raw)?;
    let tokens = raw.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Ok(Header { tokens, ..header })
}

/// Read the next row into `row` (`header.row_len()` values).
pub fn read_row(r: &mut impl Read, row: &mut [u16]) -> Result<(), LogitsFileError> {
    let mut raw = vec![0u8; 2 * row.len()];
    r.read_exact(&mut raw)?;
    row.iter_mut().zip(raw.chunks_exact(2)).for_each(|(v, b)| *v = u16::from_le_bytes([b[0], b[1]]));
    Ok(())
}

/// The log-probability a saved row (llama.cpp's: scale, minimum, then 16-bit steps) gives quant `qi`.
pub fn saved_log_prob(saved: &[u16], qi: u16) -> f32 {
    let scale = f32::from_bits(u32::from(saved[0]) | (u32::from(saved[1]) << 16));
    let min_log_prob = f32::from_bits(u32::from(saved[2]) | (u32::from(saved[3]) << 16));
    scale * f32::from(qi) + min_log_prob
}

/// `logits` as log-probabilities (a log-softmax in f64, rounded to f32).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let norm = f64::from(max) + logits.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>().ln();
    logits.iter().map(|&l| (f64::from(l) - norm) as f32).collect()
}

/// Running totals of one engine's logits against the saved rows (or another reference's log-probabilities).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Divergence {
    /// Sum of each row's KL divergence of the other engine's distribution from the saved one.
    pub kld: f64,
    /// Rows where both put the same token on top.
    pub same_top: usize,
    /// Sum of the squared differences of the probability each gave the token that came next.
    pub p_diff2: f64,
    /// Rows compared.
    pub rows: usize,
}

impl Divergence {
    /// Add one row: `saved` (llama.cpp's, as read) against `logits` (the other engine's), `next` the text's next
    /// token. The arithmetic is llama.cpp's (`perplexity.cpp`, `log_softmax` of the KL-divergence mode), so the
    /// figures compare with what it prints for its own quantizations and backends.
    pub fn add(&mut self, saved: &[u16], logits: &[f32], next: u32) {
        let q = &saved[4..4 + logits.len()];
        let base: Vec<f32> = q.iter().map(|&qi| saved_log_prob(saved, qi)).collect();
        self.add_log_probs(&base, logits, next);
    }

    /// Add one row: `base` the reference's log-probabilities, `logits` the other engine's (any offset), `next` the
    /// text's next token; [`Divergence::add`]'s arithmetic.
    pub fn add_log_probs(&mut self, base: &[f32], logits: &[f32], next: u32) {
        let (mut top, mut max) = (0, f32::NEG_INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            if l > max {
                (top, max) = (i, l);
            }
        }
        let log_sum_exp = logits.iter().map(|&l| f64::from((l - max).exp())).sum::<f64>().ln() as f32;
        let norm = max + log_sum_exp;
        let (mut sum, mut top_base, mut best) = (0f64, 0, f32::NEG_INFINITY);
        for (i, (&p_log, &l)) in base.iter().zip(logits).enumerate() {
            if p_log > best {
                (top_base, best) = (i, p_log);
            }
            if p_log > -16.0 {
                sum += f64::from(p_log.exp() * (p_log - l + norm));
            }
        }
        self.kld += sum;
        self.same_top += usize::from(top == top_base);
        let next = next as usize;
        let p_base = base[next].exp();
        let p = (logits[next] - norm).exp();
        self.p_diff2 += f64::from((p - p_base) * (p - p_base));
        self.rows += 1;
    }

    /// Mean KL divergence per row.
    pub fn mean_kld(&self) -> f64 {
        self.kld / self.rows.max(1) as f64
    }

    /// Share of rows with the same top token, in [0, 1].
    pub fn same_top_share(&self) -> f64 {
        self.same_top as f64 / self.rows.max(1) as f64
    }

    /// Root mean square of the differences in the next token's probability.
    pub fn rms_p_diff(&self) -> f64 {
        (self.p_diff2 / self.rows.max(1) as f64).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row as llama.cpp's `log_softmax` writes it.
    fn saved_row(logits: &[f32]) -> Vec<u16> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let min = logits.iter().copied().fold(f32::INFINITY, f32::min).max(max - 16.0);
        let lse = logits.iter().map(|&l| f64::from((l - max).exp())).sum::<f64>().ln() as f32;
        let (min_log_prob, scale) = (min - max - lse, (max - min) / 65535.0);
        let mut row = vec![0u16; 2 * logits.len().div_ceil(2) + 4];
        for (k, f) in [scale, min_log_prob].into_iter().enumerate() {
            row[2 * k] = f.to_bits() as u16;
            row[2 * k + 1] = (f.to_bits() >> 16) as u16;
        }
        for (i, &l) in logits.iter().enumerate() {
            row[4 + i] = if l > min { ((l - min) / scale).round() as u16 } else { 0 };
        }
        row
    }

    #[test]
    fn a_file_reads_back_and_the_same_logits_diverge_by_nothing() {
        let logits: Vec<Vec<f32>> =
            (0..3).map(|r| (0..5).map(|i| ((i * 7 + r * 3) % 5) as f32 * 0.7).collect()).collect();
        let mut file = b"_logits_".to_vec();
        for v in [8u32, 5, 1] {
            file.extend(v.to_le_bytes());
        }
        for t in 0..8u32 {
            file.extend(t.to_le_bytes());
        }
        for l in &logits {
            saved_row(l).iter().for_each(|v| file.extend(v.to_le_bytes()));
        }
        let mut r = &file[..];
        let header = read_header(&mut r, file.len() as u64).unwrap();
        assert_eq!((header.context, header.vocab, header.chunks(), header.rows_per_chunk()), (8, 5, 1, 3));
        assert_eq!(header.tokens, (0..8).collect::<Vec<_>>());
        let mut row = vec![0u16; header.row_len()];
        let (mut same, mut other) = (Divergence::default(), Divergence::default());
        for l in &logits {
            read_row(&mut r, &mut row).unwrap();
            same.add(&row, l, 2);
            let flat: Vec<f32> = l.iter().map(|v| v * 0.2).collect();
            other.add(&row, &flat, 2);
        }
        assert!(r.is_empty());
        assert!(same.mean_kld().abs() < 1e-6 && same.same_top_share() == 1.0 && same.rms_p_diff() < 1e-5);
        assert!(other.mean_kld() > 0.05, "a flattened distribution diverges: {}", other.mean_kld());
        assert!(other.rms_p_diff() > 0.01);
        // A cut file, or one that claims more than it holds, is refused.
        assert!(read_header(&mut &file[..], file.len() as u64 - 2).is_err());
        assert!(read_header(&mut &b"_nonsense_"[..], 10).is_err());
    }
}
