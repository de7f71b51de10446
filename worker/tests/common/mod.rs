//! What the worker's model tests share: a byte-level vocabulary in GGUF and tokenizer.json form, a GGUF writer
//! for f32 and quantized tensors, and one forward pass's logits.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use zl_worker::engine::{EngineCore, Event};
use zl_worker::kv::pool::BlockPool;
use zl_worker::model::llama::{BatchItem, KvStore, Llama};
use zl_worker::model::lora::LoraAdapter;

pub(crate) mod lora;

/// Byte-level tokens (GPT-2's alphabet, in byte order) and two specials, as a GGUF vocabulary lists them.
pub(crate) fn gguf_tokens() -> Vec<String> {
    let mut t: Vec<String> = (0..=255u8)
        .map(|b| {
            let c = match b {
                b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff => char::from(b),
                _ => char::from_u32(256 + u32::from(b)).unwrap(),
            };
            c.to_string()
        })
        .collect();
    t.push("<|im_start|>".into());
    t.push("<|im_end|>".into());
    t
}

/// The same vocabulary as a Hugging Face tokenizer.
pub(crate) fn hf_tokenizer() -> Tokenizer {
    let vocab: Vocab = gguf_tokens().into_iter().take(256).enumerate().map(|(i, c)| (c, i as u32)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, vec![]).build().unwrap();
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    tok.add_special_tokens([AddedToken::from("<|im_start|>", true), AddedToken::from("<|im_end|>", true)]).unwrap();
    tok
}

/// Fixed-seed values in `[-scale / 2, scale / 2)`.
pub(crate) fn random(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5) * scale
        })
        .collect()
}

/// A GGUF file with `meta` (the vocabulary's keys added) and tensors, each `(name, shape, values, type)`.
pub(crate) fn write_gguf(path: &Path, meta: Vec<(&str, Value)>, tensors: &[(String, Vec<usize>, Vec<f32>, GgmlDType)]) {
    let toks = gguf_tokens();
    let eos = toks.len() as u32 - 1;
    let mut meta = meta;
    meta.push(("tokenizer.ggml.model", Value::String("gpt2".into())));
    meta.push(("tokenizer.ggml.tokens", Value::Array(toks.into_iter().map(Value::String).collect())));
    meta.push(("tokenizer.ggml.merges", Value::Array(vec![])));
    meta.push(("tokenizer.ggml.eos_token_id", Value::U32(eos)));
    let q: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|(name, shape, values, ty)| {
            let t = Tensor::from_vec(values.clone(), shape.clone(), &Device::Cpu).unwrap();
            (name.clone(), QTensor::quantize(&t, *ty).unwrap())
        })
        .collect();
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut file, &meta_refs, &tensor_refs).unwrap();
}

/// The logits of the last of `tokens`, prefilled in one step.
pub(crate) fn logits(model: &Llama, tokens: &[u32]) -> Vec<f32> {
    logits_with(model, None, tokens)
}

/// [`logits`] with `adapter` applied.
pub(crate) fn logits_with(model: &Llama, adapter: Option<&LoraAdapter>, tokens: &[u32]) -> Vec<f32> {
    let mut kv = KvStore::new(model.config(), 16, 16);
    let mut pool = BlockPool::new(16, 16);
    let mut seq = pool.start(tokens);
    pool.reserve(&mut seq, tokens.len()).unwrap();
    let item = BatchItem { tokens, start: 0, blocks: seq.table(), window_blocks: &[], logits: 1, adapter };
    model.forward(&[item], &mut kv)
}

/// The largest absolute difference of two logit rows, and the largest absolute logit of the second.
pub(crate) fn max_diff(a: &[f32], b: &[f32]) -> (f32, f32) {
    let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    (diff, b.iter().fold(0f32, |m, v| m.max(v.abs())))
}

/// The tokens of a chat: `system`, then `user`'s message, rendered with the model's template.
pub(crate) fn chat_prompt(tok: &zl_text::TextTokenizer, system: &str, user: &str) -> Vec<u32> {
    let messages = [
        zl_text::ChatMessage { role: "system".into(), content: system.into() },
        zl_text::ChatMessage { role: "user".into(), content: user.into() },
    ];
    tok.encode(&tok.render_chat(&messages).unwrap()).unwrap()
}

/// Run until every sequence finishes; returns each sequence's tokens and text.
pub(crate) fn run_all(engine: &mut EngineCore) -> HashMap<u64, (Vec<u32>, String)> {
    run_ended(engine).into_iter().map(|(seq, (tokens, text, _))| (seq, (tokens, text))).collect()
}

/// [`run_all`], with whether each sequence ended on its own (its end of turn, not `max_tokens` or a stop).
pub(crate) fn run_ended(engine: &mut EngineCore) -> HashMap<u64, (Vec<u32>, String, bool)> {
    let mut out: HashMap<u64, (Vec<u32>, String, bool)> = HashMap::new();
    for _ in 0..100_000 {
        if !engine.has_work() {
            break;
        }
        for ev in engine.step() {
            match ev {
                Event::Token { seq, token, text, .. } => {
                    let e = out.entry(seq).or_default();
                    e.0.push(token);
                    e.1.push_str(&text);
                }
                Event::Finished { seq, text, reason, .. } => {
                    let e = out.entry(seq).or_default();
                    e.1.push_str(&text);
                    e.2 = reason == zl_wire::message::StopReason::EndTurn;
                }
                Event::Prompt { .. } => {}
            }
        }
    }
    assert!(!engine.has_work(), "engine did not finish");
    out
}
