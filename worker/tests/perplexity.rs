//! Perplexity on the bundled model over the project's own writing (worker/eval/corpus.md): the quantized path
//! scores the text about as well as the float reference path. The full measurement (`zl-worker eval
//! --perplexity`, docs/worker.md) uses more text; this keeps to a few chunks so the test stays short.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use zl_worker::eval::perplexity;
use zl_worker::fetch;
use zl_worker::model::llama::KvDtype;
use zl_worker::model::{Precision, gguf, load_with};

#[test]
fn the_quantized_path_scores_text_about_as_well_as_the_float_reference() {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eval/corpus.md")).unwrap();
    let bos = gguf::bos_token(&path).unwrap();
    let score = |precision| {
        let model = load_with(&path, precision).unwrap();
        let tokens = model.tokenizer.encode(&text).unwrap();
        // Three chunks of 256 tokens.
        perplexity(&model.llama, &tokens[..tokens.len().min(3 * 256)], 256, bos, KvDtype::F16).unwrap()
    };
    let (native, float) = (score(Precision::Native), score(Precision::Float));
    eprintln!("perplexity: native {native:?}, float {float:?}");
    // As llama.cpp: of each chunk's second half, every token but the first (its logits come from the first half).
    assert_eq!((native.chunks, native.scored), (3, 3 * 127));
    assert!(float.value.is_finite() && float.value > 1.0, "{float:?}");
    // A sound model path is far below a uniform guess over the vocabulary (49,152 tokens).
    assert!(float.value < 1000.0, "{float:?}");
    let ratio = native.value / float.value;
    // The target: within 2% (16-bit activations measure +0.00% on the full corpus; 8-bit ones were +1.44%).
    assert!((0.98..1.02).contains(&ratio), "native {} vs float {}: {ratio}", native.value, float.value);
}

/// The bundled model's perplexity on two chunks of 512 tokens of the corpus (the second half of each attends over
/// 256-511 cached positions) with an f16 cache and with `dtype`, checked to score the same tokens; their ratio.
fn kv_ratio(dtype: KvDtype) -> f64 {
    let path = fetch::ensure_default_model(&fetch::cache_dir(), &mut |m| eprintln!("{m}")).unwrap();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eval/corpus.md")).unwrap();
    let bos = gguf::bos_token(&path).unwrap();
    let model = load_with(&path, Precision::Native).unwrap();
    let tokens = model.tokenizer.encode(&text).unwrap();
    let tokens = &tokens[..tokens.len().min(2 * 512)];
    let f16 = perplexity(&model.llama, tokens, 512, bos, KvDtype::F16).unwrap();
    let other = perplexity(&model.llama, tokens, 512, bos, dtype).unwrap();
    eprintln!("perplexity: f16 KV {f16:?}, {} KV {other:?}", dtype.name());
    assert_eq!((other.chunks, other.scored), (f16.chunks, f16.scored));
    // Not the same bits (the cache holds other values), but nearly the same figure.
    assert_ne!(other.value, f16.value);
    other.value / f16.value
}

#[test]
fn an_8_bit_kv_cache_scores_text_within_half_a_percent_of_f16() {
    let ratio = kv_ratio(KvDtype::Q8);
    assert!((0.995..1.005).contains(&ratio), "q8 / f16: {ratio}");
}

#[test]
fn a_4_bit_kv_cache_turned_by_hadamard_scores_text_within_four_percent_of_f16() {
    // Measured +2.7% here, +4.7% on the whole corpus, where llama.cpp's own rotated q4_0 cache costs +5.3% on
    // the same file (docs/worker.md, "--kv-dtype q4"); without the rotation this was +20%.
    let ratio = kv_ratio(KvDtype::Q4);
    assert!((1.0..1.04).contains(&ratio), "q4 / f16: {ratio}");
}
