//! The LoRA adapters a worker holds: each loaded on a request's first use from the path the registry gives (inside
//! `--adapter-root`, its weights file's SHA-256 checked against the registry's), at most `--max-adapters`
//! resident within `--adapter-memory-mb`. To make room the least recently used idle adapter goes; one that running sequences use (they hold
//! its `Arc`) never does, so the cache may stay above its cap until they finish.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use zl_common::sync::lock;
use zl_wire::message::{AdapterRef, ErrorCode, WireError};

use crate::engine::RequestAdapter;
use crate::model::llama::LlamaConfig;
use crate::model::lora::LoraAdapter;
use crate::model::lora_load::{self, Base};

/// Where adapters may be read from and how many stay loaded.
#[derive(Clone, Debug, Default)]
pub struct AdapterSettings {
    /// The directory adapter paths must lie in (after resolving links); `None`: adapters are refused.
    pub root: Option<PathBuf>,
    /// Adapters resident at most (idle ones beyond it are evicted, least recently used first).
    pub max: usize,
    /// Bytes their updates may take at most (likewise; 0: no limit).
    pub max_bytes: usize,
}

struct Entry {
    model: String,
    name: String,
    sha256: [u8; 32],
    adapter: Arc<LoraAdapter>,
    last_used: u64,
}

/// The resident adapters of a worker's models.
pub struct AdapterCache {
    settings: AdapterSettings,
    entries: Mutex<(Vec<Entry>, u64)>,
}

impl std::fmt::Debug for AdapterCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdapterCache").field("settings", &self.settings).finish_non_exhaustive()
    }
}

/// The base an adapter is loaded for: a served model's id, shape and architecture.
#[derive(Clone, Copy, Debug)]
pub struct ForModel<'a> {
    /// The served model's id.
    pub id: &'a str,
    /// Its shape.
    pub config: &'a LlamaConfig,
    /// Its architecture.
    pub family: &'a str,
}

fn refused(message: String) -> WireError {
    WireError::new(ErrorCode::InvalidRequest, message)
}

impl AdapterCache {
    /// An empty cache.
    pub fn new(settings: AdapterSettings) -> Self {
        metrics::gauge!("zl_worker_adapters_max").set(settings.max as f64);
        AdapterCache { settings, entries: Mutex::new((Vec::new(), 0)) }
    }

