//! OpenAI's Embeddings API, `POST /v1/embeddings`: the request's inputs (a string, a list of strings, a token
//! array or a list of them) and the `list` of `embedding` objects answered, each vector as floats or as base64
//! little-endian f32 (`encoding_format`), cut to `dimensions` and re-normalised (Matryoshka truncation).

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::request::Fields;
use zl_wire::message::MAX_EMBED_INPUTS;

/// One input, as the client sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum EmbedInput {
    /// Text, tokenized as the model's card says (with the special tokens its tokenizer puts around a document).
    Text(String),
    /// Token ids, embedded as they are.
    Tokens(Vec<u32>),
}

/// How the vectors are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// JSON numbers.
    Float,
    /// Base64 of the little-endian f32 bytes (what the OpenAI SDK asks for by default, and decodes).
    Base64,
}

/// A parsed embeddings request.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedJob {
    /// The model as the client named it.
    pub model: String,
    /// The inputs, in order.
    pub inputs: Vec<EmbedInput>,
    /// How to write the vectors.
    pub encoding: Encoding,
    /// Keep this many leading values of each vector (then scale it to unit length again).
    pub dimensions: Option<usize>,
    /// End-user id, for session affinity.
    pub user: Option<String>,
}

impl EmbedJob {
    /// The text every input holds, one after another (what the billing signals read; token inputs have none).
    pub fn text(&self) -> String {
        let texts = self.inputs.iter().filter_map(|i| match i {
            EmbedInput::Text(t) => Some(t.as_str()),
            EmbedInput::Tokens(_) => None,
        });
        texts.collect::<Vec<_>>().join("\n")
    }
}

/// Parse an embeddings request body.
pub fn parse(body: &Value) -> Result<EmbedJob, ApiError> {
    let f = Fields::of(body)?;
    let model = f.required_string("model")?.to_owned();
    let bad = |m: String| ApiError::invalid_param("input", format!("input: {m}"));
    let tokens = |items: &[Value]| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .map(|v| v.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| bad("a token array holds non-negative integer token ids".into()))
    };
    let inputs = match f.get("input") {
        None | Some(Value::Null) => return Err(bad("Field required".into())),
        Some(Value::String(s)) => vec![EmbedInput::Text(s.clone())],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("must not be empty".into())),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => vec![EmbedInput::Tokens(tokens(items)?)],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(EmbedInput::Text(s.clone())),
                Value::Array(t) => Ok(EmbedInput::Tokens(tokens(t)?)),
                _ => Err(bad("expected a string, a list of strings, a token array or a list of token arrays".into())),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(bad("expected a string, a list of strings, a token array or a list of token arrays".into()));
        }
    };
    if inputs.len() > MAX_EMBED_INPUTS {
        return Err(bad(format!("{} inputs; at most {MAX_EMBED_INPUTS} in one request", inputs.len())));
    }
    let empty = |i: &EmbedInput| match i {
        EmbedInput::Text(t) => t.is_empty(),
        EmbedInput::Tokens(t) => t.is_empty(),
    };
    if let Some(i) = inputs.iter().position(empty) {
        return Err(bad(format!("input {i} is empty")));
    }
    let encoding = match f.string("encoding_format")? {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::invalid_param(
                "encoding_format",
                format!("encoding_format: {other:?} is not one of \"float\" and \"base64\""),
            ));
        }
    };
    let dimensions = f.integer("dimensions", 1, u64::from(zl_wire::message::MAX_EMBED_DIMS))?.map(|d| d as usize);
    let user = f.string("user")?.filter(|u| !u.is_empty()).map(str::to_owned);
    Ok(EmbedJob { model, inputs, encoding, dimensions, user })
}

/// `v` cut to its first `dims` values and scaled to unit length again (Matryoshka truncation).
pub fn truncate(v: &[f32], dims: usize) -> Vec<f32> {
    let mut out = v[..dims.min(v.len())].to_vec();
    let norm = out.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        out.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
    out
}

