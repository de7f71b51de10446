//! What a worker tells Consul about itself (`--discovery consul`): its service Meta (models with their weights
//! prefix, device class, KV blocks and fragmentation, memory, capacity, version; `zl_node::consul::meta`) and,
//! with each TTL pass, a one-line load summary. The Meta is rewritten only when it changes materially; the
//! fast-changing load travels on the QUIC heartbeat to the orchestrators.

use std::collections::BTreeMap;

use zl_node::consul::Report;
use zl_node::consul::meta::{ModelEntry, WorkerMeta};

use crate::engine::{EngineHandle, EngineStats};

/// One served model, as the report sees it.
#[derive(Clone, Debug)]
pub struct ReportedEngine {
    /// Model id.
    pub id: String,
    /// Hex SHA-256 of its weights.
    pub sha256: String,
    /// Bytes of weights in memory.
    pub weights_bytes: u64,
    /// Its engine.
    pub engine: EngineHandle,
}

/// The worker's report.
#[derive(Debug)]
pub struct WorkerReport {
    /// Served models.
    pub models: Vec<ReportedEngine>,
    /// cpu, hybrid or gpu.
    pub device: String,
    /// Region (empty when the worker names none).
    pub region: String,
    /// Sequences in the running batch at most.
    pub max_running: u32,
    /// The KV budget in bytes (shared equally by the models).
    pub kv_budget_bytes: u64,
    /// How the KV cache stores keys and values (`f16`, `q8`).
    pub kv_dtype: String,
    /// Bytes one token's keys and values take (the largest over the models).
    pub kv_bytes_per_token: u64,
    /// The LoRA adapters it holds.
    pub adapters: std::sync::Arc<crate::adapters::AdapterCache>,
}

/// Totals over the models.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Totals {
    running: usize,
    waiting: usize,
    total: u64,
    free: u64,
    cached: u64,
    fragmentation: f32,
    memory_free: u64,
    /// Device memory in all, on a GPU (the KV budget stands for it on a CPU).
    memory_total: Option<u64>,
}

fn totals(stats: &[EngineStats], budget: u64) -> Totals {
    let mut t = Totals::default();
    let share = budget / stats.len().max(1) as u64;
    let (mut weighted, mut used) = (0f64, 0f64);
    for s in stats {
        t.running += s.running;
        t.waiting += s.waiting;
        if let Some(kv) = s.kv {
            t.total += kv.total as u64;
            t.free += kv.free as u64;
            t.cached += kv.cached as u64;
            weighted += f64::from(kv.fragmentation) * kv.used as f64;
            used += kv.used as f64;
            // Free and cached blocks are both memory a new sequence can have.
            t.memory_free += ((kv.free + kv.cached) as u128 * u128::from(share) / kv.total.max(1) as u128) as u64;
        }
    }
    if used > 0.0 {
        t.fragmentation = (weighted / used).clamp(0.0, 1.0) as f32;
    }
    // On a GPU the Meta carries the device's memory (VRAM), as docs/discovery.md says.
    if let Some((free, total)) = stats.iter().find_map(|s| s.device_memory) {
        t.memory_free = free;
        t.memory_total = Some(total);
    }
    t
}

impl WorkerReport {
    fn stats(&self) -> Vec<EngineStats> {
        self.models.iter().map(|m| m.engine.published(false).stats).collect()
    }

    /// The Meta for these figures.
    fn meta_of(&self, t: Totals) -> WorkerMeta {
        WorkerMeta {
            version: env!("CARGO_PKG_VERSION").into(),
            device: self.device.clone(),
            region: self.region.clone(),
            kv_blocks_total: t.total,
            kv_blocks_free: t.free,
            kv_blocks_cached: t.cached,
            kv_fragmentation: t.fragmentation,
            kv_dtype: self.kv_dtype.clone(),
            kv_bytes_per_token: self.kv_bytes_per_token,
            memory_total_bytes: t.memory_total.unwrap_or(self.kv_budget_bytes),
            memory_free_bytes: t.memory_free,
            max_running: self.max_running,
            models: self
                .models
                .iter()
                .map(|m| ModelEntry { id: m.id.clone(), sha256: m.sha256.clone(), weights_bytes: m.weights_bytes })
                .collect(),
            adapters: self.adapters.resident(),
        }
    }

    /// The Meta now.
    pub fn meta_now(&self) -> WorkerMeta {
        self.meta_of(totals(&self.stats(), self.kv_budget_bytes))
    }

    /// The service tags: the device class, `region=NAME` (if any), and every model id.
    pub fn tags(&self) -> Vec<String> {
        let mut tags = vec![self.device.clone()];
        if !self.region.is_empty() {
            tags.push(format!("region={}", self.region));
        }
        tags.extend(self.models.iter().map(|m| m.id.clone()));
        tags
    }
}

fn note_of(t: Totals) -> String {
    format!(
        "{} running, {} waiting; KV blocks {} free, {} cached of {}; fragmentation {:.2}",
        t.running, t.waiting, t.free, t.cached, t.total, t.fragmentation
    )
}

impl Report for WorkerReport {
    fn note(&self) -> String {
        note_of(totals(&self.stats(), self.kv_budget_bytes))
    }

    fn meta(&self, written: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
        let now = self.meta_now();
        match WorkerMeta::decode(written) {
            Ok(before) if !now.differs_materially(&before) => None,
            _ => Some(now.encode()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::pool::KvStats;

    fn stats(running: usize, used: usize, cached: usize, free: usize, fragmentation: f32) -> EngineStats {
        EngineStats {
            waiting: 1,
            running,
            kv: Some(KvStats {
                total: used + cached + free,
                used,
                cached,
                free,
                prefix_lookups: 0,
                prefix_hits: 0,
                fragmentation,
            }),
            prefill_tokens: 0,
            queued_prefill_blocks: 0,
            device_memory: None,
        }
    }

    #[test]
    fn totals_sum_models_and_weight_fragmentation_by_blocks_in_use() {
        let t = totals(&[stats(2, 30, 10, 60, 0.5), stats(1, 10, 0, 90, 0.1)], 200);
        assert_eq!((t.running, t.waiting, t.total, t.free, t.cached), (3, 2, 200, 150, 10));
        assert!((t.fragmentation - 0.4).abs() < 1e-6);
        // Each model has half the budget: 70% and 90% of 100 bytes are free.
        assert_eq!(t.memory_free, 70 + 90);
        assert_eq!(note_of(t), "3 running, 2 waiting; KV blocks 150 free, 10 cached of 200; fragmentation 0.40");
        assert_eq!(totals(&[], 100), Totals::default());
        // On a GPU the device's memory is reported instead of the KV budget.
        let gpu = EngineStats { device_memory: Some((30 << 30, 80 << 30)), ..stats(1, 10, 0, 90, 0.1) };
        let t = totals(&[gpu], 200);
        assert_eq!((t.memory_free, t.memory_total), (30 << 30, Some(80 << 30)));
    }
}
