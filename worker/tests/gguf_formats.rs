//! Every GGUF weight format loaded natively from one mixed file (as a Q4_K_M file mixes Q4_K, Q6_K, Q5_0 and Q8_0):
//! a small Llama written by the test with candle's quantizers, each matrix in another format; each kept in its own
//! format with the file's bytes, its logits close to the float reference path's; a tensor type without a kernel
//! refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value;
use common::{gguf_tokens, logits, random, write_gguf};
use zl_worker::model::{LoadError, Precision, gguf};

const HIDDEN: usize = 256;
const INTER: usize = 512;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HD: usize = HIDDEN / HEADS;

/// Each matrix's name, shape and format: every block format, Q4_1, Q8_0, F16, BF16 and F32 in one file.
fn plan(vocab: usize) -> Vec<(String, (usize, usize), GgmlDType)> {
    let kv = KV_HEADS * HD;
    let mut out = vec![("token_embd.weight".to_string(), (vocab, HIDDEN), GgmlDType::Q6K)];
    let layers = [
        [
            GgmlDType::Q4_0,
            GgmlDType::Q5_0,
            GgmlDType::Q5_1,
            GgmlDType::Q2K,
            GgmlDType::Q3K,
            GgmlDType::Q4K,
            GgmlDType::Q5K,
        ],
        [
            GgmlDType::Q6K,
            GgmlDType::Q4_1,
            GgmlDType::F16,
            GgmlDType::BF16,
            GgmlDType::F32,
            GgmlDType::Q4K,
            GgmlDType::Q8_0,
        ],
    ];
    for (i, types) in layers.iter().enumerate() {
        let shapes = [
            ("attn_q", (HIDDEN, HIDDEN)),
            ("attn_k", (kv, HIDDEN)),
            ("attn_v", (kv, HIDDEN)),
            ("attn_output", (HIDDEN, HIDDEN)),
            ("ffn_gate", (INTER, HIDDEN)),
            ("ffn_up", (INTER, HIDDEN)),
            ("ffn_down", (HIDDEN, INTER)),
        ];
        for ((name, shape), ty) in shapes.into_iter().zip(types) {
            out.push((format!("blk.{i}.{name}.weight"), shape, *ty));
        }
    }
    out.push(("output.weight".to_string(), (vocab, HIDDEN), GgmlDType::Q8_0));
    out
}

fn name(ty: GgmlDType) -> &'static str {
    match ty {
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        _ => "F32",
    }
}

fn write_model(path: &Path) -> Vec<(String, (usize, usize), GgmlDType)> {
    let vocab = gguf_tokens().len();
    let mut seed = 7;
    let plan = plan(vocab);
    let mut tensors = Vec::new();
    for (name, (rows, cols), ty) in &plan {
        tensors.push((name.clone(), vec![*rows, *cols], random(&mut seed, rows * cols, 0.2), *ty));
    }
    let mut vector = |name: String| {
        let v: Vec<f32> = random(&mut seed, HIDDEN, 0.2).into_iter().map(|x| 1.0 + x).collect();
        (name, vec![HIDDEN], v, GgmlDType::F32)
    };
    let mut norms = Vec::new();
    for i in 0..2 {
        norms.push(vector(format!("blk.{i}.attn_norm.weight")));
        norms.push(vector(format!("blk.{i}.ffn_norm.weight")));
    }
    norms.push(vector("output_norm.weight".into()));
    tensors.extend(norms);
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.feed_forward_length", Value::U32(INTER as u32)),
        ("llama.block_count", Value::U32(2)),
        ("llama.attention.head_count", Value::U32(HEADS as u32)),
        ("llama.attention.head_count_kv", Value::U32(KV_HEADS as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10_000.0)),
        ("llama.context_length", Value::U32(256)),
    ];
    write_gguf(path, meta, &tensors);
    plan
}

#[test]
fn a_file_mixing_every_format_loads_each_natively_close_to_the_float_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.gguf");
    let plan = write_model(&path);
    let native = gguf::load_with(&path, Precision::Native).unwrap();
    let float = gguf::load_with(&path, Precision::Float).unwrap();
    let got: Vec<&str> = native.llama.matrices().map(|w| w.format_name()).collect();
    let want: Vec<&str> = plan.iter().map(|(_, _, ty)| name(*ty)).collect();
    assert_eq!(got, want, "each matrix in the file's own format");
    assert!(float.llama.matrices().all(|w| w.format_name() == "F32"));
    // The 16-bit floats and the block formats kept as blocks hold exactly the file's bytes; those repacked for
    // their kernels (Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) at most 6% more, their last tile of eight features padded.
    for (w, (tensor, (rows, cols), ty)) in native.llama.matrices().zip(&plan) {
        let file = |rows: usize| rows * cols / ty.block_size() * ty.type_size();
        match ty {
            GgmlDType::Q4_1 | GgmlDType::Q8_0 | GgmlDType::F32 => {}
            GgmlDType::Q4_0 | GgmlDType::Q5_0 | GgmlDType::Q5_1 | GgmlDType::Q4K | GgmlDType::Q5K | GgmlDType::Q6K => {
                let bound = file(rows.next_multiple_of(8)) as f64 * 1.06;
                assert!(w.memory_bytes() >= file(*rows) && w.memory_bytes() as f64 <= bound, "{tensor}");
            }
            _ => assert_eq!(w.memory_bytes(), file(*rows), "{tensor}"),
        }
    }

    let prompt: Vec<u32> = (0..64u32).map(|i| (i * 37 + 11) % 256).collect();
    let (a, b) = (logits(&native.llama, &prompt), logits(&float.llama, &prompt));
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff <= 2e-3 * scale, "native and float logits differ by {diff} (largest logit {scale})");
    let argmax = |v: &[f32]| (0..v.len()).max_by(|&i, &j| v[i].total_cmp(&v[j])).unwrap();
    assert_eq!(argmax(&a), argmax(&b));
}

#[test]
fn a_tensor_type_without_a_kernel_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("iq.gguf");
    write_model(&path);
    // Rewrite blk.1.ffn_up.weight's type (after its name, its dimension count and two dimensions) to IQ2_XXS.
    let mut bytes = std::fs::read(&path).unwrap();
    let name = b"blk.1.ffn_up.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 4 + 2 * 8;
    assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 12, "Q4_K before the edit");
    bytes[at..at + 4].copy_from_slice(&16u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let err = gguf::load(&path).unwrap_err();
    assert!(matches!(err, LoadError::Unsupported(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("tensor blk.1.ffn_up.weight is IQ2_XXS"), "{msg}");
    assert!(msg.contains("Q4_K"), "names what is supported: {msg}");
}
