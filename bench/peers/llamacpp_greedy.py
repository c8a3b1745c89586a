#!/usr/bin/env python3
"""Greedy continuations by llama.cpp (the peer) for the same prompt token ids as the transformers file.

Drives the libllama.so that bench/peers/build_llamacpp.sh built, through the pure-Python ctypes layer
(llama_cpp/llama_cpp.py) of the same llama-cpp-python sdist, so bindings and library always match.
Prompt ids are decoded exactly as given (no BOS, no tokenization); each step takes the argmax of the
raw logits (no sampler), EOS included, for exactly --new-tokens tokens.

usage: llamacpp_greedy.py --gguf PATH [--prompts tests/data/smollm2/greedy_transformers.json]
                          [--out tests/data/smollm2/greedy_llamacpp.json] [--llamacpp .deps/llamacpp]
The prompts file is any JSON {"prompts": [{"prompt_ids": [...], "text": ...}, ...]}; when its entries
carry output_ids, the report says where llama.cpp's tokens first differ from them.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import re
import sys
import types

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
N_THREADS = 2
GGML_LOG_LEVEL_WARN = 3
GGML_LOG_LEVEL_CONT = 5


def load_bindings(deps: pathlib.Path):
    """Imports llama_cpp.llama_cpp from the unpacked sdist, bound to the libllama.so we built."""
    # build_llamacpp.sh leaves one stamp, .built-<version>, naming the sdist that bin/ was built from.
    stamps = list(deps.glob(".built-*"))
    lib_dir = deps / "bin"
    if len(stamps) != 1 or not (lib_dir / "libllama.so").exists():
        sys.exit(f"no llama.cpp build under {deps}: run bench/peers/build_llamacpp.sh {deps}")
    version = stamps[0].name.removeprefix(".built-")
    sdist = deps / f"llama_cpp_python-{version}"
    # This llama-cpp-python version loads <LLAMA_CPP_LIB_PATH>/libllama.so (a directory, not a file);
    # libggml*.so beside it are found through the build tree's RPATH.
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    sys.path.insert(0, str(sdist))
    # llama_cpp/__init__.py pulls in the high-level API (numpy, jinja2, diskcache, ...). Only the
    # ctypes layer is needed, so the package is registered without running its __init__.
    package = types.ModuleType("llama_cpp")
    package.__path__ = [str(sdist / "llama_cpp")]
    sys.modules["llama_cpp"] = package
    import llama_cpp.llama_cpp as lib  # noqa: E402  (needs the environment set above)

    commit_file = deps / "llama_cpp_commit"
    commit = commit_file.read_text().strip() if commit_file.exists() else "unknown"
    return lib, f"llama.cpp {commit} (llama-cpp-python {version} sdist, CPU, {N_THREADS} threads)"


class Greedy:
    def __init__(self, lib, gguf: pathlib.Path, n_ctx: int):
        self.lib = lib

        @lib.llama_log_callback
        def log(level, text, _user):
            if level >= GGML_LOG_LEVEL_WARN and level != GGML_LOG_LEVEL_CONT:
                sys.stderr.write(text.decode("utf-8", "replace"))

        self._log = log  # the callback must outlive every llama.cpp call
        lib.llama_log_set(log, None)
        lib.llama_backend_init()

        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 0
        self.model = lib.llama_model_load_from_file(str(gguf).encode(), mparams)
        if not self.model:
            sys.exit(f"llama.cpp could not load {gguf}")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))

        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_ctx
        cparams.n_ubatch = n_ctx
        cparams.n_threads = N_THREADS
        cparams.n_threads_batch = N_THREADS
        self.ctx = lib.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            sys.exit("llama.cpp could not create a context")

    def _decode(self, ids: list[int]) -> np.ndarray:
        tokens = (self.lib.llama_token * len(ids))(*ids)
        # llama_batch_get_one: one sequence, positions continue from the cache, logits for the last token.
        rc = self.lib.llama_decode(self.ctx, self.lib.llama_batch_get_one(tokens, len(ids)))
        if rc != 0:
            sys.exit(f"llama_decode failed ({rc})")
        row = self.lib.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()

    def run(self, prompt_ids: list[int], steps: int) -> tuple[list[int], list[float]]:
        self.lib.llama_memory_clear(self.lib.llama_get_memory(self.ctx), True)
        logits = self._decode(prompt_ids)
        out: list[int] = []
        margins: list[float] = []
        for step in range(steps):
            top2 = np.argpartition(-logits, 2)[:2]
            top2 = top2[np.argsort(-logits[top2], kind="stable")]
            next_id = int(np.argmax(logits))  # lowest id among equal maxima, as torch.argmax on CPU
            out.append(next_id)
            margins.append(round(float(logits[top2[0]] - logits[top2[1]]), 4))
            if step + 1 < steps:
                logits = self._decode([next_id])
        return out, margins

    def close(self) -> None:
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)
        self.lib.llama_backend_free()


def to_json(value) -> str:
    """Indented JSON with lists of numbers kept on one line, so the files read and diff well."""
    text = json.dumps(value, indent=1)
    return re.sub(r"\[\s*([-+0-9.eE,\s]+?)\s*\]",
                  lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text) + "\n"


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True, type=pathlib.Path)
    parser.add_argument("--prompts", default=REPO / "tests/data/smollm2/greedy_transformers.json", type=pathlib.Path)
    parser.add_argument("--out", default=REPO / "tests/data/smollm2/greedy_llamacpp.json", type=pathlib.Path)
    parser.add_argument("--llamacpp", default=REPO / ".deps/llamacpp", type=pathlib.Path,
                        help="DEST of build_llamacpp.sh")
    parser.add_argument("--new-tokens", default=64, type=int)
    args = parser.parse_args()

    lib, source = load_bindings(args.llamacpp.resolve())
    reference = json.loads(args.prompts.read_text())["prompts"]
    longest = max(len(p["prompt_ids"]) for p in reference)
    greedy = Greedy(lib, args.gguf.resolve(), n_ctx=longest + args.new_tokens + 16)

    prompts = []
    for ref in reference:
        output_ids, margins = greedy.run(ref["prompt_ids"], args.new_tokens)
        entry = {"text": ref.get("text", ""), "prompt_ids": ref["prompt_ids"],
                 "output_ids": output_ids, "top2_margins": margins}
        prompts.append(entry)
        note = ""
        if "output_ids" in ref:
            diff = first_difference(output_ids, ref["output_ids"])
            note = "same as reference" if diff is None else f"differs from reference at token {diff}"
        print(f"{len(ref['prompt_ids'])} prompt tokens -> {len(output_ids)} tokens, {note}")
    greedy.close()

    result = {"prompts": prompts, "source": source, "gguf": args.gguf.name, "new_tokens": args.new_tokens}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_json(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
