//! The JSON workload of `zl-worker bench`: prompts that ask for a city described as JSON, the schema constrained
//! runs must match, and the grammar engine's cost: each constrained answer replayed token by token, timing every
//! mask.

use std::time::{Duration, Instant};

use anyhow::Result;

/// The schema of the constrained runs.
fn schema() -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "country": {"type": "string"},
            "population": {"type": "integer", "minimum": 0},
            "capital": {"type": "boolean"},
            "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 5}
        },
        "required": ["name", "country", "population", "capital", "landmarks"],
        "additionalProperties": false
    })
}

/// The grammar of the constrained runs.
pub(crate) fn schema_grammar() -> Result<String> {
    Ok(zl_grammar::json_schema(&schema())?)
}

/// Request `i` of level `no` (unique, so the prefix cache never serves one from another).
pub(crate) fn prompt(no: usize, i: usize) -> String {
    let cities = ["Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Cairo", "Delhi", "Quito"];
    format!(
        "Request {no}-{i}. Describe {} as a JSON object with name, country, population, capital and landmarks.",
        cities[i % cities.len()]
    )
}

/// Replay each constrained answer through a fresh grammar state, timing every mask; print p50 and p99.
pub(crate) fn mask_times(engine: &zl_grammar::Engine, outputs: &[Vec<u32>]) -> Result<()> {
    let grammar = schema_grammar()?;
    let mut times: Vec<Duration> = Vec::new();
    for tokens in outputs {
        let mut c = engine.start(&grammar)?;
        for &t in tokens {
            let started = Instant::now();
            let mask = c.mask()?;
            times.push(started.elapsed());
            if !mask.allows(t) {
                break;
            }
            c.advance(t)?;
        }
    }
    times.sort();
    let at = |p: f64| times.get(((times.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or_default();
    println!(
        "grammar masks: {} timed over {} answers; p50 {:.1} us, p99 {:.1} us per token",
        times.len(),
        outputs.len(),
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6
    );
    Ok(())
}
