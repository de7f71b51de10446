//! The figures of one load level, computed from its [`Record`]s. Pure: the same records give the same figures, so
//! they are tested on made-up timings with known answers and can be recomputed from a results file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::Record;

/// A distribution's summary (seconds for latencies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    /// Samples.
    pub count: usize,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// The `p`-th quantile (0 to 1) of sorted samples, linearly interpolated between closest ranks (numpy's default).
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = p.clamp(0.0, 1.0) * (n - 1) as f64;
            let (lo, frac) = (rank.floor() as usize, rank.fract());
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * frac
        }
    }
}

impl Dist {
    /// The summary of `samples` (NaN figures when there are none).
    pub fn of(mut samples: Vec<f64>) -> Dist {
        samples.retain(|x| x.is_finite());
        samples.sort_by(f64::total_cmp);
        let count = samples.len();
        let mean = if count == 0 { f64::NAN } else { samples.iter().sum::<f64>() / count as f64 };
        Dist {
            count,
            mean,
            p50: quantile(&samples, 0.5),
            p90: quantile(&samples, 0.9),
            p99: quantile(&samples, 0.99),
            max: samples.last().copied().unwrap_or(f64::NAN),
        }
    }
}

/// Service-level targets for goodput.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Targets {
    /// Time to first token at most this, seconds.
    pub ttft_s: Option<f64>,
    /// Time per output token at most this, seconds.
    pub tpot_s: Option<f64>,
}

/// Requests that met the targets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    /// The targets.
    pub targets: Targets,
    /// Successful requests within every target.
    pub requests: usize,
    /// Their share of all requests sent.
    pub share: f64,
    /// Per second of the level.
    pub per_s: f64,
}

/// The figures of one load level.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Requests sent.
    pub requests: usize,
    /// Requests that succeeded.
    pub ok: usize,
    /// Failures by kind.
    pub errors: BTreeMap<String, usize>,
    /// From the first request sent to the last one ended, seconds.
    pub duration_s: f64,
    /// Time to first token (successful requests).
    pub ttft: Dist,
    /// Gaps between successive content chunks, pooled over successful requests.
    pub itl: Dist,
    /// Time per output token after the first, per successful request.
    pub tpot: Dist,
    /// End-to-end latency (successful requests).
    pub e2e: Dist,
    /// Prompt tokens of successful requests, as reported.
    pub input_tokens: u64,
    /// Output tokens of successful requests.
    pub output_tokens: u64,
    /// Output tokens per second over the level.
    pub output_tokens_per_s: f64,
    /// Successful requests per second over the level.
    pub requests_per_s: f64,
    /// Goodput, when targets were given.
    pub goodput: Option<Goodput>,
    /// `x-zl-cache` values counted, where the endpoint sent them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cache: BTreeMap<String, usize>,
    /// `x-zl-route-ms`, milliseconds, where the endpoint sent it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_ms: Option<Dist>,
    /// Requests served per `x-zl-worker`, where the endpoint sent it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub workers: BTreeMap<String, usize>,
    /// Requests sent again because a kept-alive connection was closed before they reached the server.
    #[serde(default)]
    pub resent: usize,
}

