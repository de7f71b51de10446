//! What one request did, as timings relative to the start of its load level: the raw material of every figure
//! (kept in the results file, so figures can be recomputed and runs compared).

use serde::{Deserialize, Serialize};

/// One request's events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Session number.
    pub session: u64,
    /// Turn within the session (0 for single-turn workloads).
    pub turn: u32,
    /// When it was sent (for open loops: when it was due), seconds since the level started.
    pub start_s: f64,
    /// When each piece of content arrived (an SSE text delta), seconds since the level started.
    pub chunks_s: Vec<f64>,
    /// When the response ended (or failed), seconds since the level started.
    pub end_s: f64,
    /// Prompt tokens, as the endpoint's `usage` reported them.
    pub input_tokens: Option<u32>,
    /// Output tokens: the endpoint's `usage`, else the number of content chunks.
    pub output_tokens: u32,
    /// HTTP status (0 where none came).
    pub status: u16,
    /// The failure's kind (`connect`, `timeout`, `http_429`, `http_5xx`, `stream_error`, `incomplete`, ...);
    /// `None` for a success.
    pub error: Option<String>,
    /// The failure's message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// `request-id`, `x-request-id` or the body's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// `x-zl-worker`: who served it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// `x-zl-cache`: hit, miss or bypass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// `x-zl-route-ms`: the route decision's time at the frontend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_ms: Option<f64>,
    /// Times it was sent again on a fresh connection because the kept-alive one turned out closed by the server
    /// before the request reached it (never the server's error).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resent: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Record {
    /// Whether it succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Time to first token, seconds.
    pub fn ttft(&self) -> Option<f64> {
        self.chunks_s.first().map(|t| t - self.start_s)
    }

    /// End-to-end latency, seconds.
    pub fn e2e(&self) -> f64 {
        self.end_s - self.start_s
    }

    /// Time per output token after the first: (last chunk - first chunk) / (output tokens - 1). `None` with fewer
    /// than two output tokens.
    pub fn tpot(&self) -> Option<f64> {
        let (first, last) = (self.chunks_s.first()?, self.chunks_s.last()?);
        (self.output_tokens >= 2).then(|| (last - first) / f64::from(self.output_tokens - 1))
    }

    /// Gaps between successive content chunks, seconds (inter-token latency where each chunk is one token).
    pub fn itl(&self) -> impl Iterator<Item = f64> + '_ {
        self.chunks_s.windows(2).map(|w| w[1] - w[0])
    }
}

/// A failure's kind from an HTTP status.
pub fn status_kind(status: u16) -> String {
    match status {
        // 529 is Anthropic's "overloaded": worth its own line.
        500..=599 if status != 529 => "http_5xx".into(),
        _ => format!("http_{status}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_request_figures() {
        let r = Record {
            start_s: 1.0,
            chunks_s: vec![1.5, 1.6, 1.8, 2.1],
            end_s: 2.2,
            output_tokens: 4,
            ..Record::default()
        };
        assert!((r.ttft().unwrap() - 0.5).abs() < 1e-12);
        assert!((r.e2e() - 1.2).abs() < 1e-12);
        assert!((r.tpot().unwrap() - 0.2).abs() < 1e-12);
        let itl: Vec<f64> = r.itl().collect();
        assert_eq!(itl.len(), 3);
        assert!((itl[2] - 0.3).abs() < 1e-12);
        let one = Record { chunks_s: vec![1.5], output_tokens: 1, ..r.clone() };
        assert_eq!(one.tpot(), None);
        assert_eq!(Record::default().ttft(), None);
        assert_eq!(status_kind(503), "http_5xx");
        assert_eq!(status_kind(429), "http_429");
    }
}
