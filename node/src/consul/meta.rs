//! A worker's Consul service Meta: what a scheduler or an operator needs at a glance (models and their weights,
//! device class, KV figures, memory, capacity, version), encoded within Consul's limits and decoded back.
//!
//! Consul's limits (agent/structs `ValidateServiceMetadata`): at most 64 keys; a key is 1 to 128 bytes of
//! `[A-Za-z0-9_-]` and does not start with `consul-`; a value is at most 512 bytes. The encoding:
//!
//! | key | value |
//! |---|---|
//! | `version`, `device`, `region` | strings (cut to 512 bytes) |
//! | `kv_blocks_total`, `kv_blocks_free`, `kv_blocks_cached` | integers |
//! | `kv_fragmentation` | ratio, three decimals |
//! | `kv_dtype`, `kv_bytes_per_token` | how the KV cache stores keys and values (`f16`, `q8`) and what one token of them takes (absent from older workers) |
//! | `memory_total_bytes`, `memory_free_bytes` | integers: VRAM on a GPU, the KV budget on a CPU |
//! | `max_running` | integer |
//! | `models` | how many models the worker serves |
//! | `models_0`, `models_1`, ... | the models in order, `ID=SHA:BYTES` entries joined by `,` (SHA: the first 12 hex digits of the weights' SHA-256; BYTES: the model's weights in memory, absent when unknown; `%`, `,`, `=` and bytes outside printable ASCII in IDs as `%XX`), as many per value as fit in 512 bytes |
//! | `models_omitted` | models that did not fit (only when some did not) |
//! | `adapters` | the LoRA adapters loaded now (sorted by name), names escaped as model ids and joined by `,`, as many as fit in 512 bytes (absent when none is loaded) |
//! | `adapters_omitted` | loaded adapters that did not fit (only when some did not) |
//!
//! So a worker with any number of models registers: the Meta lists as many as fit (about 680 with short ids) and
//! counts the rest, and the service's tags carry every model id.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Consul's limits on service Meta.
pub const MAX_KEYS: usize = 64;
/// Longest key, bytes.
pub const MAX_KEY_LEN: usize = 128;
/// Longest value, bytes.
pub const MAX_VALUE_LEN: usize = 512;
/// Hex digits of a model's weights SHA-256 kept in Meta.
pub const SHA_PREFIX: usize = 12;

/// The keys a worker's Meta may have besides `models_N`, which share what remains of [`MAX_KEYS`].
const FIXED_KEYS: [&str; 16] = [
    "version",
    "device",
    "region",
    "kv_blocks_total",
    "kv_blocks_free",
    "kv_blocks_cached",
    "kv_fragmentation",
    "kv_dtype",
    "kv_bytes_per_token",
    "memory_total_bytes",
    "memory_free_bytes",
    "max_running",
    "models",
    "models_omitted",
    "adapters",
    "adapters_omitted",
];

/// One served model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelEntry {
    /// Model id, as requests name it.
    pub id: String,
    /// SHA-256 of its weights (hex); Meta keeps the first [`SHA_PREFIX`] digits.
    pub sha256: String,
    /// Bytes its weights take in memory (0: not reported).
    pub weights_bytes: u64,
}

/// What a worker publishes in its Meta.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerMeta {
    /// zerolayer version.
    pub version: String,
    /// Device class: `cpu`, `gpu` or `hybrid`.
    pub device: String,
    /// Region label (may be empty).
    pub region: String,
    /// KV blocks in the pool.
    pub kv_blocks_total: u64,
    /// KV blocks free.
    pub kv_blocks_free: u64,
    /// KV blocks holding reusable prefixes.
    pub kv_blocks_cached: u64,
    /// KV fragmentation ratio, 0 to 1.
    pub kv_fragmentation: f32,
    /// How the KV cache stores keys and values: `f16` or `q8` (empty: not reported).
    pub kv_dtype: String,
    /// Bytes one token's keys and values take across the layers (0: not reported).
    pub kv_bytes_per_token: u64,
    /// Memory for the model and KV: VRAM on a GPU, the KV budget on a CPU, bytes.
    pub memory_total_bytes: u64,
    /// Of which free, bytes.
    pub memory_free_bytes: u64,
    /// Sequences the worker runs at once at most.
    pub max_running: u32,
    /// Served models, in order.
    pub models: Vec<ModelEntry>,
    /// LoRA adapters loaded now (names; those that fit in Meta when decoded).
    pub adapters: Vec<String>,
}

