#!/usr/bin/env python3
"""Engine benchmarks on the CPU backend with the default model, through `dinfer bench offline`:

1. output throughput at concurrency 16 vs 1 (128 prompt tokens, 64 output tokens, 32 requests);
2. prefix caching: TTFT of 32 requests sharing a 1,000-token prefix (+24 own tokens, 8 output
   tokens, concurrency 4), prefix cache off vs on -> prefix_cache_ttft_speedup (mean TTFT off/on).

Writes bench/results/<date>-engine-offline-cpu.json.   Usage: python3 bench/engine_offline.py
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin", "dinfer")


def run(*args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [BIN, "--log-level", "warn", "bench", "offline", "--model", "default", "--json", f.name, *map(str, args)]
        print("$", " ".join(cmd[1:]), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        return json.load(open(f.name))


def main():
    c1 = run("--input-len", 128, "--output-len", 64, "--num-prompts", 32, "--concurrency", 1)
    c16 = run("--input-len", 128, "--output-len", 64, "--num-prompts", 32, "--concurrency", 16)
    common = ("--input-len", 1024, "--prefix-len", 1000, "--output-len", 8, "--num-prompts", 32,
              "--concurrency", 4, "--max-batched-tokens", 4096)
    off = run(*common, "--no-prefix-cache")
    on = run(*common)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    result = {
        "what": "dinfer engine on the CPU backend, default model (SmolLM2-135M-Instruct Q4_1)",
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": {"cpu": cpu, "cores": os.cpu_count()},
        "throughput_c1_tok_s": c1["output_throughput"],
        "throughput_c16_tok_s": c16["output_throughput"],
        "throughput_c16_vs_c1": c16["output_throughput"] / c1["output_throughput"],
        "prefix_cache_ttft_speedup": off["ttft_s"]["mean"] / on["ttft_s"]["mean"],
        "runs": {"c1": c1, "c16": c16, "prefix_cache_off": off, "prefix_cache_on": on},
    }
    out = os.path.join(ROOT, "bench", "results", f"{result['date']}-engine-offline-cpu.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
