#!/usr/bin/env python3
"""Structured outputs: dinfer against xgrammar and llguidance on JSON Schemas, in one run.

All three engines get the same schemas and the same tokenizer (default: the default model's,
SmolLM2's tokenizer.json) and are measured the way their own benchmarks measure them:
  - compile: schema text to a ready matcher (xgrammar: compile_json_schema; llguidance: grammar
    translation + LLMatcher; dinfer: JSON Schema to grammar + automaton + precomputed masks),
    each engine's tokenizer set-up done once beforehand and reported apart;
  - masks: a valid instance of each schema is walked token by token and the time of each mask
    computation is recorded (one thread, masks into preallocated bitmasks).
Instances come from a seeded random walk of xgrammar's masks (llguidance's when xgrammar fails;
xgrammar adds no properties the schema does not list) that favours closing structure, re-serialized compactly in the generated key order and kept only
if the `jsonschema` package validates them; an engine that rejects a valid instance is recorded.
dinfer runs through `dinfer grammar bench` (C++); the peers through their Python packages, which
adds a call of overhead (about a microsecond) to each of their mask times. Times are taken as
thread CPU time (robust on a shared machine: time spent descheduled is not counted) and as wall
time; the headline ratio uses CPU time, both are recorded.

    python3 -m venv .deps/bench-venv && .deps/bench-venv/bin/pip install xgrammar llguidance jsonschema tokenizers
    .deps/bench-venv/bin/python bench/structured_vs_peers.py           # --limit N per folder
Writes bench/results/<date>-structured-vs-peers.json.
"""
import argparse
import datetime
import glob
import importlib.metadata
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def percentile(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))]


def stats(values, unit):
    return {
        f"{unit}_mean": statistics.fmean(values) if values else None,
        f"{unit}_median": percentile(values, 0.5),
        f"{unit}_p99": percentile(values, 0.99),
        f"{unit}_max": max(values) if values else None,
    }


class Llg:
    name = "llguidance"

    def __init__(self, tokenizer_json, whitespace):
        import llguidance
        import numpy as np
        self.llg, self.np = llguidance, np
        t0 = time.perf_counter()
        self.tok = llguidance.LLTokenizer(tokenizer_json)
        self.setup_ms = (time.perf_counter() - t0) * 1e3
        self.words = (self.tok.vocab_size + 31) // 32
        self.mask = np.zeros(self.words, dtype=np.uint32)
        self.options = {"whitespace_flexible": whitespace}

    def compile(self, schema_text):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema_text, defaults=self.options)
        m = self.llg.LLMatcher(self.tok, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return grammar

    def matcher(self, compiled):
        return self.llg.LLMatcher(self.tok, compiled, log_level=0)

    def fill(self, m):
        m.unsafe_compute_mask_ptr(self.mask.ctypes.data, self.words * 4)
        return self.mask

    def accept(self, m, token):
        return m.consume_token(token) and not m.is_error()


class Xgr:
    name = "xgrammar"

    def __init__(self, tokenizer_json, whitespace):
        import torch
        import transformers
        import xgrammar
        self.xgr, self.torch = xgrammar, torch
        t0 = time.perf_counter()
        hf = transformers.PreTrainedTokenizerFast(tokenizer_file=tokenizer_json)
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.setup_ms = (time.perf_counter() - t0) * 1e3
        self.mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
        self.whitespace = whitespace

    def compile(self, schema_text):
        return self.compiler.compile_json_schema(schema_text, any_whitespace=self.whitespace)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m):
        m.fill_next_token_bitmask(self.mask)
        return self.mask[0].numpy().view("uint32")

    def accept(self, m, token):
        return m.accept_token(token)