/// A Meta map that breaks one of Consul's limits, or a worker Meta that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("service meta: {0}")]
pub struct MetaError(pub String);

impl WorkerMeta {
    /// The Meta map, within Consul's limits whatever the input (checked by [`check`]).
    pub fn encode(&self) -> BTreeMap<String, String> {
        let mut meta = BTreeMap::new();
        let mut put = |k: &str, v: String| meta.insert(k.to_owned(), v);
        put("version", cut(&self.version));
        put("device", cut(&self.device));
        put("region", cut(&self.region));
        put("kv_blocks_total", self.kv_blocks_total.to_string());
        put("kv_blocks_free", self.kv_blocks_free.to_string());
        put("kv_blocks_cached", self.kv_blocks_cached.to_string());
        put("kv_fragmentation", format!("{:.3}", self.kv_fragmentation.clamp(0.0, 1.0)));
        put("kv_dtype", cut(&self.kv_dtype));
        put("kv_bytes_per_token", self.kv_bytes_per_token.to_string());
        put("memory_total_bytes", self.memory_total_bytes.to_string());
        put("memory_free_bytes", self.memory_free_bytes.to_string());
        put("max_running", self.max_running.to_string());
        put("models", self.models.len().to_string());
        let (mut adapters, mut left_out) = (String::new(), 0usize);
        for name in &self.adapters {
            let name = escape(name);
            let sep = usize::from(!adapters.is_empty());
            if adapters.len() + sep + name.len() > MAX_VALUE_LEN {
                left_out += 1;
                continue;
            }
            if sep == 1 {
                adapters.push(',');
            }
            adapters.push_str(&name);
        }
        if !adapters.is_empty() {
            put("adapters", adapters);
        }
        if left_out > 0 {
            put("adapters_omitted", left_out.to_string());
        }
        let slots = MAX_KEYS - FIXED_KEYS.len();
        let (mut values, mut current, mut omitted) = (Vec::<String>::new(), String::new(), 0usize);
        for model in &self.models {
            let entry = entry(model);
            if entry.len() > MAX_VALUE_LEN {
                omitted += 1;
                continue;
            }
            let sep = usize::from(!current.is_empty());
            if current.len() + sep + entry.len() > MAX_VALUE_LEN {
                if values.len() + 1 == slots {
                    omitted += 1;
                    continue;
                }
                values.push(std::mem::take(&mut current));
            } else if sep == 1 {
                current.push(',');
            }
            current.push_str(&entry);
        }
        if !current.is_empty() {
            values.push(current);
        }
        for (i, v) in values.into_iter().enumerate() {
            meta.insert(format!("models_{i}"), v);
        }
        if omitted > 0 {
            meta.insert("models_omitted".into(), omitted.to_string());
        }
        meta
    }

