#!/usr/bin/env python3
"""Tokenizing a long chat prompt: dinfer against HF `tokenizers` (Rust), side by side in one run.

Builds a chat of several messages (about 100,000 tokens) from the tokenizer corpus fixtures
(tests/data/tokenizer/corpus.jsonl: prose, code, many scripts, emoji, digits) and renders it with
the SmolLM2 chat template through `dinfer tokenize --chat`. Both sides then encode the same
rendered prompt with the same tokenizer.json: HF with Tokenizer.encode(text,
add_special_tokens=False) (special-token markup parsed, as apply_chat_template does), dinfer with
Tokenizer::EncodeSegments (markup honoured where the template wrote it) at each thread count.
The ids must be equal (the corpus entries holding special-token strings are left out, since
dinfer by design keeps such text plain). The two alternate for several rounds so that a shared
machine's drifts hit both; each figure is the median over all timed runs. Writes
bench/results/<date>-tokenize-vs-hf.json.

    scripts/setup && cmake --build build --target dinfer
    .venv/bin/python bench/tokenize_vs_hf.py       # --threads 1,2 --tokens 100000 --rounds 3
"""
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def build_chat(hf, corpus, target_tokens, seed):
    """Alternating user/assistant messages of varied length until the prompt has about
    target_tokens tokens."""
    specials = [t.content for t in hf.get_added_tokens_decoder().values()]
    texts = [t for t in corpus if not any(s in t for s in specials)]
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "You are a careful assistant. Answer briefly."}]
    tokens = 0
    while tokens < target_tokens:
        size = rng.choice([300, 1500, 6000, 20000])  # characters
        parts = []
        while sum(map(len, parts)) < size:
            parts.append(rng.choice(texts))
        content = rng.choice([" ", "\n", "\n\n"]).join(parts)
        messages.append({"role": "user" if len(messages) % 2 else "assistant", "content": content})
        tokens += len(hf.encode(content, add_special_tokens=False).ids) + 5
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": "Summarise the conversation."})
    return {"messages": messages, "add_generation_prompt": True}


def run_dinfer(binary, tokenizer_dir, template, chat_path, threads, reps, workdir):
    out = os.path.join(workdir, "dinfer.json")
    cmd = [binary, "--log-level", "warn", "tokenize", "--tokenizer", tokenizer_dir, "--chat",
           chat_path, "--chat-template", template, "--text-out", os.path.join(workdir, "prompt.txt"),
           "--ids-out", os.path.join(workdir, "ids.txt"), "--bench", "--threads",
           ",".join(map(str, threads)), "-r", str(reps), "--json", out]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.load(open(out))


def run_hf(hf, text, reps):
    hf.encode(text, add_special_tokens=False)  # warm-up, as dinfer's first run
    runs, cpu_runs = [], []
    for _ in range(reps):
        cpu_start, start = time.process_time(), time.perf_counter()
        ids = hf.encode(text, add_special_tokens=False).ids
        runs.append((time.perf_counter() - start) * 1e3)
        cpu_runs.append((time.process_time() - cpu_start) * 1e3)
    return runs, cpu_runs, ids


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "build/test-data/tokenizers/smollm2"))
    ap.add_argument("--template", default=os.path.join(ROOT, "tests/data/chat_templates/smollm2.jinja"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", type=int, default=100000)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dinfer", default=os.path.join(ROOT, "build", "bin", "dinfer"))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import tokenizers
    hf = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    corpus = [json.loads(line)["text"]
              for line in open(os.path.join(ROOT, "tests/data/tokenizer/corpus.jsonl"))]
    chat = build_chat(hf, corpus, args.tokens, args.seed)
    threads = [int(t) for t in args.threads.split(",")]

    load_before = os.getloadavg()
    dinfer_runs = {t: [] for t in threads}
    dinfer_cpu = {t: [] for t in threads}
    hf_runs, hf_cpu = [], []
    with tempfile.TemporaryDirectory() as workdir:
        chat_path = os.path.join(workdir, "chat.json")
        json.dump(chat, open(chat_path, "w"))
        summary = None
        for _ in range(args.rounds):
            summary = run_dinfer(args.dinfer, args.tokenizer, args.template, chat_path, threads,
                                 args.reps, workdir)
            for r in summary["encode"]:
                dinfer_runs[r["threads"]] += r["runs_ms"]
                dinfer_cpu[r["threads"]] += r["runs_cpu_ms"]
            text = open(os.path.join(workdir, "prompt.txt"), encoding="utf-8", newline="").read()
            runs, cpu_runs, hf_ids = run_hf(hf, text, args.reps)
            hf_runs += runs
            hf_cpu += cpu_runs
        dinfer_ids = [int(x) for x in open(os.path.join(workdir, "ids.txt")).read().split(",")]
    if dinfer_ids != hf_ids:
        first = next(i for i, (a, b) in enumerate(zip(dinfer_ids, hf_ids)) if a != b)
        sys.exit(f"ids differ from HF at token {first} (of {len(hf_ids)})")

    hf_ms = statistics.median(hf_runs)
    hf_cpu_ms = statistics.median(hf_cpu)
    med = statistics.median
    result = {
        "what": "tokenizing one long chat prompt (SmolLM2 chat template, SmolLM2 tokenizer.json): "
                "dinfer EncodeSegments vs HF tokenizers Tokenizer.encode",
        "date": datetime.date.today().isoformat(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                    "load_average_before_after": [load_before[0], os.getloadavg()[0]],
                    "note": "shared machine: other jobs' load slows both sides and blurs the "
                            "multi-thread figures"},
        "hf_tokenizers_version": tokenizers.__version__,
        "prompt": {"messages": len(chat["messages"]), "tokens": summary["tokens"],
                   "bytes": summary["bytes"], "segments": summary["segments"]},
        "ids_equal": True,
        "hf_median_ms": hf_ms,
        "dinfer_median_ms": {str(t): med(v) for t, v in dinfer_runs.items()},
        # Wall time: what a caller waits for.
        "ratio_hf_over_dinfer": {str(t): hf_ms / med(v) for t, v in dinfer_runs.items()},
        # Single-thread CPU time, which other jobs on a shared machine do not inflate.
        "hf_median_cpu_ms": hf_cpu_ms,
        "dinfer_1_thread_median_cpu_ms": med(dinfer_cpu[1]) if 1 in dinfer_cpu else None,
        "ratio_cpu_1_thread": hf_cpu_ms / med(dinfer_cpu[1]) if 1 in dinfer_cpu else None,
        "rounds": args.rounds, "reps_per_round": args.reps,
        "runs_ms": {"hf": hf_runs, **{f"dinfer_t{t}": v for t, v in dinfer_runs.items()}},
        "runs_cpu_ms": {"hf": hf_cpu, **{f"dinfer_t{t}": v for t, v in dinfer_cpu.items()}},
    }
    out = args.out or os.path.join(ROOT, "bench", "results",
                                   f"{result['date']}-tokenize-vs-hf.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"{summary['tokens']} tokens: HF {hf_ms:.1f} ms; " + ", ".join(
        f"dinfer {t} thread(s) {med(v):.1f} ms (x{hf_ms / med(v):.2f})"
        for t, v in dinfer_runs.items()))
    if 1 in dinfer_cpu:
        print(f"CPU time, one thread: HF {hf_cpu_ms:.1f} ms, dinfer {med(dinfer_cpu[1]):.1f} ms "
              f"(x{hf_cpu_ms / med(dinfer_cpu[1]):.2f})")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
