//! The Hugging Face loading path on a small Llama the test writes itself (fixed-seed random weights, f32 and bf16
//! safetensors, a byte-level BPE tokenizer.json): loading, chat templates, both RoPE layouts agreeing, and batch
//! invariance through the engine.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use common::lora::{Update, permute_rows, random_updates, write_gguf_adapter, write_peft};
use common::{hf_tokenizer, logits, logits_with, max_diff};
use zl_text::ChatMessage;
use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::model::kernels::Weight;
use zl_worker::model::llama::{Ffn, Layer, Llama, LlamaConfig};
use zl_worker::model::lora::Target;
use zl_worker::model::lora_load::{self, AdapterFormat};
use zl_worker::model::{Precision, hf, lora_merge};
use zl_worker::sampling::Sampling;

const HIDDEN: usize = 64;
const INTER: usize = 128;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = HIDDEN / HEADS;

struct Gen(u64);

impl Gen {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (((self.0 >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * 0.4
    }

    fn matrix(&mut self, rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols).map(|_| self.next()).collect()
    }
}

/// All weights, HF names, in generation order (so two calls give identical values).
fn weights(vocab: usize) -> Vec<(String, (usize, usize), Vec<f32>)> {
    let mut g = Gen(42);
    let mut out = vec![("model.embed_tokens.weight".to_string(), (vocab, HIDDEN), g.matrix(vocab, HIDDEN))];
    for i in 0..LAYERS {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        let norm: Vec<f32> = (0..HIDDEN).map(|_| 1.0 + g.next()).collect();
        out.push((p("input_layernorm.weight"), (HIDDEN, 1), norm));
        out.push((p("self_attn.q_proj.weight"), (HIDDEN, HIDDEN), g.matrix(HIDDEN, HIDDEN)));
        out.push((p("self_attn.k_proj.weight"), (KV_HEADS * HD, HIDDEN), g.matrix(KV_HEADS * HD, HIDDEN)));
        out.push((p("self_attn.v_proj.weight"), (KV_HEADS * HD, HIDDEN), g.matrix(KV_HEADS * HD, HIDDEN)));
        out.push((p("self_attn.o_proj.weight"), (HIDDEN, HIDDEN), g.matrix(HIDDEN, HIDDEN)));
        let norm: Vec<f32> = (0..HIDDEN).map(|_| 1.0 + g.next()).collect();
        out.push((p("post_attention_layernorm.weight"), (HIDDEN, 1), norm));
        out.push((p("mlp.gate_proj.weight"), (INTER, HIDDEN), g.matrix(INTER, HIDDEN)));
        out.push((p("mlp.up_proj.weight"), (INTER, HIDDEN), g.matrix(INTER, HIDDEN)));
        out.push((p("mlp.down_proj.weight"), (HIDDEN, INTER), g.matrix(HIDDEN, INTER)));
    }
    out.push(("model.norm.weight".into(), (HIDDEN, 1), (0..HIDDEN).map(|_| 1.0 + g.next()).collect()));
    out.push(("lm_head.weight".into(), (vocab, HIDDEN), g.matrix(vocab, HIDDEN)));
    out
}

fn write_model(dir: &Path) -> usize {
    let tok = hf_tokenizer();
    let vocab = tok.get_vocab_size(true);
    std::fs::write(dir.join("tokenizer.json"), tok.to_string(false).unwrap()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}"#)
        .unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": vocab, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": false
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    // Two shards; the MLP weights in bf16 to exercise dtype conversion.
    let mut a = HashMap::new();
    let mut b = HashMap::new();
    for (name, (rows, cols), values) in weights(vocab) {
        let shape: Vec<usize> = if cols == 1 { vec![rows] } else { vec![rows, cols] };
        let t = Tensor::from_vec(values, shape, &Device::Cpu).unwrap();
        if name.contains("mlp") {
            b.insert(name, t.to_dtype(DType::BF16).unwrap());
        } else {
            a.insert(name, t);
        }
    }
    candle_core::safetensors::save(&a, dir.join("model-00001-of-00002.safetensors")).unwrap();
    candle_core::safetensors::save(&b, dir.join("model-00002-of-00002.safetensors")).unwrap();
    vocab
}

fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect()
}

