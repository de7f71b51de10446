//! What both generation APIs' request parsers share: typed field access that words its refusals the way the
//! hosted APIs do (`field: problem`), the text of a `content` value, and number formatting for usage objects.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Most stop sequences and their longest length (the wire's limits).
const MAX_STOP: usize = zl_wire::message::MAX_STOP_SEQUENCES;

/// Field access with Anthropic-style messages (`field: problem`).
pub(crate) struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub(crate) fn of(body: &'a Value) -> Result<Self, ApiError> {
        body.as_object()
            .map(|obj| Fields { obj })
            .ok_or_else(|| ApiError::invalid("the request body must be a JSON object"))
    }

    pub(crate) fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.get(name).filter(|v| !v.is_null())
    }

    pub(crate) fn string(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::invalid_param(name, format!("{name}: Input should be a valid string"))),
        }
    }

    pub(crate) fn required_string(&self, name: &str) -> Result<&'a str, ApiError> {
        self.string(name)?.ok_or_else(|| ApiError::invalid_param(name, format!("{name}: Field required")))
    }

    pub(crate) fn number(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let v = n.as_f64().unwrap_or(f64::NAN);
                if !(lo..=hi).contains(&v) {
                    return Err(ApiError::invalid_param(
                        name,
                        format!("{name}: Input should be between {lo} and {hi}, got {v}"),
                    ));
                }
                Ok(Some(v))
            }
            Some(_) => Err(ApiError::invalid_param(name, format!("{name}: Input should be a valid number"))),
        }
    }

    /// An integer in `lo..=hi`. Integral floats (`5.0`) count; anything out of range, negative, fractional or
    /// past what a u64 holds is refused with the value as the client sent it, never clamped.
    pub(crate) fn integer(&self, name: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        let Some(value) = self.get(name) else { return Ok(None) };
        let Value::Number(n) = value else {
            return Err(ApiError::invalid_param(name, format!("{name}: Input should be a valid integer")));
        };
        let out_of_range = || {
            ApiError::invalid_param(name, format!("{name}: Input should be between {lo} and {hi}, got {}", as_sent(n)))
        };
        if let Some(v) = n.as_u64() {
            return if (lo..=hi).contains(&v) { Ok(Some(v)) } else { Err(out_of_range()) };
        }
        if n.as_i64().is_some() {
            return Err(ApiError::invalid_param(
                name,
                format!("{name}: Input should be greater than or equal to {lo}, got {n}"),
            ));
        }
        match n.as_f64() {
            Some(f) if f.fract() != 0.0 || !f.is_finite() => Err(ApiError::invalid_param(
                name,
                format!("{name}: Input should be a valid integer, got {}", as_sent(n)),
            )),
            Some(f) if f < 0.0 => Err(ApiError::invalid_param(
                name,
                format!("{name}: Input should be greater than or equal to {lo}, got {}", as_sent(n)),
            )),
            // 2^64 and up do not fit a u64 (`as` would saturate to 2^64 - 1: a different value).
            Some(f) if f < U64_LIMIT => {
                let v = f as u64;
                if (lo..=hi).contains(&v) { Ok(Some(v)) } else { Err(out_of_range()) }
            }
            _ => Err(out_of_range()),
        }
    }

    pub(crate) fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(ApiError::invalid_param(name, format!("{name}: Input should be a valid boolean"))),
        }
    }

    pub(crate) fn stop_list(&self, name: &str, allow_string: bool) -> Result<Vec<String>, ApiError> {
        let list = match self.get(name) {
            None => return Ok(vec![]),
            Some(Value::String(s)) if allow_string => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::invalid_param(name, format!("{name}: every item must be a string")))?,
            Some(_) => return Err(ApiError::invalid_param(name, format!("{name}: Input should be a valid list"))),
        };
        if list.len() > MAX_STOP {
            return Err(ApiError::invalid_param(name, format!("{name}: at most {MAX_STOP} stop sequences")));
        }
        for s in &list {
            if s.is_empty() || s.len() > zl_wire::message::MAX_STOP_SEQUENCE_LEN {
                return Err(ApiError::invalid_param(
                    name,
                    format!(
                        "{name}: each stop sequence must be 1 to {} bytes",
                        zl_wire::message::MAX_STOP_SEQUENCE_LEN
                    ),
                ));
            }
        }
        Ok(list)
    }
}

