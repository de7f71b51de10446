#!/usr/bin/env python3
"""Tiny random-weight GGUF embedding models, for comparing zerolayer's vectors with llama.cpp's `llama-embedding`
on the same files (worker/tests/embeddings.rs): a BERT (learned positions, GELU, biases, CLS pooling, a lowercasing
WordPiece vocabulary), a nomic-bert (fused QKV, RoPE, SwiGLU, mean pooling) and a Qwen3-Embedding-style decoder
(the Qwen3 of scripts/arch_models.py with last-token pooling and EOS after each document, SmolLM2's tokenizer from
the bundled file). Fixed seeds; written to OUT_DIR as bert-embed.gguf, nomic-embed.gguf and qwen3-embed.gguf.

Usage: scripts/embed_models.py BUNDLED.gguf OUT_DIR   (needs PyPI's gguf and numpy)
"""
import math
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arch_models  # noqa: E402

HIDDEN, INTER, LAYERS, HEADS, CONTEXT = 128, 256, 2, 4, 512

WORDS = """the of and to in is was for on that with as by at from it an be are this which or his her had not but
have were their they one all been has there who more its first new after other some can would when into time also
only two may these over most such then than them city world people state made many where through years during
between under year war later known used part well each three both while like because around before long called
about against should being since second could until high house life large four school national york great
capital france paris river water music film team game play player season league club song album book story
embedding vector search query document retrieval model language text sentence word meaning similar different
hello weather today sunny rain cold warm quick brown fox jumps lazy dog cat sat mat""".split()
PIECES = list("abcdefghijklmnopqrstuvwxyz0123456789") + ["ing", "ed", "s", "er", "ly", "tion", "es", "al"]
PUNCT = list(".,!?;:'\"()-")


def wordpiece_vocab():
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [3] + [5] * 99 + [3, 3, 3, 3]
    for w in WORDS + PIECES + PUNCT:
        t = "\u2581" + w
        if t not in tokens:
            tokens.append(t)
            types.append(1)
    for p in PIECES:
        if p not in tokens:
            tokens.append(p)
            types.append(1)
    return tokens, types


def write_encoder(path, arch, seed, pooling):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    tokens, types = wordpiece_vocab()
    vocab = len(tokens)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_unk_token_id(100)
    w.add_bos_token_id(101)
    w.add_sep_token_id(102)
    w.add_pad_token_id(0)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", True)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    w.add_token_type_count(2)
    if arch == "nomic-bert":
        w.add_rope_freq_base(1000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    def mat(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * scale / math.sqrt(cols)).astype(np.float16)

    def vec(n, base=0.0, scale=0.1):
        return (base + scale * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", (rng.standard_normal((vocab, HIDDEN)) * 0.5).astype(np.float16))
    w.add_tensor("token_types.weight", (rng.standard_normal((2, HIDDEN)) * 0.1).astype(np.float32))
    if arch == "bert":
        w.add_tensor("position_embd.weight", (rng.standard_normal((CONTEXT, HIDDEN)) * 0.1).astype(np.float16))
    w.add_tensor("token_embd_norm.weight", vec(HIDDEN, 1.0))
    w.add_tensor("token_embd_norm.bias", vec(HIDDEN))
    for i in range(LAYERS):
        p = f"blk.{i}."
        q, k, v = mat(HIDDEN, HIDDEN, 2.0), mat(HIDDEN, HIDDEN, 2.0), mat(HIDDEN, HIDDEN)
        if arch == "nomic-bert":
            w.add_tensor(p + "attn_qkv.weight", np.concatenate([q, k, v]))
        else:
            w.add_tensor(p + "attn_q.weight", q)
            w.add_tensor(p + "attn_q.bias", vec(HIDDEN))
            w.add_tensor(p + "attn_k.weight", k)
            w.add_tensor(p + "attn_k.bias", vec(HIDDEN))
            w.add_tensor(p + "attn_v.weight", v)
            w.add_tensor(p + "attn_v.bias", vec(HIDDEN))
        w.add_tensor(p + "attn_output.weight", mat(HIDDEN, HIDDEN))
        if arch == "bert":
            w.add_tensor(p + "attn_output.bias", vec(HIDDEN))
        w.add_tensor(p + "attn_output_norm.weight", vec(HIDDEN, 1.0))
        w.add_tensor(p + "attn_output_norm.bias", vec(HIDDEN))
        w.add_tensor(p + "ffn_up.weight", mat(INTER, HIDDEN))
        if arch == "nomic-bert":
            w.add_tensor(p + "ffn_gate.weight", mat(INTER, HIDDEN))
        else:
            w.add_tensor(p + "ffn_up.bias", vec(INTER))
        w.add_tensor(p + "ffn_down.weight", mat(HIDDEN, INTER))
        if arch == "bert":
            w.add_tensor(p + "ffn_down.bias", vec(HIDDEN))
        w.add_tensor(p + "layer_output_norm.weight", vec(HIDDEN, 1.0))
        w.add_tensor(p + "layer_output_norm.bias", vec(HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    bundled, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    write_encoder(os.path.join(out, "bert-embed.gguf"), "bert", 21, gguf.PoolingType.CLS)
    write_encoder(os.path.join(out, "nomic-embed.gguf"), "nomic-bert", 22, gguf.PoolingType.MEAN)
    arch_models.write(os.path.join(out, "qwen3-embed.gguf"), "qwen3", bundled, 23, pooling=gguf.PoolingType.LAST)


if __name__ == "__main__":
    main()