def timed_compile(engine, text):
    """Compiles; returns (compiled or None, wall ms, thread CPU ms, error)."""
    t0, c0 = time.perf_counter(), time.thread_time()
    try:
        compiled = engine.compile(text)
        err = None
    except Exception as e:  # unsupported or invalid: the engine refuses the schema
        compiled, err = None, str(e)[:300]
    return compiled, (time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3, err


def allowed_ids(mask_words, vocab):
    import numpy as np
    bits = np.unpackbits(mask_words.view(np.uint8), bitorder="little")[:vocab]
    return np.nonzero(bits)[0]


def random_instance(engine, compiled, hf_tok, rng, vocab, max_tokens=400):
    """A seeded walk of the engine's masks toward a short complete instance."""
    m = engine.matcher(compiled)
    out = []
    for step in range(max_tokens):
        ids = allowed_ids(engine.fill(m), vocab)
        if len(ids) == 0:
            return None
        if hf_tok.eos[ids].any():
            return hf_tok.decode(out)
        # Prefer tokens that close structure, more so as the walk grows; avoid whitespace runs.
        closing = ids[hf_tok.closing[ids]]
        pool = closing if len(closing) and rng.random() < min(0.9, 0.35 + step / 60) else ids
        solid = pool[~hf_tok.blank[pool]]
        pool = solid if len(solid) else pool
        t = int(pool[rng.randrange(len(pool))])
        if not engine.accept(m, t):
            return None
        out.append(t)
    return None


class HfTok:
    def __init__(self, path):
        import tokenizers
        self.tok = tokenizers.Tokenizer.from_file(path)
        vocab = self.tok.get_vocab_size()
        self.eos_ids = [i for i in range(vocab) if self.tok.id_to_token(i) in ("<|im_end|>", "<|endoftext|>")]
        import numpy as np
        pieces = [self.tok.decode([i], skip_special_tokens=False) for i in range(vocab)]
        self.closing = np.array([any(c in p for c in '"}],') for p in pieces])
        self.blank = np.array([p.strip() == "" for p in pieces])
        self.eos = np.zeros(vocab, dtype=bool)
        self.eos[self.eos_ids] = True

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids


def validator_for(schema):
    import jsonschema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def walk(engine, compiled, ids):
    """Mask times along the instance: (wall us, thread CPU us, accepted)."""
    m = engine.matcher(compiled)
    times, cpu = [], []
    for t in ids:
        t0, c0 = time.perf_counter(), time.thread_time()
        mask = engine.fill(m)
        cpu.append((time.thread_time() - c0) * 1e6)
        times.append((time.perf_counter() - t0) * 1e6)
        if not (mask[t // 32] >> (t % 32)) & 1 or not engine.accept(m, t):
            return times, cpu, False
    return times, cpu, True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "jsonschemabench"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "build", "test-data", "tokenizers", "smollm2", "tokenizer.json"))
    ap.add_argument("--dinfer", default=os.path.join(ROOT, "build", "bin", "dinfer"))
    ap.add_argument("--limit", type=int, default=0, help="schemas per folder (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--instances-out", help="also write the instances (JSONL: file, text, ids) here")
    ap.add_argument("--details", help="also write every schema's figures per engine here (JSON)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", f"{datetime.date(2026, 11, 30)}-structured-vs-peers.json"))
    args = ap.parse_args()
    if not os.path.isdir(args.data):
        args.data = "/work/shared/data/jsonschemabench"

    files = []
    for d in sorted(os.listdir(args.data)):
        names = sorted(glob.glob(os.path.join(args.data, d, "*.json")))
        files += names[: args.limit] if args.limit else names
    rel = [os.path.relpath(f, args.data) for f in files]
    print(f"{len(files)} schemas", file=sys.stderr)

    hf = HfTok(args.tokenizer)
    vocab = hf.tok.get_vocab_size()
    peers = [Llg(args.tokenizer, True), Xgr(args.tokenizer, True)]
    generators = [peers[1], peers[0]]
    rng = random.Random(args.seed)
    records = {r: {"file": r} for r in rel}
    compiled = {p.name: {} for p in peers}
    for f, r in zip(files, rel):
        text = open(f, encoding="utf-8").read()
        for p in peers:
            c, ms, cpu_ms, err = timed_compile(p, text)
            records[r][p.name] = {"ok": c is not None, "compile_ms": ms, "compile_cpu_ms": cpu_ms}
            if err:
                records[r][p.name]["error"] = err
            if c is not None:
                compiled[p.name][r] = c
        # A valid instance: generated by a peer, validated by jsonschema.
        try:
            schema = json.loads(text)
            validator = validator_for(schema)
        except Exception:
            continue
        for p in generators:
            c = compiled[p.name].get(r)
            if c is None:
                continue
            for _ in range(3):
                inst = random_instance(p, c, hf, rng, vocab)
                if inst is None:
                    continue
                try:
                    value = json.loads(inst)
                    if not validator.is_valid(value):
                        continue
                    json.dumps(value, allow_nan=False)
                except Exception:
                    continue
                # Python's json accepts Infinity and NaN, which JSON does not have.
                compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
                records[r]["instance"] = compact
                records[r]["instance_ids"] = hf.encode(compact)
                records[r]["instance_by"] = p.name
                break
            if "instance" in records[r]:
                break

    # dinfer: one C++ run over the same folder and instances.
    with tempfile.TemporaryDirectory() as tmp:
        inst_path = args.instances_out or os.path.join(tmp, "instances.jsonl")
        with open(inst_path, "w") as fo:
            for r in rel:
                if "instance_ids" in records[r]:
                    fo.write(json.dumps({"file": r, "text": records[r]["instance"], "by": records[r]["instance_by"],
                                         "ids": records[r]["instance_ids"]}, ensure_ascii=False) + "\n")
        out_path = os.path.join(tmp, "dinfer.json")
        cmd = [args.dinfer, "grammar", "bench", args.data, "--tokenizer", args.tokenizer,
               "--instances", inst_path, "--json", out_path]
        if args.limit:
            cmd += ["--per-folder-limit", str(args.limit)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        ours = json.load(open(out_path))
    dinfer_setup = ours["summary"]["tokenizer_setup_ms"]
    for s in ours["schemas"]:
        if s["file"] not in records:
            continue
        d = {"ok": s["ok"], "compile_ms": s["compile_ms"], "compile_cpu_ms": s["compile_cpu_ms"]}
        if not s["ok"]:
            d["error"] = s.get("error", "")[:300]
        if "mask_us" in s:
            d["mask_us"] = s["mask_us"]
            d["mask_cpu_us"] = s["mask_cpu_us"]
            d["instance_accepted"] = s["instance_accepted"]
        records[s["file"]]["dinfer"] = d

    # Peers' masks along the same instances.
    for p in peers:
        for r in rel:
            rec = records[r]
            if "instance_ids" not in rec or r not in compiled[p.name]:
                continue
            times, cpu, ok = walk(p, compiled[p.name][r], rec["instance_ids"])
            rec[p.name]["mask_us"] = times
            rec[p.name]["mask_cpu_us"] = cpu
            rec[p.name]["instance_accepted"] = ok

    engines = ["dinfer", "llguidance", "xgrammar"]
    result = {"engines": {}, "setup_ms": {"dinfer": dinfer_setup}}
    for p in peers:
        result["setup_ms"][p.name] = p.setup_ms
    # Mask times compare like for like: over the instances that dinfer and llguidance both accepted
    # (the ratio), and over those all three accepted.
    def accepted(r, names):
        return all(records[r].get(e, {}).get("instance_accepted") for e in names)

    pair = [r for r in rel if accepted(r, ["dinfer", "llguidance"])]
    common = [r for r in rel if accepted(r, engines)]
    for e in engines:
        ok = [r for r in rel if records[r].get(e, {}).get("ok")]
        s = {"compiled": len(ok), "schemas": len(rel), "compiled_share": len(ok) / len(rel)}
        s.update(stats([records[r][e]["compile_cpu_ms"] for r in ok], "compile_cpu_ms"))
        s.update(stats([records[r][e]["compile_ms"] for r in ok], "compile_ms"))
        s["mask_tokens_all_accepted"] = sum(len(records[r][e]["mask_us"]) for r in common)
        s.update(stats([t for r in common for t in records[r][e]["mask_cpu_us"]], "mask_cpu_us"))
        s.update(stats([t for r in common for t in records[r][e]["mask_us"]], "mask_us"))
        s["instances_rejected"] = sum(1 for r in rel if records[r].get(e, {}).get("instance_accepted") is False)
        result["engines"][e] = s
    vs = {"instances": len(pair), "tokens": sum(len(records[r]["dinfer"]["mask_us"]) for r in pair)}
    for e in ("dinfer", "llguidance"):
        vs[e] = {}
        vs[e].update(stats([t for r in pair for t in records[r][e]["mask_cpu_us"]], "mask_cpu_us"))
        vs[e].update(stats([t for r in pair for t in records[r][e]["mask_us"]], "mask_us"))
    result["vs_llguidance"] = vs
    result["mask_mean_ratio_vs_llguidance"] = vs["dinfer"]["mask_cpu_us_mean"] / vs["llguidance"]["mask_cpu_us_mean"]
    result["mask_mean_ratio_vs_llguidance_wall"] = vs["dinfer"]["mask_us_mean"] / vs["llguidance"]["mask_us_mean"]
    result["instances"] = {"generated": sum(1 for r in rel if "instance" in records[r]),
                           "accepted_by_dinfer_and_llguidance": len(pair), "accepted_by_all": len(common)}
    result["config"] = {
        "tokenizer": os.path.relpath(args.tokenizer, ROOT),
        "schemas": len(rel),
        "folders": sorted(os.listdir(args.data)),
        "whitespace": "flexible (dinfer: runs of at most 16; llguidance, xgrammar: unbounded)",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
        "versions": {n: importlib.metadata.version(n) for n in ("xgrammar", "llguidance")},
        "seed": args.seed,
    }
    failures = {}
    for e in engines:
        errs = {}
        for r in rel:
            err = records[r].get(e, {}).get("error")
            if err:
                key = re.sub(r" ?at '[^']*'", "", err.split("\n")[0])
                key = re.sub(r"^\[[0-9:]+\] \S+ ", "", key)[:120]
                errs[key] = errs.get(key, 0) + 1
        failures[e] = dict(sorted(errs.items(), key=lambda kv: -kv[1])[:25])
    result["unsupported_reasons"] = failures
    per_schema = []
    for r in rel:
        row = {"file": r}
        for e in engines:
            x = records[r].get(e)
            if not x:
                continue
            row[e] = {"ok": x["ok"], "compile_cpu_ms": round(x["compile_cpu_ms"], 3)}
            if "mask_us" in x:
                row[e]["tokens"] = len(x["mask_us"])
                row[e]["mask_cpu_us_mean"] = round(statistics.fmean(x["mask_cpu_us"]), 2) if x["mask_cpu_us"] else 0
                row[e]["mask_cpu_us_max"] = round(max(x["mask_cpu_us"]), 2) if x["mask_cpu_us"] else 0
                row[e]["instance_accepted"] = x["instance_accepted"]
        per_schema.append(row)
    if args.details:
        with open(args.details, "w") as fo:
            json.dump(per_schema, fo)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fo:
        json.dump(result, fo, indent=1)
    print(json.dumps({k: result[k] for k in ("engines", "vs_llguidance", "mask_mean_ratio_vs_llguidance", "instances", "setup_ms")}, indent=1))


if __name__ == "__main__":
    main()
