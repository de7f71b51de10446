//! Gemma 3 270M (the pretrained model, not the instruction-tuned one), Q4_K_M (`scripts/fetch-test-models` puts it in `.tools/models/`; `scripts/test`
//! runs it first): a real file of a second architecture (interleaved sliding-window and global attention with
//! their own RoPE bases, per-head query/key norms, pre- and post-norms, GeGLU, scaled embeddings), a
//! SentencePiece vocabulary of 262,144 pieces, and llama.cpp's Q4_K_M mix of Q4_K, Q5_0, Q6_K, Q8_0 and F32
//! tensors, each kept in its own format. Its perplexity is checked against llama.cpp's on the same file and text.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;

use zl_text::ChatMessage;
use zl_worker::device::Device;
use zl_worker::engine::{EngineCore, Event, Request};
use zl_worker::eval::answers;
use zl_worker::eval::perplexity;
use zl_worker::model::llama::{KvDtype, KvStore};
use zl_worker::model::{Precision, gguf};
use zl_worker::sampling::Sampling;
use zl_worker::scheduler::SchedulerConfig;

fn model_path() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/models/gemma-3-270m-q4_k_m.gguf");
    assert!(path.exists(), "{} is missing: run scripts/fetch-test-models (scripts/test does)", path.display());
    path
}

/// llama.cpp's perplexity on the first 7,000 bytes of `worker/eval/corpus.md`, chunks of 512, this file:
/// `llama-perplexity -m gemma-3-270m-q4_k_m.gguf -f head.md -c 512 -b 512` with llama.cpp as vendored by
/// llama-cpp-python 0.3.36 (`scripts/llama-cpp`), on 2026-12-02 (AVX-512 machine; AVX2 gives the same to 4 digits).
const LLAMA_CPP_PERPLEXITY: f64 = 52.0490;

#[test]
fn gemma3_q4_k_m_loads_in_its_own_formats_and_scores_as_llama_cpp_does() {
    let path = model_path();
    let model = gguf::load_with(&path, Precision::Native).unwrap();
    assert_eq!(model.family, "gemma3");
    let cfg = model.llama.config();
    assert_eq!((cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.head_dim), (640, 18, 4, 1, 256));
    assert!(cfg.sliding.is_some() && cfg.is_local(0) && !cfg.is_local(5) && cfg.is_local(6));

    // Memory that matches the file: every matrix in the file's format, the weights within the file's size + 15%.
    let by = model.llama.weight_bytes_by_format();
    for format in ["Q4_K", "Q5_0", "Q6_K", "Q8_0"] {
        assert!(by.contains_key(format), "{format} missing from {by:?}");
    }
    assert!(!by.contains_key("F32"), "a matrix was widened to f32: {by:?}");
    let file = std::fs::metadata(&path).unwrap().len() as f64;
    let weights: usize = by.values().sum();
    assert!((weights as f64) < file * 1.15, "weights take {weights} bytes for a file of {file}");

    // The same text, the same chunks: within 1% of the reference engine.
    let text: String = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eval/corpus.md")).unwrap();
    let text = &text.as_bytes()[..7000];
    let tokens = model.tokenizer.encode(std::str::from_utf8(text).unwrap()).unwrap();
    let bos = gguf::bos_token(&path).unwrap();
    assert_eq!(bos, Some(2));
    let p = perplexity(&model.llama, &tokens, 512, bos, KvDtype::F16).unwrap();
    let ratio = p.value / LLAMA_CPP_PERPLEXITY;
    assert!((ratio - 1.0).abs() < 0.01, "perplexity {} against llama.cpp's {LLAMA_CPP_PERPLEXITY}", p.value);
}

#[test]
fn gemma3_tokenizes_renders_its_chat_format_and_completes() {
    let path = model_path();
    let model = gguf::load(&path).unwrap();
    let tok = &model.tokenizer;
    // SentencePiece round trip: spaces, accents, a character without a piece of its own (bytes), newlines.
    let text = "Zürich, 東京 and São Paulo\n\tend.";
    assert_eq!(tok.decode(&tok.encode(text).unwrap()).unwrap(), text);
    let chat = tok.render_chat(&[ChatMessage { role: "user".into(), content: "Hi".into() }]).unwrap();
    assert_eq!(chat, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    let ids = tok.encode(&chat).unwrap();
    assert_eq!(ids[0], 2, "<bos> is one token");
    let end = tok.encode("<end_of_turn>").unwrap();
    assert_eq!(end.len(), 1);
    assert!(tok.stop_ids.contains(&end[0]), "a turn ends the answer");
    // The portable form a frontend receives (one model card per frame) stays within the RPC frame limit, with room
    // for the template and the rest (14.4 MB of the 16 MiB: the merges are most of it).
    let parts = tok.to_parts().unwrap();
    let limit = zl_wire::HARD_MAX_PAYLOAD as usize - (1 << 20);
    assert!(parts.tokenizer_json.len() < limit, "{} bytes of tokenizer.json", parts.tokenizer_json.len());

    // A pretrained model completes text: greedily, the city.
    let mut prompt = vec![2];
    prompt.extend(tok.encode("The Eiffel Tower is located in the city of").unwrap());
    let answer = answers::greedy(&model.llama, &[prompt], 8, &tok.stop_ids);
    let text = tok.decode(&answer[0]).unwrap();
    assert!(text.starts_with(" Paris"), "{text:?}");
}

#[test]
fn gemma3_local_layers_hold_their_window_only_past_it_and_answer_as_with_every_position() {
    let path = model_path();
    let model = gguf::load(&path).unwrap();
    let config = SchedulerConfig::default();
    let sizing = KvStore::sizing(model.llama.config(), 16, config.max_running, config.max_item(), KvDtype::F16);
    let layout = sizing.layout(256 << 20).unwrap();
    let window = layout.window.expect("a 512-position window is kept apart");
    assert_eq!(window.window, 512);
    // 15 of the 18 layers are local: the window's share is what the sequences can hold at once.
    let windowed = KvStore::with_layout(model.llama.config(), &layout, 16).bytes();
    let full = KvStore::new(model.llama.config(), layout.blocks, 16).bytes();
    assert!(windowed * 3 < full, "{windowed} vs {full} bytes for {} tokens", layout.blocks * 16);

    // A prompt past the window: 40 tokens greedily, as the reference path (every position kept) answers.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/eval/corpus.md")).unwrap();
    let mut prompt = vec![2];
    prompt.extend(model.tokenizer.encode(&text[..3_600]).unwrap());
    assert!(prompt.len() > 700, "{} tokens", prompt.len());
    let want = answers::greedy(&model.llama, std::slice::from_ref(&prompt), 40, &[]);
    let mut engine = EngineCore::on_device(model, Device::Cpu, layout, 16, config).unwrap();
    engine.add(1, Request::new(prompt, Sampling::greedy(), 40)).unwrap();
    let (mut got, mut most) = (Vec::new(), 0);
    while engine.has_work() {
        for event in engine.step() {
            if let Event::Token { token, .. } = event {
                got.push(token);
            }
        }
        if !got.is_empty() {
            most = most.max(engine.window_blocks().unwrap().0);
        }
    }
    assert_eq!(got, want[0]);
    // Decoding, a row's window is 512 positions: 33 or 34 blocks of 16, against 48 to 50 for every position.
    assert!((32..=34).contains(&most), "{most} blocks held while decoding");
}
