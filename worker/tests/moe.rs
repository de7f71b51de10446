//! Mixture-of-experts GGUF files (Mixtral-style `llama` with experts, `qwen3moe`, `olmoe`) on small models the
//! test writes itself, with llama.cpp's names and shapes: each layer's router `ffn_gate_inp` and its experts
//! stacked in 3-D tensors `ffn_{gate,up,down}_exps`.
//!
//! The check that needs no second engine: with an all-zero router every expert scores the same, so each token runs
//! experts 0 and 1 (ties go to the lower index) at weight 1/2 each (renormalized: Mixtral, Qwen3-MoE) or 1/4 each
//! (OLMoE's softmax over 4 experts, not renormalized). Two gated MLPs summed with weights are one gated MLP of twice
//! the width (gates and ups stacked, downs side by side times the weight), so a dense file of that width must give
//! the same logits: a wrong cut of the stacked experts, a wrong choice, weight or shape would not. The comparison
//! with llama.cpp itself on random routers is `scripts/eval-formats` (docs/worker.md).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value;
use common::{logits, max_diff, random, write_gguf};
use zl_worker::kv::pool::BlockPool;
use zl_worker::model::gguf;
use zl_worker::model::llama::{BatchItem, KvStore};

const HIDDEN: usize = 64;
/// One expert's MLP width.
const INTER: usize = 32;
const EXPERTS: usize = 4;
const CONTEXT: usize = 128;

/// The model's shape: query and key-value heads and their width.
#[derive(Clone, Copy)]
struct Shape {
    heads: usize,
    kv_heads: usize,
    hd: usize,
}

/// How the file's queries and keys are normed before RoPE.
#[derive(Clone, Copy, PartialEq)]
enum QkNorm {
    None,
    /// Each head by itself (Qwen3, Qwen3-MoE).
    PerHead,
    /// All heads of a row at once (OLMoE).
    Full,
}

fn key(arch: &str, k: &str) -> &'static str {
    Box::leak(format!("{arch}.{k}").into_boxed_str())
}

type Tensors = Vec<(String, Vec<usize>, Vec<f32>, GgmlDType)>;

/// The attention, norms, embeddings and output every variant shares (fixed seed), and each layer's experts' gate,
/// up and down values.
fn common_weights(shape: Shape, norm: QkNorm, vocab: usize) -> (Tensors, Vec<[Vec<Vec<f32>>; 3]>) {
    let mut seed = 11;
    let mut t: Tensors = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, scale: f32, offset: f32, seed: &mut u64| {
        let n = shape.iter().product();
        let values = random(seed, n, scale).into_iter().map(|v| v + offset).collect();
        t.push((name, shape, values, GgmlDType::F32));
    };
    let (q, kv) = (shape.heads * shape.hd, shape.kv_heads * shape.hd);
    push("token_embd.weight".into(), vec![vocab, HIDDEN], 1.0, 0.0, &mut seed);
    let mut experts = Vec::new();
    for i in 0..2 {
        let g = |s: &str| format!("blk.{i}.{s}");
        push(g("attn_norm.weight"), vec![HIDDEN], 0.2, 1.0, &mut seed);
        push(g("attn_q.weight"), vec![q, HIDDEN], 0.8, 0.0, &mut seed);
        push(g("attn_k.weight"), vec![kv, HIDDEN], 0.8, 0.0, &mut seed);
        push(g("attn_v.weight"), vec![kv, HIDDEN], 0.4, 0.0, &mut seed);
        match norm {
            QkNorm::None => {}
            QkNorm::PerHead => {
                push(g("attn_q_norm.weight"), vec![shape.hd], 1.0, 1.0, &mut seed);
                push(g("attn_k_norm.weight"), vec![shape.hd], 1.0, 1.0, &mut seed);
            }
            QkNorm::Full => {
                push(g("attn_q_norm.weight"), vec![q], 1.0, 1.0, &mut seed);
                push(g("attn_k_norm.weight"), vec![kv], 1.0, 1.0, &mut seed);
            }
        }
        push(g("attn_output.weight"), vec![HIDDEN, q], 0.4, 0.0, &mut seed);
        push(g("ffn_norm.weight"), vec![HIDDEN], 0.2, 1.0, &mut seed);
        let mut mats = |rows, cols| (0..EXPERTS).map(|_| random(&mut seed, rows * cols, 0.6)).collect::<Vec<_>>();
        experts.push([mats(INTER, HIDDEN), mats(INTER, HIDDEN), mats(HIDDEN, INTER)]);
    }
    push("output_norm.weight".into(), vec![HIDDEN], 0.2, 1.0, &mut seed);
    push("output.weight".into(), vec![vocab, HIDDEN], 0.4, 0.0, &mut seed);
    (t, experts)
}

