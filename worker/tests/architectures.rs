//! The architectures beyond Llama/Qwen2 on small models the test writes itself, the same weights as a Hugging Face
//! directory and as a GGUF file (llama.cpp's names and keys): Qwen3's per-head query/key norms, and Llama 3.1's
//! RoPE scaling (`rope_scaling.rope_type = llama3` in config.json, the per-frequency `rope_freqs.weight` llama.cpp's
//! converter writes in GGUF). Both loaders must give the same logits, and each feature must change them. The
//! comparison with llama.cpp itself on the same files is `scripts/arch_models.py` (docs/worker.md).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value;
use candle_core::{Device, Tensor};
use common::{gguf_tokens, hf_tokenizer, logits, max_diff, random, write_gguf};
use zl_worker::device::Device as ZlDevice;
use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::kv::window::KvLayout;
use zl_worker::model::llama::{KvDtype, KvStore};
use zl_worker::model::{gguf, hf};
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

const HIDDEN: usize = 64;
const INTER: usize = 128;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
/// Wider than hidden / heads, as Qwen3's heads are.
const HD: usize = 32;
const CONTEXT: usize = 256;

/// (Hugging Face name, GGUF name, shape, values) of every tensor; norms only when `qk_norm`.
fn weights(vocab: usize, qk_norm: bool) -> Vec<(String, String, Vec<usize>, Vec<f32>)> {
    let mut seed = 42;
    let mut out = Vec::new();
    let mut push = |hf: String, gg: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n = shape.iter().product();
        let values = random(&mut seed, n, scale).into_iter().map(|v| v + offset).collect();
        out.push((hf, gg, shape, values));
    };
    push("model.embed_tokens.weight".into(), "token_embd.weight".into(), vec![vocab, HIDDEN], 1.0, 0.0);
    for i in 0..2 {
        let (h, g) = (|s: &str| format!("model.layers.{i}.{s}"), |s: &str| format!("blk.{i}.{s}"));
        push(h("input_layernorm.weight"), g("attn_norm.weight"), vec![HIDDEN], 0.2, 1.0);
        push(h("self_attn.q_proj.weight"), g("attn_q.weight"), vec![HEADS * HD, HIDDEN], 0.8, 0.0);
        push(h("self_attn.k_proj.weight"), g("attn_k.weight"), vec![KV_HEADS * HD, HIDDEN], 0.8, 0.0);
        push(h("self_attn.v_proj.weight"), g("attn_v.weight"), vec![KV_HEADS * HD, HIDDEN], 0.4, 0.0);
        if qk_norm {
            push(h("self_attn.q_norm.weight"), g("attn_q_norm.weight"), vec![HD], 1.0, 1.0);
            push(h("self_attn.k_norm.weight"), g("attn_k_norm.weight"), vec![HD], 1.0, 1.0);
        }
        push(h("self_attn.o_proj.weight"), g("attn_output.weight"), vec![HIDDEN, HEADS * HD], 0.4, 0.0);
        push(h("post_attention_layernorm.weight"), g("ffn_norm.weight"), vec![HIDDEN], 0.2, 1.0);
        push(h("mlp.gate_proj.weight"), g("ffn_gate.weight"), vec![INTER, HIDDEN], 0.4, 0.0);
        push(h("mlp.up_proj.weight"), g("ffn_up.weight"), vec![INTER, HIDDEN], 0.4, 0.0);
        push(h("mlp.down_proj.weight"), g("ffn_down.weight"), vec![HIDDEN, INTER], 0.4, 0.0);
    }
    push("model.norm.weight".into(), "output_norm.weight".into(), vec![HIDDEN], 0.2, 1.0);
    push("lm_head.weight".into(), "output.weight".into(), vec![vocab, HIDDEN], 0.4, 0.0);
    out
}

/// Llama 3.1's scaling of this test: factor 8, low and high frequency factors 1 and 4, pretrained on 32 tokens.
const LLAMA3: (f64, f64, f64, f64) = (8.0, 1.0, 4.0, 32.0);

