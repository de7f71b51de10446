//! `zl-worker bench --adapters N`: synthetic LoRA adapters for the mixed-batch measurement (seeded random
//! updates of every projection at rank 16, alpha 32: what a served fine-tune costs, whatever its values).

use std::sync::Arc;

use anyhow::{Result, anyhow};
use zl_worker::engine::RequestAdapter;
use zl_worker::model::llama::LlamaConfig;
use zl_worker::model::lora::{LoraAdapter, LoraPair, Target};

/// Rank of the synthetic adapters.
const RANK: usize = 16;

/// `n` adapters for a model of `cfg`'s shape.
pub(super) fn synthetic(cfg: &LlamaConfig, n: usize) -> Result<Vec<RequestAdapter>> {
    (0..n)
        .map(|i| {
            let mut seed = 0x6c6f_7261_0000 + i as u64;
            let mut values = |len: usize| -> Vec<f32> {
                (0..len)
                    .map(|_| {
                        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * 0.1
                    })
                    .collect()
            };
            let mut layers = Vec::with_capacity(cfg.layers);
            for _ in 0..cfg.layers {
                let mut pairs: [Option<LoraPair>; 7] = Default::default();
                for (slot, target) in pairs.iter_mut().zip(Target::ALL) {
                    let (outputs, inputs) = target.shape(cfg);
                    let pair = LoraPair::new(&values(RANK * inputs), &values(outputs * RANK), inputs, outputs, 2.0);
                    *slot = Some(pair.map_err(|e| anyhow!(e))?);
                }
                layers.push(pairs);
            }
            let adapter = Arc::new(LoraAdapter::new(layers, cfg).map_err(|e| anyhow!(e))?);
            Ok(RequestAdapter { adapter, key: i as u64 + 1 })
        })
        .collect()
}
