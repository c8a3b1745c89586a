#!/usr/bin/env python3
"""Per-layer CPU timing of DeepSeek-V4 at V4-Flash widths (random weights), a first data point.

Writes one random-weight checkpoint in DeepSeek-V4-Flash's published layout and dtypes (FP8 e4m3
linears with UE8M0 128x128 block scales, FP4 experts with UE8M0 scales per 32, bf16 embedding,
head, router and compressor projections) holding two layers at full width (hidden 4096, 64 heads of
512, q_lora_rank 1024, 8 output groups of rank 1024, 256 routed experts of 2048 + 1 shared, top-6,
indexer 64 x 128 with top-512, window 128, 4 hyper-connection streams, vocabulary 129280): layer 0
has the weights of a compressed sparse attention layer, layer 1 of a heavily compressed one.

`dinfer bench` then measures prefill (one batch) and decode (one token at a time from an empty
context) on four configs over that one file, and the per-layer costs come out of their differences:
  A  [sliding]               embedding + head + one sliding-window layer (layer 0's weights)
  D  [sliding, sliding]      + a second one
  B  [sparse]                embedding + head + the compressed sparse attention layer
  C  [sparse, heavy]         + the heavily compressed attention layer
  sliding layer = D - A, sparse layer = B - A + sliding, heavy layer = C - B (ms per token).
The machine is a shared 2-core VM: differences of separate runs carry its noise (tens of ms in
prefill, more in decode); the configs' own times are recorded as well.
Decode starts from an empty context, so the window and the compressed entries are short; the
numbers are per-token costs of the projections, MoE and hyper-connections more than of attention.

usage: deepseek_v4_layers.py [--dinfer build/bin/dinfer] [--work /tmp/dsv4-bench] [--threads 2]
                             [--prompt 128] [--gen 16] [--reps 3] [--out bench/results/...json]
needs numpy; the checkpoint is about 8 GB on disk, the process about 9 GB of memory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import struct
import subprocess

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
H, HEADS, HD, ROPE, QR, OG, OR = 4096, 64, 512, 64, 1024, 8, 1024
EXPERTS, INTER, TOPK = 256, 2048, 6
IH, ID, ITOPK = 64, 128, 512
HC, VOCAB, WINDOW = 4, 129280, 128

CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": VOCAB, "hidden_size": H, "moe_intermediate_size": INTER,
    "num_attention_heads": HEADS, "num_key_value_heads": 1, "head_dim": HD, "qk_rope_head_dim": ROPE,
    "q_lora_rank": QR, "o_lora_rank": OR, "o_groups": OG, "n_routed_experts": EXPERTS,
    "n_shared_experts": 1, "num_experts_per_tok": TOPK, "num_hash_layers": 0,
    "scoring_func": "sqrtsoftplus", "norm_topk_prob": True, "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0, "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "sliding_window": WINDOW, "index_n_heads": IH, "index_head_dim": ID, "index_topk": ITOPK,
    "hc_mult": HC, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "expert_dtype": "fp4",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
}
CONFIGS = {"A": [0], "D": [0, 0], "B": [4], "C": [4, 128]}


class Writer:
    """Streams tensors into one safetensors file (header first, so shapes are declared up front)."""

    def __init__(self):
        self.entries = []  # (name, dtype, shape, nbytes, fill)

    def add(self, name, dtype, shape, fill):
        size = {"BF16": 2, "F32": 4, "I8": 1, "F8_E4M3": 1, "F8_E8M0": 1}[dtype]
        nbytes = int(np.prod(shape)) * size
        self.entries.append((name, dtype, list(shape), nbytes, fill))

    def write(self, path):
        header, offset = {}, 0
        for name, dtype, shape, nbytes, _ in self.entries:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            for _, _, shape, nbytes, fill in self.entries:
                data = fill(shape)
                assert data.nbytes == nbytes, (shape, data.nbytes, nbytes)
                f.write(data.tobytes())


rng = np.random.default_rng(1234)


def bf16(std):
    def fill(shape):
        x = (rng.standard_normal(shape, dtype=np.float32) * std).view(np.uint32)
        return (x >> 16).astype(np.uint16)
    return fill


def f32(std, mean=0.0):
    return lambda shape: (rng.standard_normal(shape, dtype=np.float32) * std + mean).astype(np.float32)


def fp8_bytes(shape):
    # e4m3 values of magnitude below 1 (exponent field < 7), random signs: never NaN.
    mag = rng.integers(0, 0x38, size=shape, dtype=np.uint8)
    return mag | (rng.integers(0, 2, size=shape, dtype=np.uint8) << 7)


def e8m0(exponent):
    return lambda shape: np.full(shape, 127 + exponent, dtype=np.uint8)


def linear_fp8(w, name, out, inp):
    w.add(name + ".weight", "F8_E4M3", (out, inp), fp8_bytes)
    w.add(name + ".scale", "F8_E8M0", ((out + 127) // 128, (inp + 127) // 128), e8m0(-6))


def layer(w, i, sparse):
    p = f"layers.{i}."
    for n in ("attn_norm", "ffn_norm"):
        w.add(p + n + ".weight", "BF16", (H,), bf16(0.1))
    for site in ("attn", "ffn"):
        mix = (2 + HC) * HC
        w.add(p + f"hc_{site}_fn", "F32", (mix, HC * H), f32(0.02))
        w.add(p + f"hc_{site}_base", "F32", (mix,), f32(0.5))
        w.add(p + f"hc_{site}_scale", "F32", (3,), f32(0.1, 1.0))
    a = p + "attn."
    linear_fp8(w, a + "wq_a", QR, H)
    w.add(a + "q_norm.weight", "BF16", (QR,), bf16(0.1))
    linear_fp8(w, a + "wq_b", HEADS * HD, QR)
    linear_fp8(w, a + "wkv", HD, H)
    w.add(a + "kv_norm.weight", "BF16", (HD,), bf16(0.1))
    linear_fp8(w, a + "wo_a", OG * OR, HEADS * HD // OG)
    linear_fp8(w, a + "wo_b", H, OG * OR)
    w.add(a + "attn_sink", "F32", (HEADS,), f32(1.0))
    rate, width = (4, 2 * HD) if sparse else (128, HD)
    w.add(a + "compressor.wkv.weight", "BF16", (width, H), bf16(0.02))
    w.add(a + "compressor.wgate.weight", "BF16", (width, H), bf16(0.02))
    w.add(a + "compressor.ape", "F32", (rate, width), f32(0.5))
    w.add(a + "compressor.norm.weight", "BF16", (HD,), bf16(0.1))
    if sparse:
        linear_fp8(w, a + "indexer.wq_b", IH * ID, QR)
        w.add(a + "indexer.weights_proj.weight", "BF16", (IH, H), bf16(0.02))
        w.add(a + "indexer.compressor.wkv.weight", "BF16", (2 * ID, H), bf16(0.02))
        w.add(a + "indexer.compressor.wgate.weight", "BF16", (2 * ID, H), bf16(0.02))
        w.add(a + "indexer.compressor.ape", "F32", (4, 2 * ID), f32(0.5))
        w.add(a + "indexer.compressor.norm.weight", "BF16", (ID,), bf16(0.1))
    f = p + "ffn."
    w.add(f + "gate.weight", "BF16", (EXPERTS, H), bf16(0.02))
    w.add(f + "gate.bias", "F32", (EXPERTS,), f32(0.1))
    for e in range(EXPERTS):
        for n, (out, inp) in (("w1", (INTER, H)), ("w2", (H, INTER)), ("w3", (INTER, H))):
            w.add(f"{f}experts.{e}.{n}.weight", "I8", (out, inp // 2),
                  lambda shape: rng.integers(0, 256, size=shape, dtype=np.uint8))
            w.add(f"{f}experts.{e}.{n}.scale", "F8_E8M0", (out, inp // 32), e8m0(-4))
    for n, (out, inp) in (("w1", (INTER, H)), ("w2", (H, INTER)), ("w3", (INTER, H))):
        linear_fp8(w, f"{f}shared_experts.{n}", out, inp)


def write_checkpoint(folder: pathlib.Path):
    path = folder / "model.safetensors"
    if path.exists():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    w = Writer()
    w.add("embed.weight", "BF16", (VOCAB, H), bf16(0.02))
    w.add("head.weight", "BF16", (VOCAB, H), bf16(0.02))
    w.add("norm.weight", "BF16", (H,), bf16(0.1))
    w.add("hc_head_fn", "F32", (HC, HC * H), f32(0.02))
    w.add("hc_head_base", "F32", (HC,), f32(0.5))
    w.add("hc_head_scale", "F32", (1,), f32(0.1, 1.0))
    layer(w, 0, sparse=True)
    layer(w, 1, sparse=False)
    w.write(path)
    return path


def run(args, weights: pathlib.Path, name: str, ratios: list[int]):
    folder = pathlib.Path(args.work) / name
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(CONFIG, num_hidden_layers=len(ratios), compress_ratios=ratios)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    link = folder / "model.safetensors"
    if not link.exists():
        link.symlink_to(weights)
    out = folder / "bench.json"
    cmd = [args.dinfer, "bench", "-m", str(folder), "-t", str(args.threads), "-p", str(args.prompt),
           "-n", str(args.gen), "-r", str(args.reps), "--json", str(out)]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    res = json.loads(out.read_text())
    return {r["test"]: 1000.0 / r["tok_s"]["median"] for r in res["results"]}  # ms per token


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dinfer", default=str(REPO / "build/bin/dinfer"))
    parser.add_argument("--work", default="/tmp/dsv4-bench")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench/results" /
                                             f"{datetime.date.today()}-cpu-deepseek-v4-flash-layers.json"))
    args = parser.parse_args()
    weights = write_checkpoint(pathlib.Path(args.work) / "weights")
    ms = {name: run(args, weights, name, ratios) for name, ratios in CONFIGS.items()}
    per_layer = {}
    for test in ("prefill", "decode"):
        sliding = ms["D"][test] - ms["A"][test]
        per_layer[test] = {
            "sliding_window_layer_ms": sliding,
            "compressed_sparse_layer_ms": ms["B"][test] - ms["A"][test] + sliding,
            "heavily_compressed_layer_ms": ms["C"][test] - ms["B"][test],
        }
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result = {
        "what": "DeepSeek-V4-Flash widths on the CPU backend, random weights (FP8 linears, FP4 experts), "
                "per-layer ms per token from differences of whole-model runs",
        "date": str(datetime.date.today()),
        "commit": commit,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "threads": args.threads,
        "prompt_tokens": args.prompt,
        "decode_tokens": args.gen,
        "repetitions": args.reps,
        "ms_per_token_by_config": {name: {"layers": CONFIGS[name], **v} for name, v in ms.items()},
        "ms_per_token_per_layer": per_layer,
    }
    pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(per_layer, indent=1))


if __name__ == "__main__":
    main()
