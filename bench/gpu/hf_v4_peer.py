"""The peer of `dinfer_gpu_bench v4` on the same GPU, in the same run: transformers' DeepSeek-V4
(DeepseekV4ForCausalLM) with random bf16 weights, the first N layers of a config at full width.
Batch-1 greedy decode after a 1,024-token prompt, and a prefill of 4 x 2,048 tokens with logits
for the last token only.

    python3 bench/gpu/hf_v4_peer.py CONFIG.json OUT.json [--layers N]
"""
import argparse
import json
import time

import torch
import transformers

from hf_peer import decode_step_ms, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args()
    with open(args.config) as f:
        published = json.load(f)
    n = args.layers
    kwargs = {k: v for k, v in published.items()
              if k not in ("architectures", "model_type", "topk_method", "torch_dtype",
                           "quantization_config", "expert_dtype")}
    kwargs["num_hidden_layers"] = n
    kwargs["compress_ratios"] = published["compress_ratios"][:n]
    kwargs["num_nextn_predict_layers"] = 0
    config = transformers.DeepseekV4Config(**kwargs)
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "layers": n}
    t0 = time.perf_counter()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.DeepseekV4ForCausalLM(config)
    model.eval()
    torch.cuda.synchronize()
    out["init_s"] = time.perf_counter() - t0
    print(f"transformers DeepSeek-V4, {n} layers: ready in {out['init_s']:.1f} s", flush=True)

    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (1, 1024), device="cuda", generator=gen)

    steps = 16
    step_ms = decode_step_ms(model, prompt, steps, reps_one=2)
    out["decode_b1"] = {"step_ms": step_ms, "tok_s": 1e3 / step_ms, "steps": steps,
                        "context": 1024}
    print(f"transformers V4 decode b1: {step_ms:.2f} ms/step ({1e3 / step_ms:.1f} tok/s)",
          flush=True)

    ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda", generator=gen)

    def prefill():
        with torch.no_grad():
            model(ids, logits_to_keep=1)

    prefill()
    secs = timed(prefill, 2)
    out["prefill_4x2048"] = {"ms": secs * 1e3, "tok_s": 4 * 2048 / secs}
    print(f"transformers V4 prefill 4x2048: {secs * 1e3:.1f} ms ({4 * 2048 / secs:.0f} tok/s)",
          flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
