"""Merges what scripts/gpu measured (tests, kernel table, model benchmarks, the transformers peer)
into one results JSON and prints a summary.

    python3 bench/gpu/report.py OUTDIR RESULTS.json
"""
import json
import os
import subprocess
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main():
    outdir, dest = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # DINFER_COMMIT first: a copy of the tree may sit inside another checkout.
    commit = os.environ.get("DINFER_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    res = {"what": "dinfer on one GPU: CUDA tests, kernel speeds, and the random-weight models of "
                   "the stages run (Llama-3.1-8B's shape; DeepSeek-V4-Flash's widths) side by side "
                   "with HF transformers",
           "rerun": "scripts/gpu OUTDIR (on the GPU machine; see scripts/gpu)",
           "commit": commit}
    for name in ("summary", "kernels", "model", "model_fp8", "model_kv_fp8", "hf", "startup",
                 "engine", "v4", "hf_v4", "v4_check", "flashinfer", "cutlass"):
        data = load(os.path.join(outdir, name + ".json"))
        if data is not None:
            res[name] = data
    tests = load(os.path.join(outdir, "gpu_tests.json"))
    if tests is not None:
        res["gpu_tests"] = {k: tests.get(k) for k in ("tests", "failures", "disabled", "errors")}
    model = (res.get("model") or {}).get("model", {})
    hf = res.get("hf") or {}
    keys = {}
    for k in ("decode_b1_roofline_fraction", "prefill_tflops", "throughput_1000_1000_c256_tok_s",
              "throughput_1000_1000_c256_roofline_tok_s", "idle_gap_fraction_b64"):
        if k in model:
            keys[k] = model[k]
    kv_fp8 = (res.get("model_kv_fp8") or {}).get("model", {})
    for k in ("throughput_1000_1000_c256_tok_s", "throughput_1000_1000_c256_roofline_tok_s"):
        if k in kv_fp8:
            keys["kv_fp8_" + k] = kv_fp8[k]
    if "decode_b1" in model and "decode_b1" in hf:
        keys["decode_b1_tok_s"] = model["decode_b1"]["tok_s"]
        keys["transformers_decode_b1_tok_s"] = hf["decode_b1"]["tok_s"]
    if "startup_s" in (res.get("startup") or {}):
        keys["startup_s"] = res["startup"]["startup_s"]
    if "output_throughput" in (res.get("engine") or {}):
        keys["engine_throughput_1000_1000_c256_tok_s"] = res["engine"]["output_throughput"]
    if "prefill_8x2048" in hf:
        keys["transformers_prefill_tflops"] = hf["prefill_8x2048"]["tflops"]
    v4 = (res.get("v4") or {}).get("v4", {})
    if "v4_decode_b1_roofline_fraction" in v4:
        keys["v4_decode_b1_roofline_fraction"] = v4["v4_decode_b1_roofline_fraction"]
        keys["v4_decode_b1_tok_s"] = v4["decode_b1"]["tok_s"]
    check = (res.get("v4_check") or {}).get("v4_check", {})
    if "median_row_error" in check:
        keys["v4_full_width_2_layers_median_row_error"] = check["median_row_error"]
        keys["v4_full_width_2_layers_transformers_bf16_median_row_error"] = check[
            "transformers_bf16_median_row_error"]
    hf_v4 = res.get("hf_v4") or {}
    if "decode_b1" in hf_v4:
        keys["transformers_v4_decode_b1_tok_s"] = hf_v4["decode_b1"]["tok_s"]
    res["keys"] = keys
    with open(dest, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(keys, indent=1))


if __name__ == "__main__":
    main()