fn meta(arch: &str, shape: Shape, inter: usize, experts: Option<(usize, usize)>) -> Vec<(&'static str, Value)> {
    let k = |s: &str| key(arch, s);
    let mut m = vec![
        ("general.architecture", Value::String(arch.into())),
        (k("embedding_length"), Value::U32(HIDDEN as u32)),
        (k("feed_forward_length"), Value::U32(inter as u32)),
        (k("block_count"), Value::U32(2)),
        (k("attention.head_count"), Value::U32(shape.heads as u32)),
        (k("attention.head_count_kv"), Value::U32(shape.kv_heads as u32)),
        (k("attention.key_length"), Value::U32(shape.hd as u32)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
        (k("rope.freq_base"), Value::F32(10_000.0)),
        (k("context_length"), Value::U32(CONTEXT as u32)),
    ];
    if let Some((count, used)) = experts {
        m.push((k("expert_count"), Value::U32(count as u32)));
        m.push((k("expert_used_count"), Value::U32(used as u32)));
        if arch == "qwen3moe" {
            // Qwen3-MoE's files give the experts' width apart from a (here larger, unused) dense one.
            m[2] = (k("feed_forward_length"), Value::U32(4 * inter as u32));
            m.push((k("expert_feed_forward_length"), Value::U32(inter as u32)));
        }
    }
    m
}

/// Write the mixture-of-experts file (`arch`, zero routers, experts stacked in `ty`) and its dense equivalent
/// (`dense_arch`: experts 0 and 1 as one MLP of twice the width, downs times `weight`).
fn write_pair(
    dir: &std::path::Path,
    arch: &str,
    dense_arch: &str,
    shape: Shape,
    norm: QkNorm,
    weight: f32,
    ty: GgmlDType,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let vocab = common::gguf_tokens().len();
    let (base, experts) = common_weights(shape, norm, vocab);
    let mut moe = base.clone();
    let mut dense = base;
    for (i, [gate, up, down]) in experts.iter().enumerate() {
        let g = |s: &str| format!("blk.{i}.{s}");
        moe.push((g("ffn_gate_inp.weight"), vec![EXPERTS, HIDDEN], vec![0.0; EXPERTS * HIDDEN], GgmlDType::F32));
        moe.push((g("ffn_gate_exps.weight"), vec![EXPERTS, INTER, HIDDEN], gate.concat(), ty));
        moe.push((g("ffn_up_exps.weight"), vec![EXPERTS, INTER, HIDDEN], up.concat(), ty));
        moe.push((g("ffn_down_exps.weight"), vec![EXPERTS, HIDDEN, INTER], down.concat(), ty));
        dense.push((g("ffn_gate.weight"), vec![2 * INTER, HIDDEN], [&gate[0][..], &gate[1]].concat(), ty));
        dense.push((g("ffn_up.weight"), vec![2 * INTER, HIDDEN], [&up[0][..], &up[1]].concat(), ty));
        // Row r of the dense down: row r of expert 0's down, then row r of expert 1's, times the weight.
        let side: Vec<f32> = (0..HIDDEN)
            .flat_map(|r| down[0][r * INTER..(r + 1) * INTER].iter().chain(&down[1][r * INTER..(r + 1) * INTER]))
            .map(|v| v * weight)
            .collect();
        dense.push((g("ffn_down.weight"), vec![HIDDEN, 2 * INTER], side, ty));
    }
    let (moe_file, dense_file) = (dir.join(format!("{arch}.gguf")), dir.join(format!("{arch}-dense.gguf")));
    write_gguf(&moe_file, meta(arch, shape, INTER, Some((EXPERTS, 2))), &moe);
    write_gguf(&dense_file, meta(dense_arch, shape, 2 * INTER, None), &dense);
    (moe_file, dense_file)
}

fn prompt() -> Vec<u32> {
    (0..40u32).map(|i| (i * 53 + 7) % 256).collect()
}

/// The mixture and its dense equivalent give the same logits.
fn matches_dense(arch: &str, dense_arch: &str, shape: Shape, norm: QkNorm, weight: f32, ty: GgmlDType) {
    let dir = tempfile::tempdir().unwrap();
    let (moe_file, dense_file) = write_pair(dir.path(), arch, dense_arch, shape, norm, weight, ty);
    let moe = gguf::load(&moe_file).unwrap();
    assert_eq!(moe.family, arch);
    let m = moe.llama.config().moe.expect("a mixture of experts");
    assert_eq!((m.experts, m.used, moe.llama.config().intermediate), (EXPERTS, 2, INTER));
    let dense = gguf::load(&dense_file).unwrap();
    let (a, b) = (logits(&moe.llama, &prompt()), logits(&dense.llama, &prompt()));
    let (diff, scale) = max_diff(&a, &b);
    assert!(diff < 2e-4 * scale.max(1.0), "{arch} ({ty:?}): {diff} from its dense equivalent (largest {scale})");
}

#[test]
fn a_mixtral_style_llama_file_runs_its_first_two_experts_as_their_dense_sum_says() {
    let shape = Shape { heads: 4, kv_heads: 2, hd: 16 };
    matches_dense("llama", "llama", shape, QkNorm::None, 0.5, GgmlDType::F32);
}

#[test]
fn stacked_experts_are_cut_in_their_quantized_format() {
    let shape = Shape { heads: 4, kv_heads: 2, hd: 16 };
    matches_dense("llama", "llama", shape, QkNorm::None, 0.5, GgmlDType::Q8_0);
    let moe = {
        let dir = tempfile::tempdir().unwrap();
        let (f, _) = write_pair(dir.path(), "llama", "llama", shape, QkNorm::None, 0.5, GgmlDType::Q8_0);
        gguf::load(&f).unwrap()
    };
    // Held as the file stores them: 4 experts x 3 matrices x 2 layers of Q8_0, no widened copy.
    let q8 = moe.llama.weight_bytes_by_format().get("Q8_0").copied().unwrap_or(0);
    assert_eq!(q8, 2 * 3 * EXPERTS * INTER * HIDDEN / 32 * 34);
}

#[test]
fn a_qwen3_moe_file_norms_each_head_and_renormalizes_its_choice() {
    let shape = Shape { heads: 4, kv_heads: 2, hd: 16 };
    matches_dense("qwen3moe", "qwen3", shape, QkNorm::PerHead, 0.5, GgmlDType::F32);
}

#[test]
fn an_olmoe_file_norms_whole_rows_and_keeps_softmax_weights() {
    // One head each, so that Qwen3's per-head norm is OLMoE's whole-row one and the dense form can say it; 1/4:
    // softmax over four equal scores, not renormalized over the two chosen.
    let shape = Shape { heads: 1, kv_heads: 1, hd: 64 };
    matches_dense("olmoe", "qwen3", shape, QkNorm::Full, 0.25, GgmlDType::F32);
}

#[test]
fn an_olmoe_file_keeps_its_norms_as_wide_as_the_rows() {
    let dir = tempfile::tempdir().unwrap();
    let shape = Shape { heads: 4, kv_heads: 2, hd: 16 };
    let (file, _) = write_pair(dir.path(), "olmoe", "qwen3", shape, QkNorm::Full, 0.25, GgmlDType::F32);
    let model = gguf::load(&file).unwrap();
    let first = &model.llama.layers()[0];
    let (qn, kn) = first.qk_norm.as_ref().unwrap();
    assert_eq!((qn.len(), kn.len()), (64, 32));
}

/// A model with a real (random) router: rows pick different experts.
fn routed(dir: &std::path::Path) -> zl_worker::model::LoadedModel {
    let shape = Shape { heads: 4, kv_heads: 2, hd: 16 };
    let vocab = common::gguf_tokens().len();
    let (mut t, experts) = common_weights(shape, QkNorm::PerHead, vocab);
    let mut seed = 99;
    for (i, [gate, up, down]) in experts.iter().enumerate() {
        let g = |s: &str| format!("blk.{i}.{s}");
        t.push((
            g("ffn_gate_inp.weight"),
            vec![EXPERTS, HIDDEN],
            random(&mut seed, EXPERTS * HIDDEN, 2.0),
            GgmlDType::F32,
        ));
        t.push((g("ffn_gate_exps.weight"), vec![EXPERTS, INTER, HIDDEN], gate.concat(), GgmlDType::Q8_0));
        t.push((g("ffn_up_exps.weight"), vec![EXPERTS, INTER, HIDDEN], up.concat(), GgmlDType::Q8_0));
        t.push((g("ffn_down_exps.weight"), vec![EXPERTS, HIDDEN, INTER], down.concat(), GgmlDType::Q8_0));
    }
    let file = dir.join("routed.gguf");
    write_gguf(&file, meta("qwen3moe", shape, INTER, Some((EXPERTS, 2))), &t);
    gguf::load(&file).unwrap()
}

#[test]
fn a_sequence_gets_the_same_logits_alone_and_in_a_batch_whose_rows_pick_other_experts() {
    let dir = tempfile::tempdir().unwrap();
    let model = routed(dir.path()).llama;
    let prompts: [Vec<u32>; 3] = [prompt(), (0..23u32).map(|i| (i * 31 + 3) % 256).collect(), vec![65, 66, 67]];
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| logits(&model, p)).collect();
    let mut kv = KvStore::new(model.config(), 32, 16);
    let mut pool = BlockPool::new(32, 16);
    let seqs: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut s = pool.start(p);
            pool.reserve(&mut s, p.len()).unwrap();
            s
        })
        .collect();
    let items: Vec<BatchItem<'_>> = prompts
        .iter()
        .zip(&seqs)
        .map(|(p, s)| BatchItem {
            tokens: p,
            start: 0,
            blocks: s.table(),
            window_blocks: &[],
            logits: 1,
            adapter: None,
        })
        .collect();
    let together = model.forward(&items, &mut kv);
    let vocab = model.config().vocab;
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(&together[i * vocab..(i + 1) * vocab], &want[..], "sequence {i}");
    }
}

