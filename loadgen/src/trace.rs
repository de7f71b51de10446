//! Request traces in the Mooncake format (one JSON object per line: `timestamp` in milliseconds, `input_length`,
//! `output_length`, `hash_ids`), written by a seeded generator and replayed through the file workload. Sans-IO.
//!
//! A trace carries no text. Its `hash_ids` name the prompt's blocks of `block_tokens` tokens (Mooncake's are 512),
//! chained: two requests whose first k ids are equal share their first k blocks. The replay turns each id into a
//! block of words drawn from the id alone (one token each, as the generated workloads' words), so equal ids give
//! equal text wherever they appear and the server's prefix cache sees the sharing the trace describes.
//!
//! The generator ([`generate`]) draws what such traces hold: shared prefixes (system prompts and documents) of
//! Zipf popularity, each request's own blocks after its prefix, some requests continuing an earlier one's
//! conversation (its whole prompt, then new blocks), and Poisson arrivals.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use zl_common::rng::SplitMix;

use crate::workload::{Length, Session, Zipf, words};

/// One line of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceLine {
    /// Arrival, milliseconds from the trace's start.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Output tokens.
    pub output_length: u32,
    /// The prompt's blocks, chained: equal leading ids are an equal prefix.
    pub hash_ids: Vec<u64>,
}

/// What [`generate`] draws.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSpec {
    /// Lines.
    pub requests: usize,
    /// Mean arrivals per second.
    pub rate: f64,
    /// Shared prefixes.
    pub prefixes: u32,
    /// Zipf exponent of the prefixes' popularity (0: all alike).
    pub zipf: f64,
    /// Blocks in each shared prefix.
    pub prefix_blocks: Length,
    /// Each request's own blocks after its prefix (or after the conversation it continues).
    pub unique_blocks: Length,
    /// The chance that a request continues an earlier request's conversation.
    pub follow: f64,
    /// Output tokens.
    pub output: Length,
    /// Tokens per block.
    pub block_tokens: u32,
}

/// Lines longer than this many blocks are cut (a conversation cannot grow without bound).
const MAX_BLOCKS: usize = 4096;

/// A seeded trace: the same spec and seed give the same lines.
pub fn generate(spec: &TraceSpec, seed: u64) -> Vec<TraceLine> {
    let mut rng = SplitMix::new(seed ^ 0x0054_5241_4345);
    let popularity = Zipf::new(spec.prefixes.max(1), spec.zipf);
    // Prefix p's blocks are ids p * 2^32 + 1.., fresh blocks count down from the top: never equal to each other.
    let prefix_len: Vec<u64> = (0..spec.prefixes.max(1))
        .map(|_| u64::from(spec.prefix_blocks.sample(&mut rng).min(MAX_BLOCKS as u32)))
        .collect();
    let mut fresh = u64::MAX;
    let mut lines: Vec<TraceLine> = Vec::with_capacity(spec.requests);
    let mut t = 0.0;
    for _ in 0..spec.requests {
        t += rng.exponential(1000.0 / spec.rate.max(1e-9));
        let mut ids: Vec<u64> = if !lines.is_empty() && rng.uniform() < spec.follow {
            // A later turn of a recent conversation: its whole prompt (its answer is in the new blocks).
            let back = rng.below(lines.len().min(64) as u64) as usize;
            lines[lines.len() - 1 - back].hash_ids.clone()
        } else {
            let p = popularity.sample(&mut rng);
            (1..=prefix_len[p as usize]).map(|b| (u64::from(p) << 32) + b).collect()
        };
        for _ in 0..spec.unique_blocks.sample(&mut rng) {
            ids.push(fresh);
            fresh -= 1;
        }
        ids.truncate(MAX_BLOCKS);
        // The last block is partly filled.
        let tail = 1 + rng.below(u64::from(spec.block_tokens.max(1))) as u32;
        let input_length = (ids.len() as u32 - 1) * spec.block_tokens + tail;
        lines.push(TraceLine {
            timestamp: t.round() as u64,
            input_length,
            output_length: spec.output.sample(&mut rng),
            hash_ids: ids,
        });
    }
    lines
}

/// The trace as JSONL.
pub fn to_jsonl(lines: &[TraceLine]) -> String {
    let mut out = String::new();
    for l in lines {
        out.push_str(&serde_json::to_string(l).expect("a trace line serializes"));
        out.push('\n');
    }
    out
}

/// A line as a session: `input_length` words, block by block from the ids, the last block cut to what is left;
/// `max_tokens` its output length, and its arrival.
pub fn session_of(line: &TraceLine, block_tokens: u32) -> Result<Session> {
    let blocks = line.input_length.div_ceil(block_tokens.max(1)) as usize;
    if line.input_length == 0 || blocks > line.hash_ids.len() {
        bail!(
            "input_length {} needs {blocks} blocks of {block_tokens} tokens, and the line has {} hash_ids \
             (is --trace-block-tokens the trace's block size?)",
            line.input_length,
            line.hash_ids.len()
        );
    }
    if line.output_length == 0 {
        bail!("output_length must be at least 1");
    }
    let mut text = String::with_capacity(line.input_length as usize * 6);
    let mut left = line.input_length;
    for id in &line.hash_ids[..blocks] {
        let n = left.min(block_tokens);
        let mut rng = SplitMix::for_item(0x0042_4c4f_434b, *id);
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&words(&mut rng, n));
        left -= n;
    }
    Ok(Session {
        id: 0,
        system: None,
        history: vec![],
        user_turns: vec![text],
        max_tokens: line.output_length,
        group: None,
        arrival_s: Some(line.timestamp as f64 / 1e3),
        model: None,
    })
}

