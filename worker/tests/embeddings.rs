//! Embedding models against llama.cpp's `llama-embedding` on the same files: a BERT (CLS pooling), a nomic-bert
//! (mean pooling) and a Qwen3-Embedding-style decoder (last-token pooling), random weights written by
//! `scripts/embed_models.py` with PyPI's `gguf` (fixed seeds, so the same bytes every time). Each vector must be
//! within cosine 0.999 of llama.cpp's: the vectors `llama-embedding` gave for these files, recorded in
//! `tests/data/embeddings.json` beside the SHA-256 of each file they are for (the test checks the generator still
//! writes those bytes). `ZL_RECORD_EMBEDDINGS=1`, with llama.cpp built (`scripts/llama-cpp`), runs it again and
//! records what it gives. The comparison never runs llama.cpp itself: its log thread can leave its output
//! unwritten, and no test may depend on that.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use zl_worker::model::Precision;
use zl_worker::model::embed::{self, EmbeddingModel, Pooling};

const MODELS: [(&str, Pooling); 3] =
    [("bert-embed", Pooling::Cls), ("nomic-embed", Pooling::Mean), ("qwen3-embed", Pooling::Last)];

const INPUTS: [&str; 4] = [
    "The capital of France is Paris.",
    "hello world",
    "A quick brown fox jumps over the lazy dog!",
    "Embedding models turn text into vectors; similar meaning, similar vectors, different meaning far apart.",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/embeddings.json")
}

/// The three files, written once into a temporary directory.
fn write_models(dir: &Path) {
    let bundled = zl_worker::fetch::ensure_default_model(&zl_worker::fetch::cache_dir(), &mut |_| {}).unwrap();
    let out = Command::new(root().join(".venv/bin/python"))
        .arg(root().join("scripts/embed_models.py"))
        .arg(&bundled)
        .arg(dir)
        .output()
        .expect("the test tools' Python (scripts/test installs it)");
    assert!(out.status.success(), "embed_models.py: {}", String::from_utf8_lossy(&out.stderr));
}

fn sha256(path: &Path) -> String {
    zl_common::keys::hex(&zl_worker::fetch::sha256_files(&[path.to_owned()]).unwrap())
}

/// llama.cpp's vector for each of [`INPUTS`] (the file's pooling, L2-normalised), one run per input (recording
/// only, never in CI). llama-embedding prints through its asynchronous log thread, which sometimes exits before
/// writing (empty or cut output on a pipe): a run whose output is not whole JSON is run again, up to 20 times.
fn llama_embedding(model: &Path) -> Vec<Vec<f32>> {
    let bin = root().join(".tools/llama.cpp/bin/llama-embedding");
    assert!(bin.exists(), "ZL_RECORD_EMBEDDINGS needs llama.cpp built (scripts/llama-cpp)");
    let once = |input: &str| -> Option<Vec<f32>> {
        let out = Command::new("stdbuf")
            .arg("-o0")
            .arg(&bin)
            .arg("-m")
            .arg(model)
            .args(["-p", input, "--embd-output-format", "json", "-t", "2", "-c", "512"])
            .output()
            .unwrap();
        assert!(out.status.success(), "llama-embedding: {}", String::from_utf8_lossy(&out.stderr));
        let doc: Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(doc["data"][0]["embedding"].as_array()?.iter().map(|x| x.as_f64().unwrap_or(f64::NAN) as f32).collect())
    };
    INPUTS
        .iter()
        .map(|input| (0..20).find_map(|_| once(input)).expect("llama-embedding wrote no whole output in 20 runs"))
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn embed_all(model: &mut EmbeddingModel, texts: &[&str]) -> Vec<Vec<f32>> {
    let tokens: Vec<Vec<u32>> = texts.iter().map(|t| model.tokenizer.encode_document(t).unwrap()).collect();
    let refs: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
    model.embed(&refs)
}

#[test]
fn vectors_match_llama_cpp_within_cosine_0_999_batched_or_alone() {
    let dir = tempfile::tempdir().unwrap();
    write_models(dir.path());
    let record = std::env::var_os("ZL_RECORD_EMBEDDINGS").is_some();
    let recorded: Value =
        if record { json!({}) } else { serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap() };
    let mut fresh = serde_json::Map::new();
    for (name, pooling) in MODELS {
        let path = dir.path().join(format!("{name}.gguf"));
        assert!(embed::is_embedding(&path).unwrap(), "{name} is an embedding model");
        let sha = sha256(&path);
        let reference: Vec<Vec<f32>> = if record {
            llama_embedding(&path)
        } else {
            let r = &recorded[name];
            assert_eq!(r["sha256"], sha, "{name}: the generator wrote other bytes than the recorded vectors are for");
            serde_json::from_value(r["vectors"].clone()).unwrap()
        };
        fresh.insert(name.into(), json!({"sha256": sha, "vectors": reference}));
        let mut model = embed::load(&path, Precision::Native).unwrap();
        assert_eq!(model.pooling, pooling, "{name}: the file's pooling");
        let batched = embed_all(&mut model, &INPUTS);
        assert_eq!(batched.len(), reference.len());
        for (i, (ours, theirs)) in batched.iter().zip(&reference).enumerate() {
            assert_eq!(ours.len(), theirs.len(), "{name}: width");
            let c = cosine(ours, theirs);
            eprintln!("{name} input {i}: cosine {c:.7} with llama.cpp");
            assert!(c >= 0.999, "{name} input {i}: cosine {c} with llama.cpp's vector");
            let norm = ours.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5, "{name} input {i}: unit length, not {norm}");
            // Batch-invariant: alone, the same bits.
            assert_eq!(&embed_all(&mut model, &INPUTS[i..=i])[0], ours, "{name} input {i}: alone vs batched");
        }
        // Different texts, different vectors.
        assert!(cosine(&batched[0], &batched[1]) < 0.99, "{name}: distinct inputs give distinct vectors");
    }
    if record {
        std::fs::write(fixture(), serde_json::to_string(&Value::Object(fresh)).unwrap() + "\n").unwrap();
    }
}

#[test]
fn generative_files_are_not_embedding_models() {
    let bundled = zl_worker::fetch::ensure_default_model(&zl_worker::fetch::cache_dir(), &mut |_| {}).unwrap();
    assert!(!embed::is_embedding(&bundled).unwrap());
}