/// The same network with GGUF's Q/K row order and adjacent-pair RoPE.
fn interleaved_twin(vocab: usize) -> Llama {
    let mut w: HashMap<String, Vec<f32>> = weights(vocab).into_iter().map(|(n, _, v)| (n, v)).collect();
    let permute = |m: &[f32], heads: usize| permute_rows(m, heads, HD, HIDDEN);
    let f = |rows, cols, v: Vec<f32>| Weight::from_f32(rows, cols, v).unwrap();
    let mut layers = Vec::new();
    for i in 0..LAYERS {
        let mut take = |s: &str| w.remove(&format!("model.layers.{i}.{s}")).unwrap();
        layers.push(Layer {
            attn_norm: take("input_layernorm.weight"),
            wq: f(HIDDEN, HIDDEN, permute(&take("self_attn.q_proj.weight"), HEADS)),
            wk: f(KV_HEADS * HD, HIDDEN, permute(&take("self_attn.k_proj.weight"), KV_HEADS)),
            wv: f(KV_HEADS * HD, HIDDEN, take("self_attn.v_proj.weight")),
            qkv_bias: None,
            qk_norm: None,
            post_norms: None,
            wo: f(HIDDEN, HIDDEN, take("self_attn.o_proj.weight")),
            ffn_norm: take("post_attention_layernorm.weight"),
            ffn: Ffn::Dense {
                gate: f(INTER, HIDDEN, bf16_round(&take("mlp.gate_proj.weight"))),
                up: f(INTER, HIDDEN, bf16_round(&take("mlp.up_proj.weight"))),
                down: f(HIDDEN, INTER, bf16_round(&take("mlp.down_proj.weight"))),
            },
        });
    }
    let cfg = LlamaConfig {
        hidden: HIDDEN,
        intermediate: INTER,
        layers: LAYERS,
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: HD,
        vocab,
        rms_eps: 1e-5,
        rope_theta: 10_000.0,
        context_length: 256,
        rope_interleaved: true,
        ..Default::default()
    };
    let embed = f(vocab, HIDDEN, w.remove("model.embed_tokens.weight").unwrap());
    let norm = w.remove("model.norm.weight").unwrap();
    let output = f(vocab, HIDDEN, w.remove("lm_head.weight").unwrap());
    Llama::new(cfg, embed, layers, norm, Some(output)).unwrap()
}

#[test]
fn a_hugging_face_directory_loads_and_both_rope_layouts_agree() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = write_model(dir.path());
    let model = hf::load(dir.path()).unwrap();
    assert_eq!(model.family, "llama");
    assert_eq!(model.llama.config().kv_heads, KV_HEADS);
    // bf16 matrices stay bf16 in memory (half the bytes of f32), f32 ones f32.
    let layer = &model.llama.layers()[0];
    let (_, up, _) = layer.ffn.dense().unwrap();
    assert_eq!((up.format_name(), up.memory_bytes()), ("BF16", 2 * INTER * HIDDEN));
    assert_eq!(layer.wq.format_name(), "F32");
    let tok = &model.tokenizer;
    let ids = tok.encode("hello <|im_end|>").unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), "hello ");
    assert!(tok.stop_ids.contains(&tok.encode("<|im_end|>").unwrap()[0]));
    let chat = tok.render_chat(&[ChatMessage { role: "user".into(), content: "hi".into() }]).unwrap();
    assert_eq!(chat, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");

    let prompt = tok.encode(&chat).unwrap();
    let a = logits(&model.llama, &prompt);
    let b = logits(&interleaved_twin(vocab), &prompt);
    let max_diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(max_diff < 1e-3, "halves and interleaved RoPE disagree by {max_diff}");
}

#[test]
fn the_small_model_is_batch_invariant_through_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    let run = |others: u64| {
        let model = hf::load(dir.path()).unwrap();
        let mut engine = EngineCore::new(model, 64, 16, Default::default()).unwrap();
        let target = engine.model().tokenizer.encode("<|im_start|>user\nthe sea<|im_end|>\n").unwrap();
        let sampling = Sampling { temperature: 0.9, top_p: 0.9, top_k: 20, seed: 5 };
        for i in 1..=others {
            let prompt = engine.model().tokenizer.encode(&"x".repeat(i as usize * 3)).unwrap();
            let s = Sampling { seed: i, ..sampling };
            engine.add(i, Request::new(prompt, s, 5 + i as u32)).unwrap();
        }
        engine.add(0, Request::new(target, sampling, 12)).unwrap();
        let mut tokens = Vec::new();
        while engine.has_work() {
            for ev in engine.step() {
                if let Event::Token { seq: 0, token, .. } = ev {
                    tokens.push(token);
                }
            }
        }
        tokens
    };
    let alone = run(0);
    assert!(!alone.is_empty());
    assert_eq!(alone, run(16));
}

