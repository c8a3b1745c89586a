"""Writes a random-weight checkpoint of a config's shape as an HF directory: config.json and bf16
safetensors shards of about 2 GB with their index (what `dinfer --model DIR` loads). Made on the GPU
with PyTorch, so that the 16 GB of an 8B model take seconds; only the load time is measured on it.

    python3 bench/gpu/make_checkpoint.py CONFIG.json OUTDIR
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file


def tensors(cfg):
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim", h // cfg["num_attention_heads"])
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    yield "model.embed_tokens.weight", (cfg["vocab_size"], h), 1.0
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,), None
        yield p + "post_attention_layernorm.weight", (h,), None
        yield p + "self_attn.q_proj.weight", (q, h), 1 / math.sqrt(h)
        yield p + "self_attn.k_proj.weight", (kv, h), 1 / math.sqrt(h)
        yield p + "self_attn.v_proj.weight", (kv, h), 1 / math.sqrt(h)
        yield p + "self_attn.o_proj.weight", (h, q), 1 / math.sqrt(q)
        yield p + "mlp.gate_proj.weight", (inter, h), 1 / math.sqrt(h)
        yield p + "mlp.up_proj.weight", (inter, h), 1 / math.sqrt(h)
        yield p + "mlp.down_proj.weight", (h, inter), 1 / math.sqrt(inter)
    yield "model.norm.weight", (h,), None
    if not cfg.get("tie_word_embeddings", False):
        yield "lm_head.weight", (cfg["vocab_size"], h), 1 / math.sqrt(h)


def main():
    config, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(config))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shard, shard_bytes, shards, index = {}, 0, [], {}

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
            shards.append(name)
            for k in shard:
                index[k] = name
            shard, shard_bytes = {}, 0

    total = 0
    for name, shape, scale in tensors(cfg):
        if scale is None:
            t = torch.ones(shape, dtype=torch.bfloat16)
        else:
            t = (torch.randn(shape, device="cuda", generator=gen) * scale).to(torch.bfloat16).cpu()
        shard[name] = t
        shard_bytes += t.numel() * 2
        total += t.numel() * 2
        if shard_bytes >= 2 << 30:
            flush()
    flush()
    # Shard names were given before their count was known: rename to the HF pattern.
    final = {}
    for i, name in enumerate(shards):
        new = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        os.rename(os.path.join(out, name), os.path.join(out, new))
        final[name] = new
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": {k: final[v] for k, v in index.items()}}, f, indent=1)
    print(f"{total / 1e9:.2f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