    /// Read a worker's Meta back (what orchestrators and operators see). Models that did not fit are absent;
    /// `models_omitted` says how many.
    pub fn decode(meta: &BTreeMap<String, String>) -> Result<WorkerMeta, MetaError> {
        let text = |k: &str| meta.get(k).cloned().unwrap_or_default();
        let num = |k: &str| -> Result<u64, MetaError> {
            let v = meta.get(k).ok_or_else(|| MetaError(format!("{k} is missing")))?;
            v.parse().map_err(|_| MetaError(format!("{k} is not an integer: {v:?}")))
        };
        let fragmentation = text("kv_fragmentation");
        let mut models = Vec::new();
        for i in 0.. {
            let Some(v) = meta.get(&format!("models_{i}")) else { break };
            for e in v.split(',') {
                let (id, rest) = e.split_once('=').ok_or_else(|| MetaError(format!("bad model entry {e:?}")))?;
                let (sha, bytes) = rest.split_once(':').unwrap_or((rest, ""));
                let weights_bytes = if bytes.is_empty() {
                    0
                } else {
                    bytes.parse().map_err(|_| MetaError(format!("bad weights size in model entry {e:?}")))?
                };
                models.push(ModelEntry { id: unescape(id)?, sha256: sha.to_owned(), weights_bytes });
            }
        }
        Ok(WorkerMeta {
            version: text("version"),
            device: text("device"),
            region: text("region"),
            kv_blocks_total: num("kv_blocks_total")?,
            kv_blocks_free: num("kv_blocks_free")?,
            kv_blocks_cached: num("kv_blocks_cached")?,
            kv_fragmentation: fragmentation
                .parse()
                .map_err(|_| MetaError(format!("kv_fragmentation is not a number: {fragmentation:?}")))?,
            kv_dtype: text("kv_dtype"),
            kv_bytes_per_token: if meta.contains_key("kv_bytes_per_token") { num("kv_bytes_per_token")? } else { 0 },
            memory_total_bytes: num("memory_total_bytes")?,
            memory_free_bytes: num("memory_free_bytes")?,
            max_running: u32::try_from(num("max_running")?).map_err(|_| MetaError("max_running too large".into()))?,
            models,
            adapters: match meta.get("adapters") {
                Some(v) => v.split(',').map(unescape).collect::<Result<_, _>>()?,
                None => Vec::new(),
            },
        })
    }

    /// Whether `self` differs from what was last written (`before`) enough to write the catalog again: any
    /// change of identity, models or capacity, or the free or cached KV blocks, the free memory or the
    /// fragmentation moving by a tenth of their range or more. The fast-changing load travels on the heartbeat
    /// to the orchestrators instead (catalog writes are Raft writes in Consul).
    pub fn differs_materially(&self, before: &WorkerMeta) -> bool {
        let moved = |a: u64, b: u64| a.abs_diff(b).saturating_mul(10) >= self.kv_blocks_total.max(1);
        self.version != before.version
            || self.device != before.device
            || self.region != before.region
            || self.models != before.models
            || self.adapters != before.adapters
            || self.kv_blocks_total != before.kv_blocks_total
            || self.kv_dtype != before.kv_dtype
            || self.kv_bytes_per_token != before.kv_bytes_per_token
            || self.memory_total_bytes != before.memory_total_bytes
            || self.max_running != before.max_running
            || moved(self.kv_blocks_free, before.kv_blocks_free)
            || moved(self.kv_blocks_cached, before.kv_blocks_cached)
            || self.memory_free_bytes.abs_diff(before.memory_free_bytes).saturating_mul(10)
                >= self.memory_total_bytes.max(1)
            || (self.kv_fragmentation - before.kv_fragmentation).abs() >= 0.1
    }
}

/// Check a Meta map against Consul's limits.
pub fn check(meta: &BTreeMap<String, String>) -> Result<(), MetaError> {
    if meta.len() > MAX_KEYS {
        return Err(MetaError(format!("{} keys, at most {MAX_KEYS}", meta.len())));
    }
    for (k, v) in meta {
        let valid = !k.is_empty()
            && k.len() <= MAX_KEY_LEN
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            && !k.starts_with("consul-");
        if !valid {
            return Err(MetaError(format!("invalid key {k:?}")));
        }
        if v.len() > MAX_VALUE_LEN {
            return Err(MetaError(format!("the value of {k} has {} bytes, at most {MAX_VALUE_LEN}", v.len())));
        }
    }
    Ok(())
}

