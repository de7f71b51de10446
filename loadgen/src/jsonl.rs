//! `zl bench --workload file`: a JSONL file of requests, or a trace's lines (see [`crate::trace`]), as sessions.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::workload::{Session, Turn};

/// Read a JSONL file of requests: each line an object with `messages` (`[{"role", "content"}]`, the last one the
/// user's) and optionally `system`, `max_tokens` and `model` (instead of the run's), or just `prompt` (one user
/// message); or a trace's line
/// (Mooncake's format: `timestamp`, `input_length`, `output_length`, `hash_ids` of `block_tokens`-token blocks;
/// see [`crate::trace`]). Blank lines are skipped.
pub fn read_jsonl(path: &Path, block_tokens: u32) -> Result<Vec<Session>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_jsonl(&text, block_tokens).with_context(|| format!("in {}", path.display()))
}

/// [`read_jsonl`] on text.
pub fn parse_jsonl(text: &str, block_tokens: u32) -> Result<Vec<Session>> {
    let mut sessions = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("line {}", n + 1);
        let v: Value = serde_json::from_str(line).with_context(at)?;
        if let Some(session) = crate::trace::parse_line(&v, block_tokens) {
            sessions.push(session.with_context(at)?);
            continue;
        }
        let system = v.get("system").and_then(Value::as_str).map(str::to_owned);
        let max_tokens = match v.get("max_tokens") {
            None => 0,
            Some(m) => {
                m.as_u64()
                    .filter(|m| (1..=1 << 20).contains(m))
                    .with_context(|| format!("{}: max_tokens must be a positive integer", at()))? as u32
            }
        };
        let mut history: Vec<Turn> = match (v.get("messages"), v.get("prompt").and_then(Value::as_str)) {
            (Some(m), _) => serde_json::from_value(m.clone())
                .with_context(|| format!("{}: messages must be [{{\"role\", \"content\"}}]", at()))?,
            (None, Some(p)) => vec![Turn { role: "user".into(), content: p.to_owned() }],
            (None, None) => bail!("{}: needs \"messages\" or \"prompt\"", at()),
        };
        let Some(last) = history.pop().filter(|t| t.role == "user") else {
            bail!("{}: the last message must be the user's", at());
        };
        if let Some(t) = history.iter().find(|t| t.role != "user" && t.role != "assistant") {
            bail!("{}: role {:?} (system goes in \"system\")", at(), t.role);
        }
        let user_turns = vec![last.content];
        let model = v.get("model").and_then(Value::as_str).map(str::to_owned);
        sessions.push(Session { id: 0, system, history, user_turns, max_tokens, group: None, arrival_s: None, model });
    }
    if sessions.is_empty() {
        bail!("no requests");
    }
    let timed = sessions.iter().filter(|s| s.arrival_s.is_some()).count();
    if timed != 0 && timed != sessions.len() {
        bail!("{timed} of {} lines are a trace's (with arrival times): a file is one or the other", sessions.len());
    }
    if sessions.windows(2).any(|w| w[1].arrival_s < w[0].arrival_s) {
        bail!("a trace's timestamps must not go back");
    }
    Ok(sessions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Kind;
    use crate::workload::tests::wl;

    #[test]
    fn requests_and_their_errors() {
        let text = r#"{"prompt": "hi"}

{"system": "be brief", "max_tokens": 9, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}"#;
        let sessions = parse_jsonl(text, 16).unwrap();
        assert_eq!(sessions.len(), 2);
        assert_eq!(sessions[1].history.len(), 2);
        assert_eq!(sessions[1].user_turns, vec!["c".to_owned()]);
        let w = wl(Kind::File(sessions));
        assert_eq!(w.session(2).user_turns, vec!["hi".to_owned()]);
        assert_eq!(w.session(2).max_tokens, 32, "a line without max_tokens takes the distribution's");
        assert_eq!(w.session(3).max_tokens, 9);
        for bad in [
            "{}",
            r#"{"prompt": 3}"#,
            r#"{"messages": [{"role": "assistant", "content": "x"}]}"#,
            "not json",
            "",
            r#"{"prompt": "x", "max_tokens": 0}"#,
        ] {
            assert!(parse_jsonl(bad, 16).is_err(), "{bad}");
        }
        assert_eq!(w.arrival(0), None);
    }

    #[test]
    fn traces_replay_their_arrivals_pass_after_pass() {
        let text = r#"{"timestamp": 0, "input_length": 20, "output_length": 4, "hash_ids": [1, 2]}
{"timestamp": 1000, "input_length": 3, "output_length": 2, "hash_ids": [1]}"#;
        let w = wl(Kind::File(parse_jsonl(text, 16).unwrap()));
        assert!(w.describe().starts_with("trace: 2 requests"));
        let at: Vec<f64> = (0..5).map(|i| w.arrival(i).unwrap()).collect();
        assert_eq!(at, vec![0.0, 1.0, 1.5, 2.5, 3.0]);
        assert_eq!(w.session(3).arrival_s, Some(2.5));
        assert_eq!(w.session(1).max_tokens, 2);
        assert_eq!(w.session(0).user_turns[0].split(' ').count(), 20);
        let mixed = format!("{text}\n{{\"prompt\": \"x\"}}");
        assert!(parse_jsonl(&mixed, 16).is_err());
        let back = "{\"timestamp\": 9, \"input_length\": 3, \"output_length\": 2, \"hash_ids\": [1]}\n\
                    {\"timestamp\": 8, \"input_length\": 3, \"output_length\": 2, \"hash_ids\": [1]}";
        assert!(parse_jsonl(back, 16).is_err());
    }
}
