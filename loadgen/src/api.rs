//! The two API flavours `zl bench` speaks: how a request is written and what each streamed event means. Sans-IO.

use serde_json::{Value, json};

use crate::workload::Turn;

/// An API flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Flavour {
    /// Anthropic Messages: `POST /v1/messages`.
    Anthropic,
    /// OpenAI Chat Completions: `POST /v1/chat/completions`.
    Openai,
}

/// What one streamed event says.
#[derive(Clone, Debug, PartialEq)]
pub enum Said {
    /// The response started; the prompt's tokens and the message id where given.
    Start {
        /// Prompt tokens.
        input_tokens: Option<u32>,
        /// Message id.
        id: Option<String>,
    },
    /// Content.
    Text(String),
    /// Token counts.
    Usage {
        /// Prompt tokens.
        input_tokens: Option<u32>,
        /// Output tokens.
        output_tokens: Option<u32>,
    },
    /// The response is complete.
    Stop,
    /// The stream failed.
    Error(String),
    /// Nothing that matters here.
    Other,
}

fn tokens(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

impl Flavour {
    /// The request path under a base URL whose path is `base_path` (`""` or `/v1`, as SDKs take base URLs).
    pub fn path(self, base_path: &str) -> String {
        let base = base_path.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        match self {
            Flavour::Anthropic => format!("{base}/v1/messages"),
            Flavour::Openai => format!("{base}/v1/chat/completions"),
        }
    }

    /// The authentication and version headers.
    pub fn headers(self, key: &str) -> Vec<(&'static str, String)> {
        match self {
            Flavour::Anthropic => vec![("x-api-key", key.to_owned()), ("anthropic-version", "2023-06-01".to_owned())],
            Flavour::Openai => vec![("authorization", format!("Bearer {key}"))],
        }
    }

    /// A streaming request's body.
    pub fn body(
        self,
        model: &str,
        system: Option<&str>,
        messages: &[Turn],
        max_tokens: u32,
        temperature: f32,
    ) -> Value {
        let turns: Vec<Value> = messages.iter().map(|t| json!({"role": t.role, "content": t.content})).collect();
        match self {
            Flavour::Anthropic => {
                let mut body = json!({"model": model, "max_tokens": max_tokens, "temperature": temperature,
                    "stream": true, "messages": turns});
                if let Some(s) = system {
                    body["system"] = json!(s);
                }
                body
            }
            Flavour::Openai => {
                let mut all = Vec::with_capacity(turns.len() + 1);
                if let Some(s) = system {
                    all.push(json!({"role": "system", "content": s}));
                }
                all.extend(turns);
                json!({"model": model, "max_tokens": max_tokens, "temperature": temperature, "stream": true,
                    "stream_options": {"include_usage": true}, "messages": all})
            }
        }
    }

    /// What a streamed event says.
    pub fn read(self, name: Option<&str>, data: &str) -> Said {
        if self == Flavour::Openai && data.trim() == "[DONE]" {
            return Said::Stop;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return Said::Error(format!("an event that is not JSON: {}", data.chars().take(200).collect::<String>()));
        };
        if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
            let message = e["message"].as_str().unwrap_or("(no message)");
            let kind = e["type"].as_str().or(e["code"].as_str()).unwrap_or("error");
            return Said::Error(format!("{kind}: {message}"));
        }
        match self {
            Flavour::Anthropic => match v["type"].as_str().or(name) {
                Some("message_start") => Said::Start {
                    input_tokens: tokens(&v["message"]["usage"]["input_tokens"]),
                    id: v["message"]["id"].as_str().map(str::to_owned),
                },
                Some("content_block_delta") => match v["delta"]["text"].as_str() {
                    Some(t) if !t.is_empty() => Said::Text(t.to_owned()),
                    _ => Said::Other,
                },
                Some("message_delta") => Said::Usage {
                    input_tokens: tokens(&v["usage"]["input_tokens"]),
                    output_tokens: tokens(&v["usage"]["output_tokens"]),
                },
                Some("message_stop") => Said::Stop,
                _ => Said::Other,
            },
            Flavour::Openai => {
                if let Some(t) = v["choices"][0]["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
                    return Said::Text(t.to_owned());
                }
                if v["usage"].is_object() {
                    return Said::Usage {
                        input_tokens: tokens(&v["usage"]["prompt_tokens"]),
                        output_tokens: tokens(&v["usage"]["completion_tokens"]),
                    };
                }
                if let Some(id) = v["id"].as_str().filter(|_| v["choices"][0]["delta"]["role"].is_string()) {
                    return Said::Start { input_tokens: None, id: Some(id.to_owned()) };
                }
                Said::Other
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(s: &str) -> Vec<Turn> {
        vec![Turn { role: "user".into(), content: s.into() }]
    }

    #[test]
    fn requests() {
        assert_eq!(Flavour::Anthropic.path(""), "/v1/messages");
        assert_eq!(Flavour::Openai.path("/v1/"), "/v1/chat/completions");
        assert_eq!(Flavour::Openai.path("/proxy/v1"), "/proxy/v1/chat/completions");
        let a = Flavour::Anthropic.body("m", Some("sys"), &user("hi"), 8, 0.0);
        assert_eq!(a["system"], "sys");
        assert_eq!(a["messages"][0]["content"], "hi");
        let o = Flavour::Openai.body("m", Some("sys"), &user("hi"), 8, 0.5);
        assert_eq!(o["messages"][0]["role"], "system");
        assert_eq!(o["messages"][1]["content"], "hi");
        assert_eq!(o["stream_options"]["include_usage"], true);
        assert_eq!(Flavour::Openai.headers("k")[0].1, "Bearer k");
    }

    #[test]
    fn anthropic_events() {
        let f = Flavour::Anthropic;
        assert_eq!(
            f.read(None, r#"{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":12}}}"#),
            Said::Start { input_tokens: Some(12), id: Some("msg_1".into()) }
        );
        assert_eq!(f.read(None, r#"{"type":"content_block_delta","delta":{"text":"Pa"}}"#), Said::Text("Pa".into()));
        assert_eq!(
            f.read(None, r#"{"type":"message_delta","usage":{"output_tokens":5}}"#),
            Said::Usage { input_tokens: None, output_tokens: Some(5) }
        );
        assert_eq!(f.read(Some("message_stop"), r#"{"type":"message_stop"}"#), Said::Stop);
        assert_eq!(
            f.read(None, r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#),
            Said::Error("overloaded_error: busy".into())
        );
        assert!(matches!(f.read(None, "nope"), Said::Error(_)));
        assert_eq!(f.read(None, r#"{"type":"ping"}"#), Said::Other);
    }

    #[test]
    fn openai_events() {
        let f = Flavour::Openai;
        assert_eq!(
            f.read(None, r#"{"id":"c1","choices":[{"delta":{"role":"assistant","content":""}}]}"#),
            Said::Start { input_tokens: None, id: Some("c1".into()) }
        );
        assert_eq!(f.read(None, r#"{"id":"c1","choices":[{"delta":{"content":"Pa"}}]}"#), Said::Text("Pa".into()));
        assert_eq!(
            f.read(None, r#"{"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#),
            Said::Usage { input_tokens: Some(3), output_tokens: Some(4) }
        );
        assert_eq!(f.read(None, "[DONE]"), Said::Stop);
        assert_eq!(
            f.read(None, r#"{"error":{"message":"x","code":"server_error"}}"#),
            Said::Error("server_error: x".into())
        );
    }
}