/// `ID=SHA:BYTES` (`ID=SHA` when the size is unknown) with the id escaped.
fn entry(model: &ModelEntry) -> String {
    let mut out = escape(&model.id);
    out.push('=');
    out.extend(model.sha256.chars().filter(char::is_ascii_hexdigit).take(SHA_PREFIX));
    if model.weights_bytes > 0 {
        let _ = write!(out, ":{}", model.weights_bytes);
    }
    out
}

/// An id with `%`, `,`, `=` and bytes outside printable ASCII as `%XX`.
fn escape(id: &str) -> String {
    let mut out = String::with_capacity(id.len() + 1 + SHA_PREFIX);
    for b in id.bytes() {
        if (b.is_ascii_graphic() || b == b' ') && !matches!(b, b'%' | b',' | b'=') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn unescape(id: &str) -> Result<String, MetaError> {
    let (bytes, mut out) = (id.as_bytes(), Vec::with_capacity(id.len()));
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = id.get(i + 1..i + 3).ok_or_else(|| MetaError(format!("bad escape in {id:?}")))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| MetaError(format!("bad escape in {id:?}")))?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| MetaError(format!("model id {id:?} is not UTF-8")))
}

/// `s` cut to [`MAX_VALUE_LEN`] bytes at a character boundary.
fn cut(s: &str) -> String {
    let mut end = s.len().min(MAX_VALUE_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn worker(models: usize, id_len: usize) -> WorkerMeta {
        WorkerMeta {
            version: "0.1.0".into(),
            device: "cpu".into(),
            region: "eu-west".into(),
            kv_blocks_total: 1000,
            kv_blocks_free: 600,
            kv_blocks_cached: 100,
            kv_fragmentation: 0.25,
            kv_dtype: "q8".into(),
            kv_bytes_per_token: 12_240,
            memory_total_bytes: 512 << 20,
            memory_free_bytes: 300 << 20,
            max_running: 32,
            models: (0..models)
                .map(|i| ModelEntry {
                    id: format!("{i:0>id_len$}"),
                    sha256: format!("{:064x}", i * 7919),
                    weights_bytes: i as u64 * 1_000_003,
                })
                .collect(),
            adapters: vec!["support-bot".into(), "a,b".into()],
        }
    }

    #[test]
    fn a_worker_with_seventy_models_registers_within_the_limits_and_reads_back() {
        let w = worker(70, 24);
        let meta = w.encode();
        check(&meta).unwrap();
        assert_eq!(meta["models"], "70");
        assert!(!meta.contains_key("models_omitted"));
        let back = WorkerMeta::decode(&meta).unwrap();
        assert_eq!(back.models.len(), 70);
        for (a, b) in back.models.iter().zip(&w.models) {
            assert_eq!((a.id.as_str(), a.sha256.as_str()), (b.id.as_str(), &b.sha256[..SHA_PREFIX]));
            assert_eq!(a.weights_bytes, b.weights_bytes);
        }
        assert_eq!((back.kv_blocks_free, back.max_running, back.kv_fragmentation), (600, 32, 0.25));
        assert_eq!((back.kv_dtype.as_str(), back.kv_bytes_per_token), ("q8", 12_240));
        assert_eq!((meta["adapters"].as_str(), back.adapters), ("support-bot,a%2Cb", w.adapters));
        let none = WorkerMeta { adapters: vec![], ..w };
        assert!(
            !none.encode().contains_key("adapters") && WorkerMeta::decode(&none.encode()).unwrap().adapters.is_empty()
        );
    }

    #[test]
    fn models_that_do_not_fit_are_counted_never_over_the_limits() {
        // 5,000 models with 200-byte ids: far more than 48 values of 512 bytes hold; and 100 adapters of 40 bytes.
        let mut w = worker(5000, 200);
        w.adapters = (0..100).map(|i| format!("{i:0>40}")).collect();
        let meta = w.encode();
        check(&meta).unwrap();
        assert_eq!(meta.len(), MAX_KEYS);
        let back = WorkerMeta::decode(&meta).unwrap();
        assert_eq!(back.models.len() + meta["models_omitted"].parse::<usize>().unwrap(), 5000);
        assert_eq!((back.adapters.len(), meta["adapters_omitted"].as_str()), (12, "88"));
        assert_eq!(back.adapters[..], w.adapters[..12]);
        // An id too long for any value on its own is counted too.
        let mut w = worker(1, 4);
        w.models.push(ModelEntry { id: "x".repeat(600), sha256: "ab".into(), weights_bytes: 0 });
        let meta = w.encode();
        check(&meta).unwrap();
        assert_eq!((meta["models"].as_str(), meta["models_omitted"].as_str()), ("2", "1"));
    }

    #[test]
    fn ids_with_separators_and_unicode_survive_and_long_strings_are_cut() {
        let mut w = worker(0, 0);
        w.models = vec![
            ModelEntry { id: "org/a,b=c%d".into(), sha256: "0123456789abcdef".into(), weights_bytes: 256_900_000 },
            ModelEntry { id: "modèle-ünï".into(), sha256: "ff".into(), weights_bytes: 0 },
        ];
        w.region = "é".repeat(400); // 800 bytes
        let meta = w.encode();
        check(&meta).unwrap();
        assert_eq!(meta["models_0"], "org/a%2Cb%3Dc%25d=0123456789ab:256900000,mod%C3%A8le-%C3%BCn%C3%AF=ff");
        let back = WorkerMeta::decode(&meta).unwrap();
        assert_eq!((back.models[0].id.as_str(), back.models[0].weights_bytes), ("org/a,b=c%d", 256_900_000));
        assert_eq!((back.models[1].id.as_str(), back.models[1].weights_bytes), ("modèle-ünï", 0));
        // A size that is not a number is an error, not a zero.
        let mut bad = meta.clone();
        bad.insert("models_0".into(), "a=ff:12x".into());
        assert!(WorkerMeta::decode(&bad).is_err());
        assert_eq!(back.region.len(), 512);
    }

    #[test]
    fn check_rejects_what_consul_rejects() {
        let ok = |k: &str, v: &str| check(&BTreeMap::from([(k.to_owned(), v.to_owned())]));
        assert!(ok("a-b_C9", &"v".repeat(512)).is_ok());
        assert!(ok("consul-x", "v").is_err());
        assert!(ok("a.b", "v").is_err());
        assert!(ok("", "v").is_err());
        assert!(ok(&"k".repeat(129), "v").is_err());
        assert!(ok("k", &"v".repeat(513)).is_err());
        let many: BTreeMap<_, _> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(check(&many).is_err());
    }

    #[test]
    fn only_material_changes_ask_for_a_catalog_write() {
        let before = worker(2, 8);
        let mut now = before.clone();
        now.kv_blocks_free -= 50; // 5 % of the pool
        now.kv_fragmentation += 0.05;
        assert!(!now.differs_materially(&before));
        now.kv_blocks_free -= 60; // 11 % in all
        assert!(now.differs_materially(&before));
        let mut now = before.clone();
        now.models.pop();
        assert!(now.differs_materially(&before));
        let mut now = before.clone();
        now.adapters.reverse();
        assert!(now.differs_materially(&before), "an adapter loaded or evicted");
        let mut now = before.clone();
        now.kv_fragmentation = 0.4;
        assert!(now.differs_materially(&before));
    }

    #[test]
    fn bad_meta_is_an_error_not_a_panic() {
        let mut meta = worker(1, 4).encode();
        meta.insert("models_0".into(), "no-separator".into());
        assert!(WorkerMeta::decode(&meta).is_err());
        meta.insert("models_0".into(), "a%G1=00".into());
        assert!(WorkerMeta::decode(&meta).is_err());
        meta.insert("models_0".into(), "a%2=00".into());
        assert!(WorkerMeta::decode(&meta).is_err());
        meta.remove("kv_blocks_total");
        assert!(WorkerMeta::decode(&meta).is_err());
    }
}
