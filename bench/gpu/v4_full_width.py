"""A full-width DeepSeek-V4 of two layers (V4-Flash widths: hidden 4096, 64 heads of 512, 256
experts of 2048, indexer 64 x 128 with top-512, window 128; a compressed sparse attention layer,
hash-routed, then a heavily compressed one, score-routed), random weights rounded to bf16, for
`dinfer_gpu_bench v4-check`: writes the checkpoint as transformers' save_pretrained does (bf16)
and transformers' float32 logits of the same weights on the same GPU over the last 64 rows of a
2,304-token prompt (576 compressed entries: the indexer's top-512 selects) and 8 greedy decode
steps, and how far transformers' own bf16 run lands from them (the yardstick of bf16 numerics).

    python3 bench/gpu/v4_full_width.py OUTDIR
"""
import json
import pathlib
import statistics
import sys
import time

import torch
import transformers
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mv4

PROMPT, ROWS, DECODE = 2304, 64, 8


def config():
    return transformers.DeepseekV4Config(
        vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=2,
        num_attention_heads=64, num_key_value_heads=1, head_dim=512, qk_rope_head_dim=64,
        q_lora_rank=1024, o_lora_rank=1024, o_groups=8, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=6, num_hash_layers=1, scoring_func="sqrtsoftplus",
        norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
        max_position_embeddings=1048576, rms_norm_eps=1e-6, rope_theta=10000,
        compress_rope_theta=160000,
        rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                      "beta_fast": 32, "beta_slow": 1},
        sliding_window=128, compress_ratios=[4, 128], index_n_heads=64, index_head_dim=128,
        index_topk=512, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, num_nextn_predict_layers=0,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=1)


@torch.no_grad()
def init(model, seed):
    """Random weights scaled so that every path matters at this width, rounded to bf16."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(shape, std):
        return std * torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32)

    for name, p in model.named_parameters():
        leaf = name.split(".")[-1]
        if name.endswith("norm.weight"):
            v = 1.0 + randn(p.shape, 0.1)
        elif leaf == "sinks":
            v = randn(p.shape, 1.0)
        elif leaf == "position_bias":
            v = randn(p.shape, 0.5)
        elif leaf in ("fn", "hc_fn"):
            v = randn(p.shape, 0.1 * (256 / p.shape[-1]) ** 0.5)
        elif leaf in ("base", "hc_base"):
            v = randn(p.shape, 0.5)
        elif leaf in ("scale", "hc_scale"):
            v = 1.0 + randn(p.shape, 0.2)
        elif p.dim() >= 2:
            v = randn(p.shape, p.shape[-1] ** -0.5)
        else:
            v = randn(p.shape, 0.1)
        p.copy_(v.to(torch.bfloat16).float())
    for m in model.modules():
        if isinstance(m, mv4.DeepseekV4TopKRouter):
            b = randn(m.e_score_correction_bias.shape, 0.01)
            m.e_score_correction_bias.copy_(b.to(torch.bfloat16).float())
        if isinstance(m, mv4.DeepseekV4HashRouter):
            keys = torch.rand(m.tid2eid.shape[0], m.num_experts, generator=gen, device="cuda")
            m.tid2eid.copy_(keys.argsort(dim=1)[:, : m.top_k])


@torch.no_grad()
def rows(model, prompt, decode=None):
    """Logits of the prompt's last ROWS rows and of DECODE steps (greedy, or the given tokens)."""
    out = model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True,
                logits_to_keep=ROWS)
    past, got, ids = out.past_key_values, [out.logits[0].float()], []
    nxt = int(torch.argmax(out.logits[0, -1]))
    for i in range(DECODE):
        tok = decode[i] if decode is not None else nxt
        ids.append(tok)
        out = model(input_ids=torch.tensor([[tok]], device="cuda"), past_key_values=past,
                    use_cache=True)
        past = out.past_key_values
        got.append(out.logits[0].float())
        nxt = int(torch.argmax(out.logits[0, -1]))
    return torch.cat(got, dim=0), ids


def row_errors(got, want):
    diff = (got - want).abs().amax(dim=1)
    return (diff / want.abs().amax(dim=1).clamp_min(1e-30)).tolist()


def main():
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = transformers.DeepseekV4ForCausalLM._from_config(
            config(), attn_implementation="eager", dtype=torch.float32).eval()
    init(model, 5)
    gen = torch.Generator().manual_seed(6)
    prompt = torch.randint(2, 129280, (PROMPT,), generator=gen).tolist()
    want, decode = rows(model, prompt)
    model.to(torch.bfloat16)
    got, _ = rows(model, prompt, decode)
    errors = row_errors(got, want)
    model.save_pretrained(out, safe_serialization=True)
    want.cpu().numpy().astype("<f4").tofile(out / "logits.f32")
    ref = {"prompt_ids": prompt, "decode_ids": decode, "first_row": PROMPT - ROWS,
           "transformers_bf16_row_errors": errors,
           "transformers_bf16_median": statistics.median(errors),
           "transformers_bf16_worst": max(errors), "transformers": transformers.__version__,
           "torch": torch.__version__, "seconds": time.perf_counter() - t0}
    (out / "reference.json").write_text(json.dumps(ref))
    print(f"full-width V4 (2 layers): transformers bf16 vs float32: median row "
          f"{ref['transformers_bf16_median']:.4f}, worst {ref['transformers_bf16_worst']:.4f}; "
          f"written in {ref['seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
