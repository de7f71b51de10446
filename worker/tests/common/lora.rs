//! Test adapters: seeded random low-rank updates for a base's shape, written as a Hugging Face PEFT directory or as
//! a llama.cpp GGUF adapter.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use zl_worker::model::llama::LlamaConfig;
use zl_worker::model::lora::Target;

/// One matrix's random update: `A` (`rank` rows of the matrix's inputs), `B` (its outputs' rows of `rank`).
#[derive(Clone, Debug)]
pub(crate) struct Update {
    pub layer: usize,
    pub target: Target,
    pub rank: usize,
    pub inputs: usize,
    pub outputs: usize,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
}

/// Updates of every layer's `targets` at `rank`, values uniform in `[-spread, spread)` from `seed`.
pub(crate) fn random_updates(
    cfg: &LlamaConfig,
    targets: &[Target],
    rank: usize,
    seed: u64,
    spread: f32,
) -> Vec<Update> {
    let mut s = seed;
    let mut values = |n: usize| super::random(&mut s, n, 2.0 * spread);
    let mut out = Vec::new();
    for layer in 0..cfg.layers {
        for &target in targets {
            let (outputs, inputs) = target.shape(cfg);
            let a = values(rank * inputs);
            let b = values(outputs * rank);
            out.push(Update { layer, target, rank, inputs, outputs, a, b });
        }
    }
    out
}

/// The updates as a PEFT directory: `adapter_config.json` (`r`, `lora_alpha`, `target_modules`) and
/// `adapter_model.safetensors` with PEFT's tensor names, `B` in f16 when `half` (as PEFT saves from fp16 training).
pub(crate) fn write_peft(dir: &Path, updates: &[Update], alpha: f32, half: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let rank = updates[0].rank;
    let mut modules: Vec<&str> = updates.iter().map(|u| u.target.peft_name()).collect();
    modules.dedup();
    modules.sort();
    modules.dedup();
    let config = serde_json::json!({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": modules, "bias": "none",
        "lora_dropout": 0.05, "fan_in_fan_out": false, "task_type": "CAUSAL_LM", "base_model_name_or_path": "test"
    });
    std::fs::write(dir.join("adapter_config.json"), config.to_string()).unwrap();
    let mut tensors = HashMap::new();
    for u in updates {
        let group = if matches!(u.target, Target::Gate | Target::Up | Target::Down) { "mlp" } else { "self_attn" };
        let p = format!("base_model.model.model.layers.{}.{group}.{}", u.layer, u.target.peft_name());
        let a = Tensor::from_vec(u.a.clone(), (u.rank, u.inputs), &Device::Cpu).unwrap();
        let mut b = Tensor::from_vec(u.b.clone(), (u.outputs, u.rank), &Device::Cpu).unwrap();
        if half {
            b = b.to_dtype(candle_core::DType::F16).unwrap();
        }
        tensors.insert(format!("{p}.lora_A.weight"), a);
        tensors.insert(format!("{p}.lora_B.weight"), b);
    }
    candle_core::safetensors::save(&tensors, dir.join("adapter_model.safetensors")).unwrap();
}

/// The updates as a llama.cpp GGUF adapter for architecture `arch` (`B` rows as given: the caller permutes Q and
/// K for Llama's layout, as llama.cpp's converter does).
pub(crate) fn write_gguf_adapter(path: &Path, arch: &str, updates: &[Update], alpha: f32) {
    let meta = [
        ("general.architecture", Value::String(arch.into())),
        ("general.type", Value::String("adapter".into())),
        ("adapter.type", Value::String("lora".into())),
        ("adapter.lora.alpha", Value::F32(alpha)),
    ];
    let q: Vec<(String, QTensor)> = updates
        .iter()
        .flat_map(|u| {
            let p = format!("blk.{}.{}.weight", u.layer, u.target.gguf_name());
            let a = Tensor::from_vec(u.a.clone(), (u.rank, u.inputs), &Device::Cpu).unwrap();
            let b = Tensor::from_vec(u.b.clone(), (u.outputs, u.rank), &Device::Cpu).unwrap();
            [
                (format!("{p}.lora_a"), QTensor::quantize(&a, GgmlDType::F32).unwrap()),
                (format!("{p}.lora_b"), QTensor::quantize(&b, GgmlDType::F16).unwrap()),
            ]
        })
        .collect();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
}

/// Llama's Q/K row order in GGUF (llama.cpp's converter): within each of `heads` heads, rows `i` and `i + half`
/// become rows `2i` and `2i + 1`. Rows of `width` values.
pub(crate) fn permute_rows(m: &[f32], heads: usize, head_dim: usize, width: usize) -> Vec<f32> {
    let mut out = vec![0f32; m.len()];
    for h in 0..heads {
        for i in 0..head_dim / 2 {
            for (new, old) in [(2 * i, i), (2 * i + 1, i + head_dim / 2)] {
                let (dst, src) = ((h * head_dim + new) * width, (h * head_dim + old) * width);
                out[dst..dst + width].copy_from_slice(&m[src..src + width]);
            }
        }
    }
    out
}
