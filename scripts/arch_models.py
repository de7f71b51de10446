#!/usr/bin/env python3
"""Tiny random-weight GGUF models of the architectures zerolayer runs beyond the bundled one, for comparing its
forward pass with llama.cpp's on the same files (`zl-worker eval --perplexity TEXT --model FILE --reference
llama.cpp`): a Llama with Llama 3.1 RoPE scaling written out as `rope_freqs.weight` (as llama.cpp's converter
does), a Llama with linear RoPE scaling, a Qwen3 (per-head q/k RMSNorm, NeoX RoPE), a Qwen3 with YaRN scaling (factor 4 over a 128-token pretraining
context, as Qwen's long-context setting writes it), and a Phi-3 (fused QKV and
gate-up matrices, LongRoPE: long factors, since it serves 2,048 tokens of a 256-token pretraining context, and its
attn_factor), and three mixtures of experts (8 experts, 2 per token, a random router): a Mixtral-style Llama, a
Qwen3-MoE (its experts' own width, per-head q/k norms) and an OLMoE (q/k norms over whole rows, softmax weights
not renormalized). The tokenizer is SmolLM2's,
copied from the bundled file, so both engines read the same tokens. Fixed seeds; written to OUT_DIR.

Usage: scripts/arch_models.py BUNDLED.gguf OUT_DIR [NAME ...]   (needs PyPI's gguf and numpy; names: the files'
without .gguf, default all)
"""
import math
import os
import sys

import numpy as np
import gguf

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 2, 4, 2, 64


def tokenizer(writer, bundled):
    r = gguf.GGUFReader(bundled)
    f = r.fields
    writer.add_tokenizer_model(f["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(f["tokenizer.ggml.pre"].contents())
    writer.add_token_list(f["tokenizer.ggml.tokens"].contents())
    writer.add_token_types(f["tokenizer.ggml.token_type"].contents())
    writer.add_token_merges(f["tokenizer.ggml.merges"].contents())
    writer.add_bos_token_id(f["tokenizer.ggml.bos_token_id"].contents())
    writer.add_eos_token_id(f["tokenizer.ggml.eos_token_id"].contents())
    if "tokenizer.chat_template" in f:
        writer.add_chat_template(f["tokenizer.chat_template"].contents())
    return len(f["tokenizer.ggml.tokens"].contents())


def llama3_factors(theta, factor=8.0, low=1.0, high=4.0, original=128):
    """Llama 3.1's per-frequency divisors, as llama.cpp's converter writes them."""
    out = []
    for i in range(HEAD_DIM // 2):
        freq = theta ** (-2.0 * i / HEAD_DIM)
        wavelen = 2 * math.pi / freq
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


EXPERTS, USED = 8, 2


def write(path, arch, bundled, seed, rope=None, rotary=None):
    rotary = rotary or HEAD_DIM
    moe = arch in ("qwen3moe", "olmoe") or arch == "mixtral"
    if arch == "mixtral":
        arch = "llama"
    # OLMoE has no grouped-query attention (llama.cpp sizes its key norm to the full width).
    kv_heads = HEADS if arch == "olmoe" else KV_HEADS
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    vocab = tokenizer(w, bundled)
    theta = 10000.0
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if moe:
        w.add_expert_count(EXPERTS)
        w.add_expert_used_count(USED)
        if arch == "qwen3moe":
            w.add_expert_feed_forward_length(INTER // 2)
    if rope == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(4.0)
    if rope == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(128)
    if arch == "phi3":
        w.add_rope_dimension_count(rotary)
        w.add_rope_scaling_orig_ctx_len(256)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(2048 / 256) / math.log(256)))

    def mat(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * scale / math.sqrt(cols)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", (rng.standard_normal((vocab, HIDDEN)) * 0.5).astype(np.float16))
    if rope == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(theta))
    if arch == "phi3":
        half = np.arange(rotary // 2, dtype=np.float32)
        w.add_tensor("rope_factors_long.weight", (1.0 + 0.3 * half).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", (1.0 + 0.01 * half).astype(np.float32))
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(HIDDEN))
        q, k, v = mat(HEADS * HEAD_DIM, HIDDEN, 2.0), mat(kv_heads * HEAD_DIM, HIDDEN, 2.0), mat(kv_heads * HEAD_DIM, HIDDEN)
        if arch == "phi3":
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([q, k, v]))
        else:
            w.add_tensor(p + "attn_q.weight", q)
            w.add_tensor(p + "attn_k.weight", k)
            w.add_tensor(p + "attn_v.weight", v)
        if arch in ("qwen3", "qwen3moe"):
            w.add_tensor(p + "attn_q_norm.weight", norm(HEAD_DIM))
            w.add_tensor(p + "attn_k_norm.weight", norm(HEAD_DIM))
        if arch == "olmoe":
            w.add_tensor(p + "attn_q_norm.weight", norm(HEADS * HEAD_DIM))
            w.add_tensor(p + "attn_k_norm.weight", norm(kv_heads * HEAD_DIM))
        w.add_tensor(p + "attn_output.weight", mat(HIDDEN, HEADS * HEAD_DIM))
        w.add_tensor(p + "ffn_norm.weight", norm(HIDDEN))
        if moe:
            inter = INTER // 2 if arch == "qwen3moe" else INTER
            stack = lambda rows, cols: np.stack([mat(rows, cols) for _ in range(EXPERTS)])
            w.add_tensor(p + "ffn_gate_inp.weight", mat(EXPERTS, HIDDEN, 4.0).astype(np.float32))
            w.add_tensor(p + "ffn_gate_exps.weight", stack(inter, HIDDEN))
            w.add_tensor(p + "ffn_up_exps.weight", stack(inter, HIDDEN))
            w.add_tensor(p + "ffn_down_exps.weight", stack(HIDDEN, inter))
            continue
        gate, up = mat(INTER, HIDDEN), mat(INTER, HIDDEN)
        if arch == "phi3":
            w.add_tensor(p + "ffn_up.weight", np.concatenate([gate, up]))
        else:
            w.add_tensor(p + "ffn_gate.weight", gate)
            w.add_tensor(p + "ffn_up.weight", up)
        w.add_tensor(p + "ffn_down.weight", mat(HIDDEN, INTER))
    w.add_tensor("output_norm.weight", norm(HIDDEN))
    w.add_tensor("output.weight", mat(vocab, HIDDEN, 1.0))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# name: (architecture, seed, keyword arguments of `write`)
MODELS = {
    "llama3-rope": ("llama", 1, {"rope": "llama3"}),
    "llama-linear-rope": ("llama", 2, {"rope": "linear"}),
    "qwen3": ("qwen3", 3, {}),
    "llama-plain": ("llama", 4, {}),
    "phi3-longrope": ("phi3", 5, {}),
    "qwen3-yarn": ("qwen3", 6, {"rope": "yarn"}),
    # Phi-4-mini's shape of RoPE: three quarters of each head turn (partial rotary), with LongRoPE.
    "phi3-partial-rotary": ("phi3", 7, {"rotary": HEAD_DIM * 3 // 4}),
    "mixtral": ("mixtral", 8, {}),
    "qwen3moe": ("qwen3moe", 9, {}),
    "olmoe": ("olmoe", 10, {}),
}


def main():
    bundled, out, names = sys.argv[1], sys.argv[2], sys.argv[3:] or list(MODELS)
    os.makedirs(out, exist_ok=True)
    for name in names:
        arch, seed, kw = MODELS[name]
        write(os.path.join(out, name + ".gguf"), arch, bundled, seed, **kw)


if __name__ == "__main__":
    main()