    /// Registered names of the resident adapters, sorted (for load reports).
    pub fn resident(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.entries).0.iter().map(|e| e.name.clone()).collect();
        names.sort();
        names.dedup();
        names
    }

    /// The adapter `r` names for `model`: resident, or loaded now (off the async threads) and kept.
    pub async fn get(self: &Arc<Self>, model: ForModel<'_>, r: &AdapterRef) -> Result<RequestAdapter, WireError> {
        let key = zl_common::block_hash::adapter_key(&r.sha256);
        if let Some(adapter) = self.lookup(model.id, r) {
            metrics::counter!("zl_worker_adapter_requests_total", "result" => "resident").increment(1);
            return Ok(RequestAdapter { adapter, key });
        }
        let path = self.resolve(&r.path)?;
        let (config, family, sha256) = (model.config.clone(), model.family.to_owned(), r.sha256);
        let started = Instant::now();
        let loaded = tokio::task::spawn_blocking(move || load_checked(&path, &config, &family, &sha256))
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("adapter loading failed: {e}")))?;
        let adapter = match loaded {
            Ok(a) => Arc::new(a),
            Err(e) => {
                metrics::counter!("zl_worker_adapter_loads_total", "result" => "refused").increment(1);
                tracing::warn!(adapter = r.name, error = %e.message, "adapter refused");
                return Err(e);
            }
        };
        metrics::counter!("zl_worker_adapter_loads_total", "result" => "loaded").increment(1);
        metrics::histogram!("zl_worker_adapter_load_seconds").record(started.elapsed().as_secs_f64());
        tracing::info!(
            adapter = r.name,
            model = model.id,
            rank = adapter.rank(),
            mib = adapter.memory_bytes() as f64 / 1048576.0,
            seconds = started.elapsed().as_secs_f64(),
            "adapter loaded"
        );
        let adapter = self.insert(model.id, r, adapter);
        metrics::counter!("zl_worker_adapter_requests_total", "result" => "loaded").increment(1);
        Ok(RequestAdapter { adapter, key })
    }

    fn lookup(&self, model: &str, r: &AdapterRef) -> Option<Arc<LoraAdapter>> {
        let mut guard = lock(&self.entries);
        let (entries, clock) = &mut *guard;
        *clock += 1;
        let e = entries.iter_mut().find(|e| e.model == model && e.name == r.name && e.sha256 == r.sha256)?;
        e.last_used = *clock;
        Some(e.adapter.clone())
    }

    /// Keep `adapter` (or the copy another request loaded meanwhile), then evict idle ones above the cap.
    fn insert(&self, model: &str, r: &AdapterRef, adapter: Arc<LoraAdapter>) -> Arc<LoraAdapter> {
        let mut guard = lock(&self.entries);
        let (entries, clock) = &mut *guard;
        *clock += 1;
        if let Some(e) = entries.iter_mut().find(|e| e.model == model && e.name == r.name && e.sha256 == r.sha256) {
            e.last_used = *clock;
            return e.adapter.clone();
        }
        // A new version of a name replaces the old one once idle (its running sequences keep theirs).
        entries.retain(|e| !(e.model == model && e.name == r.name && Arc::strong_count(&e.adapter) == 1));
        entries.push(Entry {
            model: model.to_owned(),
            name: r.name.clone(),
            sha256: r.sha256,
            adapter: adapter.clone(),
            last_used: *clock,
        });
        let over = |entries: &[Entry]| {
            let bytes: usize = entries.iter().map(|e| e.adapter.memory_bytes()).sum();
            entries.len() > self.settings.max.max(1) || (self.settings.max_bytes > 0 && bytes > self.settings.max_bytes)
        };
        while over(entries) {
            // Only the cache holds an idle adapter (the caller's copy is `adapter`, excluded as the newest).
            let idle = entries
                .iter()
                .enumerate()
                .filter(|(_, e)| !Arc::ptr_eq(&e.adapter, &adapter) && Arc::strong_count(&e.adapter) == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i);
            let Some(i) = idle else { break };
            let gone = entries.remove(i);
            metrics::counter!("zl_worker_adapter_evictions_total").increment(1);
            tracing::info!(adapter = gone.name, model = gone.model, "adapter evicted (least recently used)");
        }
        metrics::gauge!("zl_worker_adapters_resident").set(entries.len() as f64);
        let bytes: usize = entries.iter().map(|e| e.adapter.memory_bytes()).sum();
        metrics::gauge!("zl_worker_adapter_bytes").set(bytes as f64);
        adapter
    }

    /// The path, if it lies inside the adapter root.
    fn resolve(&self, path: &str) -> Result<PathBuf, WireError> {
        let Some(root) = &self.settings.root else {
            return Err(refused("this worker serves no adapters (start it with --adapter-root DIR)".into()));
        };
        let full = Path::new(path);
        let full = if full.is_absolute() { full.to_path_buf() } else { root.join(full) };
        let missing = |e: std::io::Error| WireError::new(ErrorCode::NotFound, format!("adapter {path}: {e}"));
        let (real, real_root) = (full.canonicalize().map_err(missing)?, root.canonicalize().map_err(missing)?);
        if !real.starts_with(&real_root) {
            return Err(refused(format!("adapter path {path} is outside the adapter root {}", root.display())));
        }
        Ok(real)
    }
}

/// The weights file an adapter path names: a PEFT directory's `adapter_model.safetensors`, or the file itself.
fn weights_file(path: &Path) -> PathBuf {
    if path.is_dir() { path.join("adapter_model.safetensors") } else { path.to_path_buf() }
}

/// Check the weights file's SHA-256, then load the adapter for the base.
fn load_checked(path: &Path, config: &LlamaConfig, family: &str, sha256: &[u8; 32]) -> Result<LoraAdapter, WireError> {
    let file = weights_file(path);
    let got = crate::fetch::sha256_files(std::slice::from_ref(&file))
        .map_err(|e| WireError::new(ErrorCode::NotFound, format!("adapter {}: {e}", file.display())))?;
    if &got != sha256 {
        return Err(refused(format!(
            "adapter {}: SHA-256 {} is not the registered {}",
            file.display(),
            zl_common::keys::hex(&got),
            zl_common::keys::hex(sha256)
        )));
    }
    lora_load::load(path, Base { config, family })
        .map(|l| l.adapter)
        .map_err(|e| refused(format!("adapter {}: {e}", path.display())))
}
