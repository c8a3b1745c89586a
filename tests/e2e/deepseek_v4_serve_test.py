#!/usr/bin/env python3
"""End-to-end test of `dinfer serve` on a DeepSeek-V4 checkpoint directory: the tiny random V4
fixture (tests/data/models/deepseek_v4, DeepSeek's published layout) widened to V4's real
vocabulary (129,280 tokens: embedding, LM head and hash-routing tables tiled) beside DeepSeek's
tokenizer files, so that requests go through the DeepSeek V4 prompt encoding. Chat Completions,
Completions and Anthropic Messages answer; greedy text is the same across calls, the same as
`dinfer generate` on the same prompt ids, and (on the CPU, where speculation is token-exact) the
same with the MTP layer drafting.

    python3 tests/e2e/deepseek_v4_serve_test.py BUILD_DIR
Environment: DINFER_E2E_DEVICE (cpu or cuda; default cpu), DINFER_DEEPSEEK_TOKENIZER (the folder
with tokenizer.json and tokenizer_config.json; default build/test-data/tokenizers/deepseek_v4,
where scripts/setup puts them).
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

from serve_process import ServeProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "data", "models", "deepseek_v4")
TOKENIZER = os.environ.get("DINFER_DEEPSEEK_TOKENIZER",
                           os.path.join(ROOT, "build", "test-data", "tokenizers", "deepseek_v4"))
DEVICE = os.environ.get("DINFER_E2E_DEVICE", "cpu")
VOCAB = 129280
BINARY = None


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {name: (info["dtype"], info["shape"], data[info["data_offsets"][0]:info["data_offsets"][1]])
            for name, info in header.items()}


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, raw in tensors.values():
            f.write(raw)


def make_checkpoint(out):
    """The fixture with every vocabulary-indexed tensor tiled to VOCAB rows."""
    with open(os.path.join(FIXTURE, "config.json")) as f:
        config = json.load(f)
    vocab = config["vocab_size"]
    tensors = read_safetensors(os.path.join(FIXTURE, "model.safetensors"))
    for name, (dtype, shape, raw) in list(tensors.items()):
        if shape and shape[0] == vocab and (name.endswith("embed.weight") or name.endswith("head.weight")
                                            or name.endswith("tid2eid")):
            reps = -(-VOCAB // vocab)
            row = len(raw) // vocab
            tensors[name] = (dtype, [VOCAB, *shape[1:]], (raw * reps)[:VOCAB * row])
    config["vocab_size"] = VOCAB
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f)
    write_safetensors(os.path.join(out, "model.safetensors"), tensors)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(TOKENIZER, name), out)


class Server(ServeProcess):
    """`dinfer serve` on the checkpoint, under the name "v4"; request() decodes JSON answers."""

    def __init__(self, model, *flags):
        super().__init__(BINARY, model, "--device", DEVICE, "--max-model-len", "512", "--served-model-name",
                         "v4", *flags, start_timeout=120)

    def request(self, path, body=None):
        status, text = self.get(path) if body is None else self.post(path, body)
        return status, json.loads(text) if status == 200 and text else text


MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three primes."}]
PROMPT_IDS = [0, 9601, 14, 2731, 1175, 1950, 16, 201]


class DeepseekV4ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dinfer-v4-serve-")
        make_checkpoint(cls.dir)
        cls.server = Server(cls.dir)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def chat(self, server=None, **kw):
        body = {"model": "v4", "messages": MESSAGES, "max_tokens": 8, "temperature": 0}
        body.update(kw)
        status, r = (server or self.server).request("/v1/chat/completions", body)
        self.assertEqual(status, 200, r)
        return r

    def test_chat_completions_are_greedy_and_repeatable(self):
        a, b = self.chat(), self.chat()
        self.assertEqual(a["choices"][0]["message"], b["choices"][0]["message"])
        usage = a["usage"]
        # The encoding: BOS, the system prompt, the user turn, the assistant prefix.
        self.assertGreater(usage["prompt_tokens"], 8)
        self.assertTrue(1 <= usage["completion_tokens"] <= 8, usage)
        self.assertIn(a["choices"][0]["finish_reason"], ("stop", "length"))

    def test_completions_match_dinfer_generate(self):
        status, r = self.server.request("/v1/completions", {"model": "v4", "prompt": [PROMPT_IDS],
                                                            "max_tokens": 6, "temperature": 0,
                                                            "ignore_eos": True})
        self.assertEqual(status, 200, r)
        self.assertEqual(r["usage"]["prompt_tokens"], len(PROMPT_IDS))
        res = subprocess.run([BINARY, "--log-level", "warn", "generate", "--model", self.dir, "--device", DEVICE,
                              "--prompt-ids", ",".join(map(str, PROMPT_IDS)), "-n", "6", "--ignore-eos"],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(res.stdout[:-1], r["choices"][0]["text"])  # generate ends with a newline

    def test_anthropic_messages(self):
        status, r = self.server.request("/v1/messages", {"model": "v4", "max_tokens": 8, "temperature": 0,
                                                         "system": "You are terse.",
                                                         "messages": [{"role": "user",
                                                                       "content": "Name three primes."}]})
        self.assertEqual(status, 200, r)
        self.assertEqual(r["type"], "message")
        self.assertIn(r["stop_reason"], ("end_turn", "max_tokens"))
        self.assertTrue(1 <= r["usage"]["output_tokens"] <= 8, r["usage"])

    @unittest.skipUnless(DEVICE == "cpu", "speculation is token-exact on the CPU only")
    def test_mtp_speculation_gives_the_same_text(self):
        spec = Server(self.dir, "--num-speculative-tokens", "1")
        try:
            for kw in ({}, {"max_tokens": 24}):
                self.assertEqual(self.chat(spec, **kw)["choices"][0]["message"],
                                 self.chat(**kw)["choices"][0]["message"])
        finally:
            spec.stop()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    BINARY = os.path.join(os.path.abspath(sys.argv.pop(1)), "bin", "dinfer")
    if not os.path.exists(os.path.join(TOKENIZER, "tokenizer.json")):
        sys.exit(f"DeepSeek's tokenizer.json is not in {TOKENIZER} (scripts/setup puts it there)")
    unittest.main()
