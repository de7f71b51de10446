#!/usr/bin/env python3
"""Seeded random LoRA adapters in Hugging Face PEFT format, for benchmarks and manual tests.

Writes COUNT directories NAME0..NAME{COUNT-1} under --out, each with adapter_config.json and
adapter_model.safetensors (f16 tensors, as PEFT saves a half-precision fine-tune), and prints one line per adapter:
"NAME PATH SHA256" (the weights file's SHA-256, which `zl admin adapters add --sha256` takes). The default shape is
the bundled SmolLM2-135M's (30 layers, 576 wide, K/V 192, MLP 1536). The same seed writes the same files.

  .venv/bin/python scripts/make-adapters.py --out /tmp/adapters --count 8 --rank 16 --alpha 32 --seed 71
"""
import argparse
import hashlib
import json
import os
import struct

import numpy as np

TARGETS = {
    # module: (outputs, inputs) as functions of the shape
    "q_proj": lambda s: (s.hidden, s.hidden),
    "k_proj": lambda s: (s.kv, s.hidden),
    "v_proj": lambda s: (s.kv, s.hidden),
    "o_proj": lambda s: (s.hidden, s.hidden),
    "gate_proj": lambda s: (s.intermediate, s.hidden),
    "up_proj": lambda s: (s.intermediate, s.hidden),
    "down_proj": lambda s: (s.hidden, s.intermediate),
}
ATTENTION = {"q_proj", "k_proj", "v_proj", "o_proj"}


def safetensors(tensors):
    """The bytes of a safetensors file holding `tensors` (name -> f16 array), header padded to 8 bytes."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f2").tobytes()
        header[name] = {"dtype": "F16", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=8)
    p.add_argument("--prefix", default="tenant-", help="adapter names: PREFIX0, PREFIX1, ...")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--alpha", type=float, default=32)
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated modules")
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--kv", type=int, default=192)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--scale", type=float, default=0.1, help="factor values uniform in [-scale/2, scale/2)")
    p.add_argument("--seed", type=int, default=0)
    s = p.parse_args()
    targets = [t for t in s.targets.split(",") if t]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets or s.count < 1 or s.rank < 1:
        p.error(f"bad --targets {unknown} / --count / --rank")
    for i in range(s.count):
        rng = np.random.default_rng([s.seed, i])
        tensors = {}
        for layer in range(s.layers):
            for module in targets:
                outputs, inputs = TARGETS[module](s)
                part = "self_attn" if module in ATTENTION else "mlp"
                name = f"base_model.model.model.layers.{layer}.{part}.{module}"
                tensors[f"{name}.lora_A.weight"] = (rng.random((s.rank, inputs)) - 0.5) * s.scale
                tensors[f"{name}.lora_B.weight"] = (rng.random((outputs, s.rank)) - 0.5) * s.scale
        adapter = f"{s.prefix}{i}"
        path = os.path.join(s.out, adapter)
        os.makedirs(path, exist_ok=True)
        config = {"peft_type": "LORA", "r": s.rank, "lora_alpha": s.alpha, "target_modules": targets, "bias": "none"}
        with open(os.path.join(path, "adapter_config.json"), "w") as f:
            json.dump(config, f)
        body = safetensors(tensors)
        with open(os.path.join(path, "adapter_model.safetensors"), "wb") as f:
            f.write(body)
        print(adapter, adapter, hashlib.sha256(body).hexdigest())


if __name__ == "__main__":
    main()
