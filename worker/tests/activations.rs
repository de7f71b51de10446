//! 8-bit activations (`zl-worker serve --activations`, docs/worker.md "8-bit activations") on a real Q4_K_M file
//! (Gemma 3 270M: Q4_K, Q5_0, Q6_K and Q8_0 matrices, `scripts/fetch-test-models`): which matrices take them, a
//! perplexity within the rule's 0.5% of the 16-bit path, and an answer that is the same alone as in a batch.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;

use zl_worker::eval::{answers, perplexity};
use zl_worker::model::kernels::Activations;
use zl_worker::model::llama::KvDtype;
use zl_worker::model::{LoadedModel, Precision, gguf};

fn load() -> LoadedModel {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-test-models (scripts/test does)", path.display());
    gguf::load_with(&path, Precision::Native).unwrap()
}

#[test]
fn eight_bit_activations_cost_under_half_a_percent_and_answer_alike_alone_and_batched() {
    let sixteen = load();
    // `auto`: the formats of `EIGHT_BY_DEFAULT` (here Q4_K, Q5_0 and Q6_K; not Q8_0); `8`: every matrix whose
    // format has 8-bit kernels (all of this file's: Q4_K, Q5_0, Q6_K, Q8_0); 16: none.
    let mut auto = load();
    let by = auto.llama.weight_bytes_by_format();
    let want = (by["Q4_K"] + by["Q5_0"] + by["Q6_K"]) as f64 / by.values().sum::<usize>() as f64;
    let share = auto.llama.set_activations(Activations::Eight, Activations::EIGHT_BY_DEFAULT);
    assert!((share - want).abs() < 1e-9 && share < 0.5, "auto: {share} of the bytes, not {want}");
    let mut eight = load();
    assert_eq!(eight.llama.set_activations(Activations::Eight, &[]), 1.0);
    assert_eq!(load().llama.set_activations(Activations::Sixteen, &[]), 1.0);
    // The bundled model (Q4_1, where the rule fails, and Q8_0) keeps 16 bits under `auto`.
    let bundled = zl_worker::fetch::ensure_default_model(&zl_worker::fetch::cache_dir(), &mut |_| {}).unwrap();
    let mut bundled = gguf::load_with(&bundled, Precision::Native).unwrap();
    assert_eq!(bundled.llama.set_activations(Activations::Eight, Activations::EIGHT_BY_DEFAULT), 0.0);

    // The rule's perplexity bound (its KL half needs llama.cpp: `scripts/eval-activations`).
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eval/corpus.md")).unwrap();
    let tokens = sixteen.tokenizer.encode(std::str::from_utf8(&text.as_bytes()[..7000]).unwrap()).unwrap();
    let score = |m: &LoadedModel| perplexity(&m.llama, &tokens, 512, Some(2), KvDtype::F16).unwrap().value;
    let base = score(&sixteen);
    for (name, model) in [("auto", &auto), ("8", &eight)] {
        let p = score(model);
        eprintln!("perplexity: 16-bit {base:.4}, {name} {p:.4}");
        assert!((p / base - 1.0).abs() < 0.005, "{name}: {p} against the 16-bit path's {base}");
        assert_ne!(p, base, "{name}: the 8-bit path ran");
    }

    // Batch invariance: a prompt answered greedily alone, and beside three others of other lengths.
    let prompts: Vec<Vec<u32>> = ["The Eiffel Tower is in", "Water boils at", "The largest planet is", "Once upon a"]
        .iter()
        .map(|p| std::iter::once(2).chain(eight.tokenizer.encode(p).unwrap()).collect())
        .collect();
    let alone = answers::greedy(&eight.llama, &prompts[..1], 12, &[]);
    let batched = answers::greedy(&eight.llama, &prompts, 12, &[]);
    assert_eq!(alone[0], batched[0]);
}