/// OpenAI's logit adjustments (`frequency_penalty`, `presence_penalty`, `logit_bias`) and vLLM's `min_p`, applied by
/// the workers; `None` when all are neutral. vLLM's `repetition_penalty` is refused by name unless 1: its
/// semantics (over the prompt's tokens too) are not served.
pub(crate) fn penalties(f: &Fields<'_>) -> Result<Option<zl_wire::message::Penalties>, ApiError> {
    let frequency = f.number("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    let presence = f.number("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0) as f32;
    let min_p = f.number("min_p", 0.0, 1.0)?.unwrap_or(0.0) as f32;
    if f.number("repetition_penalty", 0.0, 10.0)?.is_some_and(|r| r != 1.0) {
        return Err(ApiError::invalid_param(
            "repetition_penalty",
            "repetition_penalty: not supported by this server (use frequency_penalty or presence_penalty)",
        ));
    }
    let bad = |m: String| ApiError::invalid_param("logit_bias", format!("logit_bias: {m}"));
    let mut logit_bias = Vec::new();
    match f.get("logit_bias") {
        None => {}
        Some(Value::Object(map)) => {
            if map.len() > zl_wire::message::MAX_LOGIT_BIAS {
                return Err(bad(format!("at most {} entries", zl_wire::message::MAX_LOGIT_BIAS)));
            }
            for (k, v) in map {
                let id: u32 = k.parse().map_err(|_| bad(format!("{k:?} is not a token id")))?;
                let bias = v
                    .as_f64()
                    .filter(|b| (-100.0..=100.0).contains(b))
                    .ok_or_else(|| bad(format!("the bias of {k} must be a number from -100 to 100")))?;
                logit_bias.push((id, bias as f32));
            }
            logit_bias.sort_by_key(|b| b.0);
        }
        Some(_) => return Err(bad("expected an object of token ids to biases".into())),
    }
    let p = zl_wire::message::Penalties { frequency, presence, min_p, logit_bias };
    Ok((!p.is_neutral()).then_some(p))
}

/// 2^64 as an f64: the first integral float a u64 cannot hold.
const U64_LIMIT: f64 = 18_446_744_073_709_551_616.0;

/// A JSON number as the client wrote it, as near as a parsed number allows: integers in full (`18446744073709551616`,
/// not `1.8446744073709552e19`), other floats in their shortest form (`1e30`, `2.5`).
fn as_sent(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e21 => format!("{f:.0}"),
        _ => n.to_string().replace("e+", "e"),
    }
}

/// Why a `content` value is not plain text.
pub(crate) enum PartProblem<'a> {
    /// Neither a string nor an array.
    NotTextOrList,
    /// Item `i` has no `type` string.
    NoType(usize),
    /// Item `i` is of a type other than `text`.
    Type(usize, &'a str),
    /// Item `i` is a `text` item without a `text` string.
    NoText(usize),
}

/// The text of a `content` value as both APIs shape it: a string, or an array of `{"type": "text", "text": ...}`
/// items, concatenated. Each API words the problems its own way.
pub(crate) fn text_parts(value: &Value) -> Result<String, PartProblem<'_>> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) => {
            let mut text = String::new();
            for (i, item) in items.iter().enumerate() {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        text.push_str(item.get("text").and_then(Value::as_str).ok_or(PartProblem::NoText(i))?)
                    }
                    Some(other) => return Err(PartProblem::Type(i, other)),
                    None => return Err(PartProblem::NoType(i)),
                }
            }
            Ok(text)
        }
        _ => Err(PartProblem::NotTextOrList),
    }
}

/// A float rounded to 4 decimals, so JSON shows 0.1234, not 0.12340000271797180.
pub(crate) fn round4(x: f32) -> f64 {
    (f64::from(x) * 1e4).round() / 1e4
}
