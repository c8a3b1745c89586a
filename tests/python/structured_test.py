#!/usr/bin/env python3
"""Structured outputs through the Python API on the default model: vLLM-style
structured_outputs and DeepInfer-style so_args, every constraint type, and errors at submission."""
import json
import re
import unittest

import dinfer

PROMPT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


class StructuredOutputsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llm = dinfer.LLM("default", threads=2, show_progress=False)

    def test_json_schema_both_spellings(self):
        schema = {"type": "object",
                  "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20},
                                 "population": {"type": "integer", "minimum": 0}},
                  "required": ["city", "population"], "additionalProperties": False}
        prompt = PROMPT.format("Give a city and its population as JSON.")
        params = [
            dinfer.SamplingParams(temperature=0.7, seed=1, max_tokens=96,
                                  structured_outputs=dinfer.StructuredOutputsParams(json=schema)),
            dinfer.SamplingParams(temperature=0.7, seed=2, max_tokens=96,
                                  so_args={"schema_type": "json_schema", "schema": json.dumps(schema)}),
        ]
        for out in self.llm.generate([prompt, prompt], params):
            text = out.outputs[0].text
            self.assertEqual(out.outputs[0].finish_reason, "stop", text)
            value = json.loads(text)
            self.assertEqual(list(value), ["city", "population"])
            self.assertIsInstance(value["city"], str)
            self.assertTrue(1 <= len(value["city"]) <= 20)
            self.assertIsInstance(value["population"], int)
            self.assertGreaterEqual(value["population"], 0)

    def test_regex_choice_grammar_json_object(self):
        prompt = PROMPT.format("Answer briefly.")
        outs = self.llm.generate([prompt] * 4, [
            dinfer.SamplingParams(temperature=0.8, seed=3, max_tokens=16,
                                  structured_outputs=dinfer.StructuredOutputsParams(regex=r"[A-Z][a-z]{2,8}!")),
            dinfer.SamplingParams(temperature=0.8, seed=4, max_tokens=16,
                                  so_args={"schema_type": "choice", "schema": ["left", "right"]}),
            dinfer.SamplingParams(temperature=0.8, seed=5, max_tokens=16,
                                  structured_outputs=dinfer.StructuredOutputsParams(
                                      grammar='root ::= "(" [0-9] ("," [0-9])* ")"')),
            dinfer.SamplingParams(temperature=0.8, seed=6, max_tokens=64,
                                  structured_outputs=dinfer.StructuredOutputsParams(json_object=True,
                                                                                    max_whitespace=0)),
        ])
        self.assertRegex(outs[0].outputs[0].text, r"^[A-Z][a-z]{2,8}!$")
        self.assertIn(outs[1].outputs[0].text, ("left", "right"))
        # Near the token limit the output is steered to its shortest completion: it ends complete.
        self.assertEqual(outs[2].outputs[0].finish_reason, "stop")
        self.assertRegex(outs[2].outputs[0].text, r"^\([0-9](,[0-9])*\)$")
        obj = outs[3].outputs[0]
        self.assertEqual(obj.finish_reason, "stop", obj.text)
        self.assertIsInstance(json.loads(obj.text), dict)
        self.assertNotIn(" ", re.sub(r'"(\\.|[^"\\])*"', "", obj.text))  # compact

    def test_refused_at_submission(self):
        prompt = PROMPT.format("x")
        with self.assertRaisesRegex(RuntimeError, "uniqueItems"):
            self.llm.generate([prompt], dinfer.SamplingParams(
                so_args={"schema_type": "json_schema", "schema": {"type": "array", "uniqueItems": True}}))
        with self.assertRaises(ValueError):
            dinfer.SamplingParams(structured_outputs=dinfer.StructuredOutputsParams(json={}, regex="a"))._to_native()
        with self.assertRaises(ValueError):
            dinfer.SamplingParams(so_args={"schema_type": "yaml", "schema": "a"})._to_native()
        with self.assertRaises(ValueError):
            self.llm.generate([prompt], dinfer.SamplingParams(
                so_args={"schema_type": "json_schema", "schema": "{not json"}))


if __name__ == "__main__":
    unittest.main(verbosity=2)