/// A trace's line as a session, if `v` is one (it has `hash_ids`).
pub fn parse_line(v: &serde_json::Value, block_tokens: u32) -> Option<Result<Session>> {
    v.get("hash_ids")?;
    Some(
        serde_json::from_value::<TraceLine>(v.clone())
            .context("a trace line needs timestamp, input_length, output_length and hash_ids (integers)")
            .and_then(|l| session_of(&l, block_tokens)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TraceSpec {
        TraceSpec {
            requests: 4000,
            rate: 4.0,
            prefixes: 20,
            zipf: 1.0,
            prefix_blocks: Length { mean: 12, std_dev: 3 },
            unique_blocks: Length { mean: 2, std_dev: 1 },
            follow: 0.25,
            output: Length { mean: 32, std_dev: 8 },
            block_tokens: 16,
        }
    }

    #[test]
    fn traces_are_seeded() {
        let a = generate(&spec(), 1);
        assert_eq!(a, generate(&spec(), 1));
        assert_ne!(a, generate(&spec(), 2));
        assert_eq!(a.len(), 4000);
        assert_eq!(to_jsonl(&a[..2]).lines().count(), 2);
        let back: TraceLine = serde_json::from_str(to_jsonl(&a[..1]).trim()).unwrap();
        assert_eq!(back, a[0]);
    }

    #[test]
    fn arrivals_lengths_and_popularity_follow_the_spec() {
        let lines = generate(&spec(), 3);
        assert!(lines.windows(2).all(|w| w[1].timestamp >= w[0].timestamp));
        let rate = lines.len() as f64 / (lines.last().unwrap().timestamp as f64 / 1e3);
        assert!((rate - 4.0).abs() < 0.3, "{rate}");
        for l in &lines {
            assert_eq!(l.input_length.div_ceil(16) as usize, l.hash_ids.len(), "{l:?}");
            assert!(l.output_length >= 1);
        }
        // Zipf(1) over 20: the first prefix about 28% of fresh conversations, the second about half that.
        let first_of = |p: u64| lines.iter().filter(|l| l.hash_ids[0] == (p << 32) + 1).count() as f64;
        let (p0, p1) = (first_of(0), first_of(1));
        assert!((1.6..2.5).contains(&(p0 / p1)), "{p0} {p1}");
        // A quarter continue a conversation: their prompt starts with an earlier line's whole prompt.
        let follows = lines
            .iter()
            .enumerate()
            .filter(|(i, l)| {
                lines[i.saturating_sub(64)..*i]
                    .iter()
                    .any(|e| e.hash_ids.len() < l.hash_ids.len() && l.hash_ids.starts_with(&e.hash_ids))
            })
            .count() as f64;
        assert!((0.2..0.32).contains(&(follows / 4000.0)), "{follows}");
    }

    #[test]
    fn equal_ids_are_equal_prefixes_and_equal_text() {
        let lines = generate(&spec(), 5);
        // Chained: wherever an id appears, the ids before it are the same.
        let mut seen: std::collections::HashMap<u64, Vec<u64>> = Default::default();
        for l in &lines {
            for (k, id) in l.hash_ids.iter().enumerate() {
                let before = seen.entry(*id).or_insert_with(|| l.hash_ids[..k].to_vec());
                assert_eq!(before.as_slice(), &l.hash_ids[..k]);
            }
        }
        // Two lines that share their first blocks (and then part) share those blocks' words, and differ after.
        let common =
            |a: &TraceLine, b: &TraceLine| a.hash_ids.iter().zip(&b.hash_ids).take_while(|(x, y)| x == y).count();
        let (a, b) = lines
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                let n = a.hash_ids.len();
                let b = lines[i + 1..].iter().find(|b| (2..n.min(b.hash_ids.len())).contains(&common(a, b)))?;
                Some((a, b))
            })
            .unwrap();
        let common = common(a, b);
        let (sa, sb) = (session_of(a, 16).unwrap(), session_of(b, 16).unwrap());
        let (wa, wb): (Vec<&str>, Vec<&str>) =
            (sa.user_turns[0].split(' ').collect(), sb.user_turns[0].split(' ').collect());
        assert_eq!(wa.len(), a.input_length as usize);
        assert_eq!(wa[..common * 16], wb[..common * 16]);
        assert_ne!(wa[common * 16..], wb[common * 16..]);
        assert_eq!(sa.arrival_s, Some(a.timestamp as f64 / 1e3));
        assert_eq!(sa.max_tokens, a.output_length);
    }

    #[test]
    fn bad_lines_are_refused() {
        let line = |s: &str| parse_line(&serde_json::from_str(s).unwrap(), 16).unwrap();
        assert!(line(r#"{"timestamp": 5, "input_length": 20, "output_length": 4, "hash_ids": [1, 2]}"#).is_ok());
        for bad in [
            r#"{"timestamp": 5, "input_length": 40, "output_length": 4, "hash_ids": [1, 2]}"#,
            r#"{"timestamp": 5, "input_length": 0, "output_length": 4, "hash_ids": [1]}"#,
            r#"{"timestamp": 5, "input_length": 4, "output_length": 0, "hash_ids": [1]}"#,
            r#"{"timestamp": -1, "input_length": 4, "output_length": 2, "hash_ids": [1]}"#,
            r#"{"input_length": 4, "output_length": 2, "hash_ids": [1]}"#,
        ] {
            assert!(line(bad).is_err(), "{bad}");
        }
        assert!(parse_line(&serde_json::json!({"prompt": "x"}), 16).is_none());
    }
}
