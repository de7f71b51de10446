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


def tokenizer(writer, bundled, template=None):
    r = gguf.GGUFReader(bundled)
    f = r.fields
    writer.add_tokenizer_model(f["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(f["tokenizer.ggml.pre"].contents())
    writer.add_token_list(f["tokenizer.ggml.tokens"].contents())
    writer.add_token_types(f["tokenizer.ggml.token_type"].contents())
    writer.add_token_merges(f["tokenizer.ggml.merges"].contents())
    writer.add_bos_token_id(f["tokenizer.ggml.bos_token_id"].contents())
    writer.add_eos_token_id(f["tokenizer.ggml.eos_token_id"].contents())
    if template:
        writer.add_chat_template(template)
    elif "tokenizer.chat_template" in f:
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


# Real models' widths (fewer layers), for speed comparisons: `scripts/bench-shaped`.
SHAPED = {
    # OLMoE-1B-7B: 64 experts of 1,024, 8 per token, no grouped-query attention.
    "olmoe": dict(hidden=2048, inter=1024, layers=2, heads=16, kv_heads=16, head_dim=128, experts=64, used=8),
    # Qwen3-30B-A3B: 128 experts of 768, 8 per token.
    "qwen3moe": dict(hidden=2048, inter=1536, layers=2, heads=32, kv_heads=4, head_dim=128, experts=128, used=8),
    # Mixtral 8x7B: 8 experts of 14,336, 2 per token.
    "mixtral": dict(hidden=4096, inter=14336, layers=1, heads=32, kv_heads=8, head_dim=128, experts=8, used=2),
    # Llama 3.2 1B, every layer (the bundled tokenizer's vocabulary, not Llama 3's 128,256).
    "llama-1b": dict(hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8, head_dim=64),
    # Llama 3.2 3B, 4 of its 28 layers.
    "llama-3b": dict(hidden=3072, inter=8192, layers=4, heads=24, kv_heads=8, head_dim=128),
    # Llama 3.1 8B, 4 of its 32 layers.
    "llama-8b": dict(hidden=4096, inter=14336, layers=4, heads=32, kv_heads=8, head_dim=128),
    # Qwen3 1.7B, 4 of its 28 layers (Q/K norms).
    "qwen3-2b": dict(hidden=2048, inter=6144, layers=4, heads=16, kv_heads=8, head_dim=128),
}


# Qwen3's chat template's thinking switch, over the ChatML turns SmolLM2's tokenizer writes (for the thinking tests).
THINKING_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)


def write(path, arch, bundled, seed, rope=None, rotary=None, shape=None, template=None, pooling=None):
    d = dict(hidden=HIDDEN, inter=INTER, layers=LAYERS, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
             experts=EXPERTS, used=USED)
    d.update(shape or {})
    hidden, inter_d, layers, heads, head_dim = d["hidden"], d["inter"], d["layers"], d["heads"], d["head_dim"]
    experts, used = d["experts"], d["used"]
    rotary = rotary or head_dim
    moe = arch in ("qwen3moe", "olmoe") or arch == "mixtral"
    if arch == "mixtral":
        arch = "llama"
    # OLMoE has no grouped-query attention (llama.cpp sizes its key norm to the full width).
    kv_heads = heads if arch == "olmoe" else d["kv_heads"]
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    vocab = tokenizer(w, bundled, template)
    theta = 10000.0
    w.add_context_length(2048)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter_d)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if pooling is not None:
        # An embedding model (Qwen3-Embedding's form): its states pooled, each document ending with EOS.
        w.add_pooling_type(pooling)
        w.add_add_eos_token(True)
    if moe:
        w.add_expert_count(experts)
        w.add_expert_used_count(used)
        if arch == "qwen3moe":
            w.add_expert_feed_forward_length(inter_d // 2)
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

    # The small models' draws as they have always been (their figures in docs/worker.md); the shaped ones' in f32.
    fdt = np.float32 if shape else np.float64

    def mat(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols), dtype=fdt) * scale / math.sqrt(cols)).astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", (rng.standard_normal((vocab, hidden), dtype=fdt) * 0.5).astype(np.float16))
    if rope == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_factors(theta))
    if arch == "phi3":
        half = np.arange(rotary // 2, dtype=np.float32)
        w.add_tensor("rope_factors_long.weight", (1.0 + 0.3 * half).astype(np.float32))
        w.add_tensor("rope_factors_short.weight", (1.0 + 0.01 * half).astype(np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(hidden))
        q, k, v = mat(heads * head_dim, hidden, 2.0), mat(kv_heads * head_dim, hidden, 2.0), mat(kv_heads * head_dim, hidden)
        if arch == "phi3":
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([q, k, v]))
        else:
            w.add_tensor(p + "attn_q.weight", q)
            w.add_tensor(p + "attn_k.weight", k)
            w.add_tensor(p + "attn_v.weight", v)
        if arch in ("qwen3", "qwen3moe"):
            w.add_tensor(p + "attn_q_norm.weight", norm(head_dim))
            w.add_tensor(p + "attn_k_norm.weight", norm(head_dim))
        if arch == "olmoe":
            w.add_tensor(p + "attn_q_norm.weight", norm(heads * head_dim))
            w.add_tensor(p + "attn_k_norm.weight", norm(kv_heads * head_dim))
        w.add_tensor(p + "attn_output.weight", mat(hidden, heads * head_dim))
        w.add_tensor(p + "ffn_norm.weight", norm(hidden))
        if moe:
            inter = inter_d // 2 if arch == "qwen3moe" else inter_d
            stack = lambda rows, cols: np.stack([mat(rows, cols) for _ in range(experts)])
            w.add_tensor(p + "ffn_gate_inp.weight", mat(experts, hidden, 4.0).astype(np.float32))
            w.add_tensor(p + "ffn_gate_exps.weight", stack(inter, hidden))
            w.add_tensor(p + "ffn_up_exps.weight", stack(inter, hidden))
            w.add_tensor(p + "ffn_down_exps.weight", stack(hidden, inter))
            continue
        gate, up = mat(inter_d, hidden), mat(inter_d, hidden)
        if arch == "phi3":
            w.add_tensor(p + "ffn_up.weight", np.concatenate([gate, up]))
        else:
            w.add_tensor(p + "ffn_gate.weight", gate)
            w.add_tensor(p + "ffn_up.weight", up)
        w.add_tensor(p + "ffn_down.weight", mat(hidden, inter_d))
    w.add_tensor("output_norm.weight", norm(hidden))
    w.add_tensor("output.weight", mat(vocab, hidden, 1.0))
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
    "olmoe-shaped": ("olmoe", 11, {"shape": SHAPED["olmoe"]}),
    "qwen3moe-shaped": ("qwen3moe", 12, {"shape": SHAPED["qwen3moe"]}),
    "mixtral-shaped": ("mixtral", 13, {"shape": SHAPED["mixtral"]}),
    "llama-1b-shaped": ("llama", 14, {"shape": SHAPED["llama-1b"]}),
    "llama-3b-shaped": ("llama", 15, {"shape": SHAPED["llama-3b"]}),
    "llama-8b-shaped": ("llama", 16, {"shape": SHAPED["llama-8b"]}),
    "qwen3-2b-shaped": ("qwen3", 17, {"shape": SHAPED["qwen3-2b"]}),
    # A Qwen3 with Qwen3's thinking switch in its template.
    "qwen3-thinking": ("qwen3", 18, {"template": THINKING_TEMPLATE}),
}


def main():
    # The shaped ones (gigabytes) only when named.
    bundled, out = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or [n for n in MODELS if not n.endswith("-shaped")]
    os.makedirs(out, exist_ok=True)
    for name in names:
        arch, seed, kw = MODELS[name]
        write(os.path.join(out, name + ".gguf"), arch, bundled, seed, **kw)


if __name__ == "__main__":
    main()
