//! What both generation APIs' request parsers share: typed field access that words its refusals the way the
//! hosted APIs do (`field: problem`), the text of a `content` value, and number formatting for usage objects.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Most stop sequences and their longest length (the wire's limits).
const MAX_STOP: usize = zl_proto::message::MAX_STOP_SEQUENCES;

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

    pub(crate) fn integer(&self, name: &str, lo: u64, hi: u64) -> Result<Option<u64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                match n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64)) {
                    Some(v) if (lo..=hi).contains(&v) => Ok(Some(v)),
                    Some(v) => Err(ApiError::invalid_param(
                        name,
                        format!("{name}: Input should be between {lo} and {hi}, got {v}"),
                    )),
                    None if n.as_i64().is_some() => Err(ApiError::invalid_param(
                        name,
                        format!("{name}: Input should be greater than or equal to {lo}, got {n}"),
                    )),
                    None => Err(ApiError::invalid_param(name, format!("{name}: Input should be a valid integer"))),
                }
            }
            Some(_) => Err(ApiError::invalid_param(name, format!("{name}: Input should be a valid integer"))),
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
            if s.is_empty() || s.len() > zl_proto::message::MAX_STOP_SEQUENCE_LEN {
                return Err(ApiError::invalid_param(
                    name,
                    format!(
                        "{name}: each stop sequence must be 1 to {} bytes",
                        zl_proto::message::MAX_STOP_SEQUENCE_LEN
                    ),
                ));
            }
        }
        Ok(list)
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