/// The per-frequency divisors llama.cpp's converter writes for [`LLAMA3`] (its `generate_extra_tensors`).
fn llama3_factors(theta: f64) -> Vec<f32> {
    let (factor, low, high, original) = LLAMA3;
    (0..HD / 2)
        .map(|i| {
            let wavelen = 2.0 * std::f64::consts::PI / theta.powf(-2.0 * i as f64 / HD as f64);
            if wavelen < original / high {
                1.0
            } else if wavelen > original / low {
                factor as f32
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// Write the model as a Hugging Face directory and as a GGUF file; `arch` is the GGUF architecture (NeoX RoPE in
/// both: qwen2 or qwen3), `model_type` config.json's.
fn write(dir: &Path, arch: &str, qk_norm: bool, llama3: bool) -> (std::path::PathBuf, std::path::PathBuf) {
    write_with(dir, arch, qk_norm, llama3, false)
}

/// YaRN of this test: factor 4 over a 32-token pretraining context, and its scale.
const YARN: (f32, usize) = (4.0, 32);

/// [`write`], with YaRN scaling in both forms when `yarn` (as Qwen's long-context setting writes it).
fn write_with(
    dir: &Path,
    arch: &str,
    qk_norm: bool,
    llama3: bool,
    yarn: bool,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let vocab = gguf_tokens().len();
    let theta = 10_000.0;
    let hf_dir = dir.join("hf");
    std::fs::create_dir_all(&hf_dir).unwrap();
    std::fs::write(hf_dir.join("tokenizer.json"), hf_tokenizer().to_string(false).unwrap()).unwrap();
    let mut config = serde_json::json!({
        "model_type": arch, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": 2,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HD, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "rope_theta": theta, "max_position_embeddings": CONTEXT, "tie_word_embeddings": false
    });
    if llama3 {
        let (factor, low, high, original) = LLAMA3;
        config["rope_scaling"] = serde_json::json!({
            "rope_type": "llama3", "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
            "original_max_position_embeddings": original as usize
        });
    }
    if yarn {
        config["rope_scaling"] = serde_json::json!({
            "rope_type": "yarn", "factor": YARN.0, "original_max_position_embeddings": YARN.1
        });
    }
    std::fs::write(hf_dir.join("config.json"), config.to_string()).unwrap();
    let weights = weights(vocab, qk_norm);
    let hf_tensors: HashMap<String, Tensor> = weights
        .iter()
        .map(|(name, _, shape, v)| (name.clone(), Tensor::from_vec(v.clone(), shape.clone(), &Device::Cpu).unwrap()))
        .collect();
    candle_core::safetensors::save(&hf_tensors, hf_dir.join("model.safetensors")).unwrap();

    let key = |k: &str| gguf_key(arch, k);
    let mut meta = shape_meta(arch, theta as f32);
    if yarn {
        meta.push((key("rope.scaling.type"), Value::String("yarn".into())));
        meta.push((key("rope.scaling.factor"), Value::F32(YARN.0)));
        meta.push((key("rope.scaling.original_context_length"), Value::U32(YARN.1 as u32)));
    }
    let mut tensors: Vec<_> = weights.into_iter().map(|(_, name, shape, v)| (name, shape, v, GgmlDType::F32)).collect();
    if llama3 {
        tensors.push(("rope_freqs.weight".into(), vec![HD / 2], llama3_factors(theta), GgmlDType::F32));
    }
    let file = dir.join("model.gguf");
    write_gguf(&file, meta, &tensors);
    (hf_dir, file)
}

/// `ARCH.KEY`, as the GGUF writer takes keys.
fn gguf_key(arch: &str, k: &str) -> &'static str {
    Box::leak(format!("{arch}.{k}").into_boxed_str())
}

/// The GGUF metadata of this test's model shape, for architecture `arch` with RoPE base `theta`.
fn shape_meta(arch: &str, theta: f32) -> Vec<(&'static str, Value)> {
    let key = |k: &str| gguf_key(arch, k);
    vec![
        ("general.architecture", Value::String(arch.into())),
        (key("embedding_length"), Value::U32(HIDDEN as u32)),
        (key("feed_forward_length"), Value::U32(INTER as u32)),
        (key("block_count"), Value::U32(2)),
        (key("attention.head_count"), Value::U32(HEADS as u32)),
        (key("attention.head_count_kv"), Value::U32(KV_HEADS as u32)),
        (key("attention.key_length"), Value::U32(HD as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (key("rope.freq_base"), Value::F32(theta)),
        (key("context_length"), Value::U32(CONTEXT as u32)),
    ]
}

/// 96 tokens: well past the 32 the Llama 3 scaling's model was "pretrained" on.
fn prompt() -> Vec<u32> {
    (0..96u32).map(|i| (i * 53 + 7) % 256).collect()
}

/// The logits of the Hugging Face directory and the GGUF file of one model, checked to agree.
fn alike(hf_dir: &Path, file: &Path, what: &str) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = (hf::load(hf_dir).unwrap(), gguf::load(file).unwrap());
    let (la, lb) = (logits(&a.llama, &prompt()), logits(&b.llama, &prompt()));
    same(&la, &lb, what);
    (la, lb)
}

/// Check two models' logits agree (Hugging Face and GGUF forms of one model).
fn same(a: &[f32], b: &[f32], what: &str) {
    let (diff, scale) = max_diff(a, b);
    assert!(diff < 1e-4 * scale.max(1.0), "{what}: the two forms differ by {diff} (largest {scale})");
}

/// Check `feature` changes the logits by more than `share` of their largest.
fn counts(with: &[f32], without: &[f32], share: f32, feature: &str) {
    let (diff, scale) = max_diff(with, without);
    assert!(diff > share * scale, "{feature} changed nothing ({diff} of {scale})");
}

#[test]
fn qwen3_loads_from_both_formats_alike_and_its_query_key_norms_count() {
    let dir = tempfile::tempdir().unwrap();
    let (hf_dir, file) = write(dir.path(), "qwen3", true, false);
    let (a, b) = (hf::load(&hf_dir).unwrap(), gguf::load(&file).unwrap());
    assert_eq!((a.family.as_str(), b.family.as_str()), ("qwen3", "qwen3"));
    assert!(a.llama.layers().iter().chain(b.llama.layers()).all(|l| l.qk_norm.is_some()));
    let (_, lb) = alike(&hf_dir, &file, "Qwen3");
    // The same weights without the norms (as Qwen2): different logits.
    let other = tempfile::tempdir().unwrap();
    let (plain_hf, plain) = write(other.path(), "qwen2", false, false);
    counts(&lb, &alike(&plain_hf, &plain, "Qwen2").1, 0.05, "the query/key norms");
}

#[test]
fn llama3_rope_scaling_loads_from_both_formats_alike_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (hf_dir, file) = write(dir.path(), "qwen2", false, true);
    let (la, _) = alike(&hf_dir, &file, "llama3 RoPE scaling (config.json) and rope_freqs (GGUF)");
    let other = tempfile::tempdir().unwrap();
    let (plain_hf, file) = write(other.path(), "qwen2", false, false);
    counts(&la, &alike(&plain_hf, &file, "plain").0, 0.01, "the RoPE scaling");
}

#[test]
fn yarn_rope_scaling_loads_from_both_formats_alike_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (hf_dir, file) = write_with(dir.path(), "qwen3", true, false, true);
    let (la, _) = alike(&hf_dir, &file, "YaRN");
    let other = tempfile::tempdir().unwrap();
    let (plain_hf, file) = write(other.path(), "qwen3", true, false);
    counts(&la, &alike(&plain_hf, &file, "plain Qwen3").0, 0.01, "YaRN");
}

#[test]
fn an_unknown_rope_scaling_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (hf_dir, _) = write(dir.path(), "qwen2", false, true);
    let path = hf_dir.join("config.json");
    let config = std::fs::read_to_string(&path).unwrap().replace("\"llama3\"", "\"dynamic\"");
    std::fs::write(&path, config).unwrap();
    let err = hf::load(&hf_dir).unwrap_err().to_string();
    assert!(err.contains("RoPE scaling \"dynamic\""), "{err}");
}

/// Phi-3's LongRoPE factors of this test for `rotary` turning dimensions: long ones stretch the low frequencies,
/// short ones barely.
fn longrope_factors(rotary: usize) -> (Vec<f32>, Vec<f32>) {
    let half = rotary / 2;
    ((0..half).map(|i| 1.0 + 0.5 * i as f32).collect(), (0..half).map(|i| 1.0 + 0.02 * i as f32).collect())
}

/// The weights of [`weights`] in Phi-3's layout, as a Hugging Face directory and a GGUF file: Q, K and V fused in
/// one matrix, gate and up in another (gate first). `longrope`: (pretraining context, the GGUF file's attn_factor);
/// RoPE turns the leading `rotary` dimensions of each head (Phi-4-mini: three quarters).
fn write_phi3(dir: &Path, longrope: Option<(usize, f32)>, rotary: usize) -> (std::path::PathBuf, std::path::PathBuf) {
    let vocab = gguf_tokens().len();
    let theta = 10_000.0;
    let mut fused: Vec<(String, String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (hf, gg, shape, values) in weights(vocab, false) {
        let merge = |into: &mut Vec<(String, String, Vec<usize>, Vec<f32>)>, hf: &str, gg: &str| {
            let last = into.last_mut().unwrap();
            last.0 = hf.replace("{}", &last.0);
            last.1 = gg.replace("{}", &last.1);
            last.2[0] += shape[0];
            last.3.extend_from_slice(&values);
        };
        if hf.ends_with("k_proj.weight") || hf.ends_with("v_proj.weight") || hf.ends_with("up_proj.weight") {
            // Appended to the matrix before it (q then k then v; gate then up).
            merge(&mut fused, "{}", "{}");
        } else {
            let hf = hf.replace("q_proj", "qkv_proj").replace("gate_proj", "gate_up_proj");
            let gg = gg.replace("attn_q.", "attn_qkv.").replace("ffn_gate.", "ffn_up.");
            fused.push((hf, gg, shape, values));
        }
    }
    let hf_dir = dir.join("hf");
    std::fs::create_dir_all(&hf_dir).unwrap();
    std::fs::write(hf_dir.join("tokenizer.json"), hf_tokenizer().to_string(false).unwrap()).unwrap();
    let mut config = serde_json::json!({
        "model_type": "phi3", "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": 2,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HD, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "rope_theta": theta, "max_position_embeddings": CONTEXT, "tie_word_embeddings": false
    });
    if rotary != HD {
        config["partial_rotary_factor"] = (rotary as f64 / HD as f64).into();
    }
    let (long, short) = longrope_factors(rotary);
    if let Some((original, _)) = longrope {
        config["original_max_position_embeddings"] = original.into();
        config["rope_scaling"] = serde_json::json!({"type": "longrope", "long_factor": long, "short_factor": short});
    }
    std::fs::write(hf_dir.join("config.json"), config.to_string()).unwrap();
    let hf_tensors: HashMap<String, Tensor> = fused
        .iter()
        .map(|(name, _, shape, v)| (name.clone(), Tensor::from_vec(v.clone(), shape.clone(), &Device::Cpu).unwrap()))
        .collect();
    candle_core::safetensors::save(&hf_tensors, hf_dir.join("model.safetensors")).unwrap();

    let mut meta = shape_meta("phi3", theta as f32);
    meta.push(("phi3.rope.dimension_count", Value::U32(rotary as u32)));
    let mut tensors: Vec<_> = fused.into_iter().map(|(_, name, shape, v)| (name, shape, v, GgmlDType::F32)).collect();
    if let Some((original, attn_factor)) = longrope {
        meta.push(("phi3.rope.scaling.original_context_length", Value::U32(original as u32)));
        meta.push(("phi3.rope.scaling.attn_factor", Value::F32(attn_factor)));
        tensors.push(("rope_factors_long.weight".into(), vec![rotary / 2], long, GgmlDType::F32));
        tensors.push(("rope_factors_short.weight".into(), vec![rotary / 2], short, GgmlDType::F32));
    }
    let file = dir.join("model.gguf");
    write_gguf(&file, meta, &tensors);
    (hf_dir, file)
}

#[test]
fn phi3_fused_projections_load_from_both_formats_as_the_separate_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (hf_dir, file) = write_phi3(dir.path(), None, HD);
    assert_eq!(hf::load(&hf_dir).unwrap().family, "phi3");
    let (_, lb) = alike(&hf_dir, &file, "Phi-3");
    // Phi-3 is a Llama with NeoX RoPE and fused matrices: the same weights unfused (as Qwen2 without biases)
    // give the same logits, so the cut lands exactly between Q, K and V and between gate and up.
    let other = tempfile::tempdir().unwrap();
    let (_, separate) = write(other.path(), "qwen2", false, false);
    let (diff, scale) = max_diff(&logits(&gguf::load(&separate).unwrap().llama, &prompt()), &lb);
    assert!(diff < 1e-5 * scale.max(1.0), "fused and separate projections differ by {diff} (largest {scale})");
}

#[test]
fn phi3_longrope_takes_the_long_factors_past_the_pretraining_context_and_its_scale() {
    let run = |longrope: Option<(usize, f32)>| {
        let dir = tempfile::tempdir().unwrap();
        let (hf_dir, file) = write_phi3(dir.path(), longrope, HD);
        (logits(&hf::load(&hf_dir).unwrap().llama, &prompt()), logits(&gguf::load(&file).unwrap().llama, &prompt()))
    };
    // Pretrained on 32 of the 256 served: the long factors, and Hugging Face's default scale, which the GGUF file
    // carries as attn_factor (llama.cpp's converter writes it so).
    let hf_scale = (1.0 + (256f64 / 32.0).ln() / 32f64.ln()).sqrt() as f32;
    let (hf_long, gguf_long) = run(Some((32, hf_scale)));
    same(&hf_long, &gguf_long, "LongRoPE");
    counts(&gguf_long, &run(None).1, 0.01, "LongRoPE");
    // The scale alone counts.
    let (_, unscaled) = run(Some((32, 1.0)));
    counts(&gguf_long, &unscaled, 0.001, "attn_factor");
    // Serving no more than the pretraining context: the short factors, different from the long ones.
    let (hf_short, gguf_short) = run(Some((CONTEXT, 1.0)));
    same(&hf_short, &gguf_short, "LongRoPE's short factors");
    counts(&gguf_short, &unscaled, 0.01, "the choice of short or long factors");
}

#[test]
fn phi3_partial_rotary_loads_from_both_formats_alike_and_turns_only_its_dimensions() {
    let run = |longrope: Option<(usize, f32)>, rotary: usize| {
        let dir = tempfile::tempdir().unwrap();
        let (hf_dir, file) = write_phi3(dir.path(), longrope, rotary);
        let gguf_model = gguf::load(&file).unwrap();
        assert_eq!(gguf_model.llama.config().rotary(), rotary);
        alike(&hf_dir, &file, "partial rotary").1
    };
    // Phi-4-mini's three quarters (24 of 32), plain and with LongRoPE over the 12 turning frequencies.
    let partial = run(None, HD * 3 / 4);
    counts(&partial, &run(None, HD), 0.01, "partial rotary");
    let hf_scale = (1.0 + (256f64 / 32.0).ln() / 32f64.ln()).sqrt() as f32;
    counts(&run(Some((32, hf_scale)), HD * 3 / 4), &partial, 0.01, "LongRoPE over the turning dimensions");
    // A factor that leaves an odd number of dimensions turning is refused by name.
    let dir = tempfile::tempdir().unwrap();
    let (hf_dir, _) = write_phi3(dir.path(), None, HD);
    let path = hf_dir.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["partial_rotary_factor"] = (15.0 / 32.0).into();
    std::fs::write(&path, config.to_string()).unwrap();
    let err = hf::load(&hf_dir).unwrap_err().to_string();
    assert!(err.contains("RoPE over 15 of each head's 32 dimensions"), "{err}");
}

/// A 2-layer Gemma 3 of [`weights`] (with Q/K norms) plus post-norms, as a Hugging Face `gemma3_text` directory
/// (norms stored as `w - 1`, layer types named) and as a GGUF file (norms as llama.cpp's converter writes them, `w`):
/// layer 0 local over 16 positions, layer 1 global.
fn write_gemma3(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let vocab = gguf_tokens().len();
    let mut seed = 7;
    let mut all: Vec<(String, String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (hf, gg, shape, values) in weights(vocab, true) {
        if gg == "output.weight" {
            continue; // tied to the embeddings
        }
        let hf = hf.replace("post_attention_layernorm", "pre_feedforward_layernorm");
        all.push((hf, gg.clone(), shape, values));
        if let Some(i) = gg.strip_prefix("blk.").and_then(|r| r.strip_suffix(".ffn_down.weight")) {
            for (h, g) in
                [("post_attention_layernorm", "post_attention_norm"), ("post_feedforward_layernorm", "post_ffw_norm")]
            {
                let values = random(&mut seed, HIDDEN, 0.2).into_iter().map(|v| v + 1.0).collect();
                all.push((format!("model.layers.{i}.{h}.weight"), format!("blk.{i}.{g}.weight"), vec![HIDDEN], values));
            }
        }
    }
    let hf_dir = dir.join("hf");
    std::fs::create_dir_all(&hf_dir).unwrap();
    std::fs::write(hf_dir.join("tokenizer.json"), hf_tokenizer().to_string(false).unwrap()).unwrap();
    let config = serde_json::json!({
        "model_type": "gemma3_text", "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": 2,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HD, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 20_000.0,
        "max_position_embeddings": CONTEXT, "sliding_window": 16, "query_pre_attn_scalar": HD,
        "layer_types": ["sliding_attention", "full_attention"], "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": null, "attn_logit_softcapping": null
    });
    std::fs::write(hf_dir.join("config.json"), config.to_string()).unwrap();
    let hf_tensors: HashMap<String, Tensor> = all
        .iter()
        .map(|(name, _, shape, v)| {
            let v = if name.ends_with("norm.weight") { v.iter().map(|x| x - 1.0).collect() } else { v.clone() };
            (name.clone(), Tensor::from_vec(v, shape.clone(), &Device::Cpu).unwrap())
        })
        .collect();
    candle_core::safetensors::save(&hf_tensors, hf_dir.join("model.safetensors")).unwrap();
    let mut meta = shape_meta("gemma3", 1_000_000.0);
    meta.push(("gemma3.attention.sliding_window", Value::U32(16)));
    meta.push(("gemma3.attention.sliding_window_pattern", Value::U32(2)));
    // Not llama.cpp's default of 10,000: the key must be read.
    meta.push(("gemma3.rope.freq_base_swa", Value::F32(20_000.0)));
    let tensors: Vec<_> = all.into_iter().map(|(_, name, shape, v)| (name, shape, v, GgmlDType::F32)).collect();
    let file = dir.join("model.gguf");
    write_gguf(&file, meta, &tensors);
    (hf_dir, file)
}

#[test]
fn gemma3_loads_from_a_hugging_face_directory_as_from_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let (hf_dir, file) = write_gemma3(dir.path());
    let a = hf::load(&hf_dir).unwrap();
    assert_eq!(a.family, "gemma3");
    let cfg = a.llama.config();
    assert!(cfg.is_local(0) && !cfg.is_local(1), "{:?}", cfg.sliding);
    assert!(a.llama.layers().iter().all(|l| l.qk_norm.is_some() && l.post_norms.is_some()));
    // 96 tokens: the local layer's 16-position window engaged.
    alike(&hf_dir, &file, "Gemma 3");

    // Gemma 3 27B's attention scale, 1/sqrt(query_pre_attn_scalar) where that is not the head width, counts.
    let path = hf_dir.join("config.json");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let base = logits(&hf::load(&hf_dir).unwrap().llama, &prompt());
    let mut scaled = config.clone();
    scaled["query_pre_attn_scalar"] = 42.into();
    std::fs::write(&path, scaled.to_string()).unwrap();
    let model = hf::load(&hf_dir).unwrap();
    assert_eq!(model.llama.config().attention_scale(), 1.0 / 42f32.sqrt());
    counts(&logits(&model.llama, &prompt()), &base, 0.01, "query_pre_attn_scalar");
    // The multimodal checkpoint and a layer pattern the model cannot follow are refused by name.
    for (key, value, says) in [
        ("model_type", serde_json::json!("gemma3"), "text-only"),
        ("layer_types", serde_json::json!(["full_attention", "sliding_attention"]), "layer_types"),
    ] {
        let mut changed = config.clone();
        changed[key] = value;
        std::fs::write(&path, changed.to_string()).unwrap();
        let err = hf::load(&hf_dir).unwrap_err().to_string();
        assert!(err.contains(says), "{key}: {err}");
    }
}

/// Greedy outputs of `prompts` run together (the first speculating), each with its prompt tokens found cached;
/// and the most blocks the sliding-window layers' pool held after any step.
fn greedy(engine: &mut EngineCore, prompts: &[Vec<u32>]) -> (Vec<(Vec<u32>, u32)>, usize) {
    for (i, prompt) in prompts.iter().enumerate() {
        let request =
            Request { speculate: if i == 0 { 4 } else { 0 }, ..Request::new(prompt.clone(), Sampling::greedy(), 100) };
        engine.add(i as u64, request).unwrap();
    }
    let mut out = vec![(Vec::new(), 0); prompts.len()];
    let mut most = 0;
    for _ in 0..2_000 {
        if !engine.has_work() {
            break;
        }
        for event in engine.step() {
            match event {
                Event::Token { seq, token, .. } => out[seq as usize].0.push(token),
                Event::Finished { seq, cached_input_tokens, .. } => out[seq as usize].1 = cached_input_tokens,
                Event::Prompt { .. } => {}
            }
        }
        most = most.max(engine.window_blocks().map_or(0, |(used, _)| used));
    }
    assert!(!engine.has_work());
    (out, most)
}

#[test]
fn gemma3_local_layers_keep_only_their_window_and_answer_as_with_every_position_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (_, file) = write_gemma3(dir.path());
    let config = SchedulerConfig { max_running: 4, max_step_tokens: 64, prefill_chunk: 8, speculative_rows: 4 };
    let model = gguf::load(&file).unwrap();
    let cfg = model.llama.config().clone();
    let layout = KvStore::sizing(&cfg, 4, config.max_running, config.max_item(), KvDtype::F16).layout(1 << 20).unwrap();
    // (16 + 8) / 4 + 2 = 8 blocks a sequence, 4 sequences; the global layer gets the rest.
    let window = layout.window.expect("a window shorter than the context is kept apart");
    assert_eq!((window.blocks, window.window), (32, 16));
    let windowed_bytes = KvStore::with_layout(&cfg, &layout, 4).bytes();
    let full_bytes = KvStore::new(&cfg, layout.blocks, 4).bytes();
    assert!(windowed_bytes * 10 < full_bytes * 6, "{windowed_bytes} vs {full_bytes}: the local layer's half shrinks");

    // On the CPU, or on the device `ZL_TEST_DEVICE` names (scripts/gpu-check runs this test on a GPU).
    let device = ZlDevice::from_env("ZL_TEST_DEVICE").unwrap();
    let mut windowed = EngineCore::on_device(model, device, layout, 4, config.clone()).unwrap();
    let every = KvLayout::full(layout.blocks);
    let mut full = EngineCore::on_device(gguf::load(&file).unwrap(), device, every, 4, config.clone()).unwrap();
    assert!(full.window_blocks().is_none());
    let long: Vec<u32> = (0..70u32).map(|i| (i * 31 + 5) % 256).collect();
    let prompts = vec![prompt()[..40].to_vec(), long, prompt()[..24].iter().chain(&[9, 9, 9]).copied().collect()];
    let (want, _) = greedy(&mut full, &prompts);
    let (got, most) = greedy(&mut windowed, &prompts);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.0, w.0, "prompt {i}: the windowed KV changed the answer");
        assert_eq!(g.0.len(), 100);
    }
    assert!(most > 0 && most <= 3 * 8, "the window pool held {most} blocks for 3 sequences of 140 tokens");
    assert_eq!(windowed.window_blocks().unwrap().0, 0, "all handed back");
    // Alone, twice: the second run resumes from the cache at 36 tokens, with only the window of that position's
    // row (positions 21..=35, blocks 5..=8) held by the local layer's pool, and the answer is the same.
    let mut alone = EngineCore::on_device(gguf::load(&file).unwrap(), device, layout, 4, config).unwrap();
    let (first, _) = greedy(&mut alone, &prompts[..1]);
    let (again, _) = greedy(&mut alone, &prompts[..1]);
    assert_eq!((first[0].1, again[0].1), (0, 36), "prompt tokens found cached");
    assert_eq!(again[0].0, want[0].0);
}