/// Base64 (standard alphabet, padded) of `bytes`.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            out.push(if i <= chunk.len() { ALPHABET[(n >> shift) as usize & 63] as char } else { '=' });
        }
    }
    out
}

/// One vector as `encoding` writes it.
fn encode(v: &[f32], encoding: Encoding) -> Value {
    match encoding {
        Encoding::Float => json!(v),
        Encoding::Base64 => {
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64(&bytes))
        }
    }
}

/// The response body: the `list` of `embedding` objects, in input order, and the usage.
pub fn render(job: &EmbedJob, model: &str, vectors: &[Vec<f32>], input_tokens: u32) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let v = match job.dimensions {
                Some(d) if d < v.len() => truncate(v, d),
                _ => v.clone(),
            };
            json!({"object": "embedding", "index": i, "embedding": encode(&v, job.encoding)})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": input_tokens, "total_tokens": input_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_shape_parses_and_bad_ones_are_refused_by_field() {
        let p = |v: Value| parse(&v);
        assert_eq!(p(json!({"model": "m", "input": "hi"})).unwrap().inputs, [EmbedInput::Text("hi".into())]);
        assert_eq!(p(json!({"model": "m", "input": [1, 2]})).unwrap().inputs, [EmbedInput::Tokens(vec![1, 2])]);
        let mixed = p(json!({"model": "m", "input": ["a", [3], "b"], "encoding_format": "base64", "dimensions": 8}));
        let mixed = mixed.unwrap();
        assert_eq!(mixed.inputs.len(), 3);
        assert_eq!((mixed.encoding, mixed.dimensions), (Encoding::Base64, Some(8)));
        assert_eq!(mixed.text(), "a\nb");
        for (body, param) in [
            (json!({"model": "m"}), "input"),
            (json!({"model": "m", "input": []}), "input"),
            (json!({"model": "m", "input": ""}), "input"),
            (json!({"model": "m", "input": ["a", ""]}), "input"),
            (json!({"model": "m", "input": [1, -2]}), "input"),
            (json!({"model": "m", "input": {"text": "a"}}), "input"),
            (json!({"model": "m", "input": vec!["a"; MAX_EMBED_INPUTS + 1]}), "input"),
            (json!({"model": "m", "input": "a", "encoding_format": "int8"}), "encoding_format"),
            (json!({"model": "m", "input": "a", "dimensions": 0}), "dimensions"),
            (json!({"input": "a"}), "model"),
        ] {
            let e = p(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
        }
    }

    #[test]
    fn truncation_keeps_the_leading_values_at_unit_length() {
        assert_eq!(truncate(&[0.6, 0.0, 0.8], 1), [1.0]);
        let t = truncate(&[0.5, 0.5, 0.5, 0.5], 2);
        assert!((t[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-7 && t.len() == 2);
    }

    #[test]
    fn base64_is_the_standard_padded_alphabet_over_little_endian_floats() {
        assert_eq!(base64(b"Man"), "TWFu");
        assert_eq!(base64(b"Ma"), "TWE=");
        assert_eq!(base64(b"M"), "TQ==");
        assert_eq!(base64(b""), "");
        // 1.0f32 is 00 00 80 3f.
        assert_eq!(encode(&[1.0], Encoding::Base64), json!("AACAPw=="));
    }

    #[test]
    fn the_body_lists_vectors_in_order_with_usage() {
        let job = parse(&json!({"model": "m", "input": ["a", "b"], "dimensions": 1})).unwrap();
        let body = render(&job, "m", &[vec![0.6, 0.8], vec![0.0, 1.0]], 7);
        assert_eq!(body["data"][0]["embedding"], json!([1.0]));
        assert_eq!(body["data"][1]["index"], 1);
        assert_eq!(body["usage"], json!({"prompt_tokens": 7, "total_tokens": 7}));
        assert_eq!(body["object"], "list");
    }
}