#[test]
fn other_mixture_of_experts_architectures_are_refused_in_one_line_naming_what_runs() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen2moe", "deepseek2", "gpt-oss"] {
        let file = dir.path().join(format!("{arch}.gguf"));
        let shape = Shape { heads: 4, kv_heads: 2, hd: 16 };
        write_gguf(&file, meta(arch, shape, INTER, Some((EXPERTS, 2))), &[]);
        let err = gguf::load(&file).unwrap_err().to_string();
        assert!(!err.contains('\n'), "{err}");
        assert!(err.contains(&format!("{arch:?}")) && err.contains("qwen3moe") && err.contains("olmoe"), "{err}");
    }
}

#[test]
fn adapters_apply_to_a_mixture_of_experts_attention_and_are_refused_on_its_mlps() {
    use common::lora::{random_updates, write_peft};
    use zl_worker::model::lora::Target;
    use zl_worker::model::lora_load::{self, Base};
    let dir = tempfile::tempdir().unwrap();
    let model = routed(dir.path());
    let base = Base { config: model.llama.config(), family: &model.family };
    let attention = random_updates(model.llama.config(), &[Target::Q, Target::V, Target::O], 4, 5, 0.5);
    write_peft(&dir.path().join("attn"), &attention, 8.0, false);
    let adapter = lora_load::load(&dir.path().join("attn"), base).unwrap().adapter;
    let (plain, adapted) =
        (logits(&model.llama, &prompt()), common::logits_with(&model.llama, Some(&adapter), &prompt()));
    let (diff, scale) = max_diff(&adapted, &plain);
    assert!(diff > 1e-3 * scale, "the adapter changed nothing ({diff} of {scale})");
    let mlp = random_updates(model.llama.config(), &[Target::Q, Target::Up], 4, 6, 0.5);
    write_peft(&dir.path().join("mlp"), &mlp, 8.0, false);
    let err = lora_load::load(&dir.path().join("mlp"), base).unwrap_err().to_string();
    assert!(err.contains("mixture of experts") && err.contains("attention"), "{err}");
}
