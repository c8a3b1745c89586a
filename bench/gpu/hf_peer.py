"""The peer of dinfer_gpu_bench's model benchmark on the same GPU, in the same run: HF
transformers with random bf16 weights of a config's shape. Batch-1 greedy decode, and a prefill of
8 x 2,048 tokens with logits for the last token only (as dinfer computes them).

    python3 bench/gpu/hf_peer.py CONFIG.json OUT.json
"""
import json
import statistics
import sys
import time

import torch
import transformers


def timed(fn, reps):
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def decode_step_ms(model, prompt, steps, reps_one=3):
    """Milliseconds of one greedy decode step of `model` after `prompt` ([1, n] on the GPU): the
    time of generating steps + 1 tokens less that of generating one, over steps."""
    def generate(n):
        with torch.no_grad():
            model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           pad_token_id=0)

    generate(2)
    t_one = timed(lambda: generate(1), reps_one)
    t_many = timed(lambda: generate(steps + 1), 1)
    return (t_many - t_one) / steps * 1e3


def forward_flops(c, tokens, pairs, logits_rows):
    h, q = c.hidden_size, c.num_attention_heads * c.head_dim
    kv = c.num_key_value_heads * c.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * c.intermediate_size
    return (2.0 * per_layer * c.num_hidden_layers * tokens + 2.0 * h * c.vocab_size * logits_rows
            + 4.0 * c.head_dim * c.num_attention_heads * c.num_hidden_layers * pairs)


def main():
    config_path, out_path = sys.argv[1], sys.argv[2]
    config = transformers.LlamaConfig.from_json_file(config_path)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config)
    model.eval()
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    out = {"transformers": transformers.__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "init_s": init_s}

    gen = torch.Generator(device="cuda").manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (1, 128), device="cuda", generator=gen)

    steps = 32
    step_ms = decode_step_ms(model, prompt, steps)
    out["decode_b1"] = {"step_ms": step_ms, "tok_s": 1e3 / step_ms, "steps": steps}
    print(f"transformers decode b1: {step_ms:.2f} ms/step ({1e3 / step_ms:.1f} tok/s)", flush=True)

    ids = torch.randint(0, config.vocab_size, (8, 2048), device="cuda", generator=gen)

    def prefill():
        with torch.no_grad():
            model(ids, logits_to_keep=1)

    prefill()
    secs = timed(prefill, 3)
    tokens, pairs = 8 * 2048, 8 * 2048 * 2049 / 2
    flops = forward_flops(config, tokens, pairs, 8)
    out["prefill_8x2048"] = {"ms": secs * 1e3, "tok_s": tokens / secs, "flops": flops,
                             "tflops": flops / secs / 1e12}
    print(f"transformers prefill 8x2048: {secs * 1e3:.1f} ms, {flops / secs / 1e12:.0f} TFLOP/s",
          flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