#[test]
fn a_directory_without_weights_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let err = hf::load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("no .safetensors files"), "{err}");
}

#[test]
fn peft_and_gguf_adapters_apply_alike_over_both_rope_layouts_and_as_merged() {
    let dir = tempfile::tempdir().unwrap();
    let vocab = write_model(dir.path());
    let model = hf::load(dir.path()).unwrap();
    let twin = interleaved_twin(vocab);
    let updates = random_updates(model.llama.config(), &Target::ALL, 4, 7, 0.3);
    let adapters = tempfile::tempdir().unwrap();
    write_peft(&adapters.path().join("peft"), &updates, 8.0, true);
    // The GGUF adapter in llama.cpp's Llama layout: Q's and K's B rows permuted as its converter permutes them.
    let permuted: Vec<Update> = updates
        .iter()
        .cloned()
        .map(|mut u| {
            match u.target {
                Target::Q => u.b = permute_rows(&u.b, HEADS, HD, u.rank),
                Target::K => u.b = permute_rows(&u.b, KV_HEADS, HD, u.rank),
                _ => {}
            }
            u
        })
        .collect();
    write_gguf_adapter(&adapters.path().join("a.gguf"), "llama", &permuted, 8.0);
    let load = |path: &str, config| {
        let base = lora_load::Base { config, family: "llama" };
        lora_load::load(&adapters.path().join(path), base).unwrap()
    };
    let peft_hf = load("peft", model.llama.config());
    assert_eq!((peft_hf.format, peft_hf.adapter.rank(), peft_hf.adapter.targets().len()), (AdapterFormat::Peft, 4, 7));
    let gguf_hf = load("a.gguf", model.llama.config());
    assert_eq!(gguf_hf.format, AdapterFormat::Gguf);

    let prompt = model.tokenizer.encode("<|im_start|>user\nthe sea<|im_end|>\n").unwrap();
    let want = logits_with(&model.llama, Some(&peft_hf.adapter), &prompt);
    let (moved, _) = max_diff(&want, &logits(&model.llama, &prompt));
    assert!(moved > 0.1, "the adapter barely changes the logits ({moved})");
    let check = |name: &str, got: Vec<f32>| {
        let (diff, scale) = max_diff(&got, &want);
        assert!(diff < 1e-3 * scale.max(1.0), "{name}: {diff} (logits up to {scale})");
    };
    check("gguf adapter, hf base", logits_with(&model.llama, Some(&gguf_hf.adapter), &prompt));
    check("peft adapter, gguf-layout base", logits_with(&twin, Some(&load("peft", twin.config()).adapter), &prompt));
    check("gguf adapter, gguf-layout base", logits_with(&twin, Some(&load("a.gguf", twin.config()).adapter), &prompt));
    // Merged into the float weights: the same logits.
    let mut merged = hf::load_with(dir.path(), Precision::Float).unwrap().llama;
    lora_merge::merge(&mut merged, &peft_hf.adapter).unwrap();
    check("merged", logits(&merged, &prompt));
    // Merging needs f32 weights (the bf16 MLP of the native load is refused by name).
    let mut native = hf::load(dir.path()).unwrap().llama;
    assert!(lora_merge::merge(&mut native, &peft_hf.adapter).unwrap_err().contains("BF16"));
}

#[test]
fn an_adapter_for_another_model_or_architecture_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    let model = hf::load(dir.path()).unwrap();
    let cfg = model.llama.config();
    let adapters = tempfile::tempdir().unwrap();
    // Made for a wider model.
    let wide = LlamaConfig { hidden: 2 * HIDDEN, ..cfg.clone() };
    write_peft(&adapters.path().join("wide"), &random_updates(&wide, &[Target::Q], 2, 1, 0.1), 4.0, false);
    let base = lora_load::Base { config: cfg, family: "llama" };
    let err = lora_load::load(&adapters.path().join("wide"), base).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");
    // A GGUF adapter of another architecture.
    write_gguf_adapter(&adapters.path().join("q.gguf"), "qwen2", &random_updates(cfg, &[Target::V], 2, 1, 0.1), 4.0);
    let err = lora_load::load(&adapters.path().join("q.gguf"), base).unwrap_err().to_string();
    assert!(err.contains("for a qwen2 model, the base is llama"), "{err}");
    // A directory without the PEFT files.
    let err = lora_load::load(adapters.path(), base).unwrap_err().to_string();
    assert!(err.contains("adapter_config.json"), "{err}");
}
