#!/usr/bin/env python3
"""The Python API (import dinfer; dinfer.LLM(...).generate(...)) on the default model and on a tiny
HF checkpoint given token ids."""
import json
import os
import time
import unittest

import dinfer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class LLMTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llm = dinfer.LLM("default", threads=2, show_progress=False)

    def test_generate_text(self):
        prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
        out = self.llm.generate([prompt], dinfer.SamplingParams(temperature=0, max_tokens=16))
        self.assertEqual(len(out), 1)
        self.assertIn("Paris", out[0].outputs[0].text)
        self.assertIn(out[0].outputs[0].finish_reason, ("stop", "length"))

    def test_batch_and_seeds(self):
        sp = dinfer.SamplingParams(temperature=0.8, top_p=0.95, seed=3, max_tokens=12, ignore_eos=True)
        prompts = ["Once upon a time", "The quick brown fox", "def fibonacci(n):"]
        a = self.llm.generate(prompts, sp)
        b = self.llm.generate(list(reversed(prompts)), sp)
        self.assertEqual([o.outputs[0].token_ids for o in a], [o.outputs[0].token_ids for o in reversed(b)])
        for o in a:
            self.assertEqual(len(o.outputs[0].token_ids), 12)
            self.assertEqual(o.outputs[0].finish_reason, "length")

    def test_token_ids_and_errors(self):
        ids = self.llm.encode("Hello world")
        self.assertEqual(self.llm.decode(ids), "Hello world")
        out = self.llm.generate([ids], dinfer.SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        self.assertEqual(len(out[0].outputs[0].token_ids), 4)
        with self.assertRaises(RuntimeError):
            self.llm.generate([[10 ** 8]], dinfer.SamplingParams(max_tokens=2))
        with self.assertRaises(TypeError):
            dinfer.LLM("default", no_such_option=1)
        with self.assertRaises(KeyError):
            dinfer.LLM("/no/such/model")

    def test_logprobs_and_penalties(self):
        out = self.llm.generate(["Once upon a time"], dinfer.SamplingParams(
            temperature=0, max_tokens=6, ignore_eos=True, logprobs=3))[0].outputs[0]
        self.assertEqual(len(out.logprobs), 6)
        for token, entry in zip(out.token_ids, out.logprobs):
            self.assertIn(token, entry)
            self.assertAlmostEqual(entry[token], max(entry.values()), places=5)  # greedy
            self.assertLessEqual(max(entry.values()), 0.0)
        plain = self.llm.generate(["la la la la"], dinfer.SamplingParams(
            temperature=0, max_tokens=16, ignore_eos=True))[0].outputs[0].token_ids
        penalised = self.llm.generate(["la la la la"], dinfer.SamplingParams(
            temperature=0, max_tokens=16, ignore_eos=True, frequency_penalty=2.0))[0].outputs[0].token_ids
        self.assertLess(max(penalised.count(t) for t in penalised), max(plain.count(t) for t in plain))
        with self.assertRaises(RuntimeError):
            self.llm.generate(["x"], dinfer.SamplingParams(presence_penalty=5.0))

    def test_n_completions_share_the_prompt(self):
        prompt = "Write a short story about a robot who learns to paint. " * 8
        sp = dinfer.SamplingParams(temperature=1.0, seed=11, max_tokens=8, ignore_eos=True, n=3)
        out = self.llm.generate([prompt], sp)[0]
        self.assertEqual([o.index for o in out.outputs], [0, 1, 2])
        self.assertTrue(all(len(o.token_ids) == 8 for o in out.outputs))
        self.assertGreater(len({tuple(o.token_ids) for o in out.outputs}), 1)
        self.assertGreater(out.num_cached_tokens, 0)  # the siblings reused the prompt's blocks
        again = self.llm.generate([prompt], sp)[0]
        self.assertEqual([o.token_ids for o in again.outputs], [o.token_ids for o in out.outputs])

    def test_tiny_checkpoint_matches_transformers(self):
        d = os.path.join(ROOT, "tests", "data", "models", "qwen3")
        with open(os.path.join(d, "fixture.json")) as f:
            fx = json.load(f)
        llm = dinfer.LLM(d, threads=1, show_progress=False)
        out = llm.generate([fx["prompt_ids"]], dinfer.SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
        self.assertEqual(out[0].outputs[0].token_ids, fx["decode_ids"])

    def test_speculative_decoding_gives_the_same_tokens(self):
        d = os.path.join(ROOT, "tests", "data", "models", "deepseek_v4")
        with open(os.path.join(d, "fixture.json")) as f:
            prompt = json.load(f)["prompt_ids"]
        sp = dinfer.SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
        plain = dinfer.LLM(d, threads=1, show_progress=False)
        want = plain.generate([prompt], sp)[0].outputs[0].token_ids
        spec = dinfer.LLM(d, threads=1, show_progress=False, num_speculative_tokens=1)
        got = spec.generate([prompt], sp)[0].outputs[0].token_ids
        self.assertEqual(got, want)
        stats = spec.stats()
        for _ in range(200):  # the engine's loop refreshes its stats after each step
            if stats.generated_tokens >= 12:
                break
            time.sleep(0.01)
            stats = spec.stats()
        self.assertGreater(stats.draft_tokens, 0)
        self.assertLessEqual(stats.accepted_draft_tokens, stats.draft_tokens)
        with self.assertRaises(Exception):
            dinfer.LLM(d, threads=1, show_progress=False, num_speculative_tokens=1,
                       speculative_min_confidence=1.5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