/// The figures of `records` under `targets`.
pub fn summarize(records: &[Record], targets: Targets) -> Summary {
    let ok: Vec<&Record> = records.iter().filter(|r| r.ok()).collect();
    let first = records.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let last = records.iter().map(|r| r.end_s).fold(f64::NEG_INFINITY, f64::max);
    let duration_s = if records.is_empty() { 0.0 } else { (last - first).max(0.0) };
    let per_s = |n: f64| if duration_s > 0.0 { n / duration_s } else { 0.0 };
    let mut errors = BTreeMap::new();
    for r in records {
        if let Some(kind) = &r.error {
            *errors.entry(kind.clone()).or_insert(0) += 1;
        }
    }
    let mut cache = BTreeMap::new();
    let mut workers = BTreeMap::new();
    for r in &ok {
        if let Some(c) = &r.cache {
            *cache.entry(c.clone()).or_insert(0) += 1;
        }
        if let Some(w) = &r.worker {
            *workers.entry(w.clone()).or_insert(0) += 1;
        }
    }
    let route: Vec<f64> = ok.iter().filter_map(|r| r.route_ms).collect();
    let output_tokens: u64 = ok.iter().map(|r| u64::from(r.output_tokens)).sum();
    let goodput = (targets.ttft_s.is_some() || targets.tpot_s.is_some()).then(|| {
        let good = ok
            .iter()
            .filter(|r| {
                let ttft_ok = targets.ttft_s.is_none_or(|t| r.ttft().is_some_and(|x| x <= t));
                // A request of one token has no TPOT: it cannot miss that target.
                let tpot_ok = targets.tpot_s.is_none_or(|t| r.tpot().is_none_or(|x| x <= t));
                ttft_ok && tpot_ok
            })
            .count();
        Goodput {
            targets,
            requests: good,
            share: if records.is_empty() { 0.0 } else { good as f64 / records.len() as f64 },
            per_s: per_s(good as f64),
        }
    });
    Summary {
        requests: records.len(),
        ok: ok.len(),
        errors,
        duration_s,
        ttft: Dist::of(ok.iter().filter_map(|r| r.ttft()).collect()),
        itl: Dist::of(ok.iter().flat_map(|r| r.itl()).collect()),
        tpot: Dist::of(ok.iter().filter_map(|r| r.tpot()).collect()),
        e2e: Dist::of(ok.iter().map(|r| r.e2e()).collect()),
        input_tokens: ok.iter().filter_map(|r| r.input_tokens).map(u64::from).sum(),
        output_tokens,
        output_tokens_per_s: per_s(output_tokens as f64),
        requests_per_s: per_s(ok.len() as f64),
        goodput,
        cache,
        route_ms: (!route.is_empty()).then(|| Dist::of(route)),
        workers,
        resent: records.iter().map(|r| r.resent as usize).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let xs: Vec<f64> = (1..=10).map(f64::from).collect();
        // numpy.percentile(range(1, 11), [50, 90, 99]) = 5.5, 9.1, 9.91
        assert!(close(quantile(&xs, 0.5), 5.5));
        assert!(close(quantile(&xs, 0.9), 9.1));
        assert!(close(quantile(&xs, 0.99), 9.91));
        assert!(close(quantile(&xs, 0.0), 1.0) && close(quantile(&xs, 1.0), 10.0));
        assert!(close(quantile(&[4.0], 0.9), 4.0));
        assert!(quantile(&[], 0.5).is_nan());
        let d = Dist::of(vec![3.0, 1.0, f64::NAN, 2.0]);
        assert_eq!(d.count, 3);
        assert!(close(d.mean, 2.0) && close(d.p50, 2.0) && close(d.max, 3.0));
    }

    fn rec(start: f64, chunks: &[f64], end: f64, tokens: u32) -> Record {
        Record {
            start_s: start,
            chunks_s: chunks.to_vec(),
            end_s: end,
            output_tokens: tokens,
            status: 200,
            ..Record::default()
        }
    }

    #[test]
    fn a_level_with_known_answers() {
        let mut records = vec![
            // TTFT 0.1, TPOT 0.05, e2e 0.3
            rec(0.0, &[0.1, 0.15, 0.2, 0.25], 0.3, 4),
            // TTFT 0.5, TPOT 0.25, e2e 1.0
            rec(0.5, &[1.0, 1.25, 1.5], 1.5, 3),
            // TTFT 0.2, one token
            rec(1.0, &[1.2], 1.25, 1),
            Record { start_s: 1.5, end_s: 2.0, status: 503, error: Some("http_5xx".into()), ..Record::default() },
        ];
        records[0].input_tokens = Some(10);
        records[1].input_tokens = Some(20);
        records[0].worker = Some("w1".into());
        records[1].worker = Some("w2".into());
        records[2].worker = Some("w1".into());
        records[0].cache = Some("miss".into());
        records[0].route_ms = Some(0.5);
        records[1].route_ms = Some(1.5);
        let s = summarize(&records, Targets { ttft_s: Some(0.3), tpot_s: Some(0.1) });
        assert_eq!((s.requests, s.ok), (4, 3));
        assert_eq!(s.errors.get("http_5xx"), Some(&1));
        assert!(close(s.duration_s, 2.0));
        assert!(close(s.ttft.p50, 0.2) && close(s.ttft.max, 0.5));
        assert!(close(s.ttft.mean, 0.8 / 3.0));
        assert_eq!(s.tpot.count, 2);
        assert!(close(s.tpot.p50, 0.15));
        assert_eq!(s.itl.count, 5);
        assert!(close(s.itl.max, 0.25));
        assert!(close(s.e2e.p50, 0.3) && close(s.e2e.max, 1.0));
        assert_eq!((s.input_tokens, s.output_tokens), (30, 8));
        assert!(close(s.output_tokens_per_s, 4.0) && close(s.requests_per_s, 1.5));
        // Record 0 (0.1 s, 0.05 s/token) and record 2 (0.2 s, no TPOT) meet both targets; record 1 misses both.
        let g = s.goodput.unwrap();
        assert_eq!(g.requests, 2);
        assert!(close(g.share, 0.5) && close(g.per_s, 1.0));
        assert_eq!(s.workers.get("w1"), Some(&2));
        assert_eq!(s.cache.get("miss"), Some(&1));
        assert!(close(s.route_ms.unwrap().p50, 1.0));
        assert!(summarize(&records, Targets::default()).goodput.is_none());
        let empty = summarize(&[], Targets::default());
        assert_eq!((empty.requests, empty.duration_s, empty.output_tokens_per_s), (0, 0.0, 0.0));
    }
}
