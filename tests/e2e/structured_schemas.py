#!/usr/bin/env python3
"""End to end: the default model generates under real JSON Schemas, and every output must parse
and validate (the `jsonschema` package is the judge) and end complete (finish reason "stop").
By default the schemas are the 50 in tests/data/structured/e2e_schemas (real schemas from
JSONSchemaBench, see the README there), all taken. With --data DIR (the JSONSchemaBench folders,
e.g. ../shared/data/jsonschemabench) every 37th schema of each folder is taken in a fixed order;
a schema the engine refuses at submission is reported and the next one taken, until --count
schemas ran. Exits 1 if any output is invalid or incomplete.

    PYTHONPATH=build/python .venv/bin/python tests/e2e/structured_schemas.py [--json OUT]
Needs the Python module and jsonschema (scripts/setup builds and installs both).
"""
import argparse
import json
import os
import sys

import jsonschema

import dinfer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def schema_files(data):
    if not any(os.path.isdir(os.path.join(data, d)) for d in os.listdir(data)):
        yield from sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".json"))
        return
    folders = [sorted(os.path.join(data, d, f) for f in os.listdir(os.path.join(data, d)) if f.endswith(".json"))
               for d in sorted(os.listdir(data)) if os.path.isdir(os.path.join(data, d))]
    # Interleave the folders, every 37th file of each, so that the sample spreads over the data.
    picks = [files[::37] for files in folders]
    for i in range(max(len(p) for p in picks)):
        for p in picks:
            if i < len(p):
                yield p[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "tests", "data", "structured", "e2e_schemas"))
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--max-tokens", type=int, default=640)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.6)
    ap.add_argument("--json", help="write each schema's outcome here")
    args = ap.parse_args()
    llm = dinfer.LLM("default", show_progress=False, max_num_seqs=args.batch)
    chosen, refused = [], []
    for path in schema_files(args.data):
        if len(chosen) == args.count:
            break
        text = open(path, encoding="utf-8").read()
        schema = json.loads(text)
        prompt = ("<|im_start|>system\nYou write JSON documents that follow the given JSON Schema.<|im_end|>\n"
                  f"<|im_start|>user\nSchema:\n{text[:1500]}\nWrite one example document.<|im_end|>\n"
                  "<|im_start|>assistant\n")
        sp = dinfer.SamplingParams(temperature=args.temperature, top_p=0.95, seed=len(chosen) + 1,
                                   max_tokens=args.max_tokens,
                                   so_args={"schema_type": "json_schema", "schema": text, "max_whitespace": 4})
        try:
            llm.generate(["x"], dinfer.SamplingParams(max_tokens=1, so_args=sp.so_args))
        except Exception as e:
            refused.append({"file": os.path.relpath(path, args.data), "reason": str(e)[:200]})
            continue
        chosen.append((path, schema, prompt, sp))
    results, bad = [], 0
    for start in range(0, len(chosen), args.batch):
        batch = chosen[start:start + args.batch]
        outs = llm.generate([c[2] for c in batch], [c[3] for c in batch])
        for (path, schema, _, _), out in zip(batch, outs):
            o = out.outputs[0]
            rel = os.path.relpath(path, args.data)
            row = {"file": rel, "finish": o.finish_reason, "tokens": len(o.token_ids)}
            try:
                value = json.loads(o.text)
                cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
                errors = [e.message for e in cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(value)]
                row["valid"] = not errors and o.finish_reason == "stop"
                if errors:
                    row["errors"] = errors[:3]
            except json.JSONDecodeError as e:
                row["valid"] = False
                row["errors"] = [f"not JSON: {e}"]
            if not row["valid"]:
                bad += 1
                row["text"] = o.text[:400]
            results.append(row)
            print(f"{'ok ' if row['valid'] else 'BAD'} {rel} ({row['finish']}, {row['tokens']} tokens)", flush=True)
    print(f"{len(results) - bad} of {len(results)} outputs parse and validate; "
          f"{len(refused)} schemas refused at submission (skipped)")
    if args.json:
        summary = {"schemas": len(results), "valid": len(results) - bad, "refused": len(refused),
                   "config": {"model": "default", "max_tokens": args.max_tokens, "temperature": args.temperature,
                              "top_p": 0.95, "max_whitespace": 4, "batch": args.batch,
                              "data": os.path.relpath(args.data, ROOT)}}
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "results": results, "refused": refused}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
