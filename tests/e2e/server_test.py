"""End-to-end tests of `dinfer serve` on the default model, driven by the official openai and
anthropic Python clients: every endpoint streamed and not, stop sequences, tool calls and
reasoning, errors in each protocol's shape, client disconnects, graceful shutdown, and a bounded
loopback load test (500 concurrent streams). Greedy decoding keeps the outputs comparable across
calls.

    DINFER_BUILD_DIR=build .venv/bin/python -m pytest tests/e2e/server_test.py
"""
import asyncio
import json
import os
import re
import signal
import socket
import tempfile
import time

import anthropic
import openai
import pytest
from serve_process import ServeProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.abspath(os.environ.get("DINFER_BUILD_DIR", os.path.join(ROOT, "build")))
BINARY = os.path.join(BUILD, "bin", "dinfer")
KEY = "test-key"
QUESTION = "What is the capital of France? Answer in one sentence."
# The anthropic client has no sampling arguments any more; the API still takes them.
GREEDY = {"temperature": 0}


class Server(ServeProcess):
    """The default model behind `dinfer serve`, with its metrics."""

    def __init__(self, *flags):
        super().__init__(BINARY, "default", *flags)

    def metrics(self):
        status, text = self.get("/metrics")
        assert status == 200
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_idle(self, timeout=30):
        """Waits until the engine runs nothing and holds no KV blocks; returns the metrics."""
        deadline = time.time() + timeout
        while True:
            m = self.metrics()
            if m["dinfer_requests_running"] == 0 and m["dinfer_requests_waiting"] == 0 and \
                    m["dinfer_kv_cache_usage_ratio"] == 0:
                return m
            assert time.time() < deadline, f"the engine did not go idle: {m}"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def server():
    s = Server("--api-key", KEY, "--max-model-len", "1024", "--max-request-mib", "1")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(api_key=KEY, base_url=server.url + "/v1", max_retries=0)


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(api_key=KEY, base_url=server.url, max_retries=0)


def chat(oai, **kw):
    args = dict(model="default", messages=[{"role": "user", "content": QUESTION}], temperature=0,
                max_tokens=12)
    args.update(kw)
    return oai.chat.completions.create(**args)


# --- basic endpoints ---------------------------------------------------------------------------

def test_health_and_models(server, oai, claude):
    assert server.get("/health")[0] == 200
    assert [m.id for m in oai.models.list()] == ["default"]
    assert oai.models.retrieve("default").id == "default"
    assert [m.id for m in claude.models.list()] == ["default"]


def test_metrics_are_prometheus_text(server, oai):
    chat(oai, max_tokens=4)
    m = server.metrics()
    for name in ("dinfer_time_to_first_token_seconds_count", "dinfer_time_per_output_token_seconds_count",
                 "dinfer_e2e_request_latency_seconds_count", "dinfer_prompt_tokens_total",
                 "dinfer_generation_tokens_total", "dinfer_kv_cache_usage_ratio", "dinfer_prefix_cache_hit_rate",
                 "dinfer_requests_running", "dinfer_requests_waiting", "dinfer_spec_draft_tokens_total",
                 'dinfer_spec_skipped_drafts_total{reason="low_confidence"}',
                 'dinfer_spec_skipped_drafts_total{reason="low_acceptance"}'):
        assert name in m, name
    assert m['dinfer_requests_total{endpoint="/v1/chat/completions",status="200"}'] >= 1
    assert m["dinfer_time_to_first_token_seconds_count"] >= 1


# --- chat completions --------------------------------------------------------------------------

def test_chat_completion(oai):
    r = chat(oai)
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == "default"
    assert r.created > 1_600_000_000
    c = r.choices[0]
    assert c.message.role == "assistant" and "Paris" in c.message.content, c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_matches_non_streaming(oai):
    full = chat(oai).choices[0].message.content
    chunks = list(chat(oai, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_chat_n_seed_and_logprobs(oai):
    r = chat(oai, n=2, temperature=1.0, seed=7, max_tokens=8, logprobs=True, top_logprobs=2)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert len(c.logprobs.content) > 0
        for lp in c.logprobs.content:
            assert lp.logprob <= 0 and len(lp.top_logprobs) == 2
    again = chat(oai, n=2, temperature=1.0, seed=7, max_tokens=8)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)


def test_chat_stop_sequence(oai):
    full = chat(oai).choices[0].message.content
    assert " Paris" in full
    r = chat(oai, stop=[" Paris", "never appears"])
    assert r.choices[0].message.content == full[:full.index(" Paris")]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(oai, stop=" Paris", stream=True))
    assert streamed == full[:full.index(" Paris")]


def test_chat_length_and_penalties(oai):
    r = chat(oai, max_completion_tokens=3, presence_penalty=0.5, frequency_penalty=0.5, top_p=0.9)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3


# --- completions -------------------------------------------------------------------------------

def test_completions(oai):
    r = oai.completions.create(model="default", prompt="The capital of France is", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.choices[0].text and r.choices[0].finish_reason in ("stop", "length")
    streamed = "".join(c.choices[0].text for c in oai.completions.create(
        model="default", prompt="The capital of France is", max_tokens=6, temperature=0, stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_completions_token_ids_batch_echo_and_logprobs(oai):
    ids = oai.completions.create(model="default", prompt=[[504, 3575, 282]], max_tokens=4, temperature=0)
    assert ids.usage.prompt_tokens == 3
    batch = oai.completions.create(model="default", prompt=["One, two,", "Red, green,"], n=2, max_tokens=4,
                                   temperature=0)
    assert sorted(c.index for c in batch.choices) == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text
    echo = oai.completions.create(model="default", prompt="One, two,", max_tokens=4, temperature=0, echo=True)
    assert echo.choices[0].text.startswith("One, two,")
    lp = oai.completions.create(model="default", prompt="One, two,", max_tokens=4, temperature=0, logprobs=3)
    assert len(lp.choices[0].logprobs.tokens) == 4 and len(lp.choices[0].logprobs.top_logprobs[0]) == 3
    assert "".join(lp.choices[0].logprobs.tokens) == lp.choices[0].text


# --- responses ---------------------------------------------------------------------------------

def test_responses(oai):
    r = oai.responses.create(model="default", input=QUESTION, max_output_tokens=12, temperature=0)
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status in ("completed", "incomplete") and "Paris" in r.output_text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    with_items = oai.responses.create(
        model="default", instructions="Answer briefly.", max_output_tokens=12, temperature=0,
        input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert with_items.output_text


def test_responses_logprobs_and_text_echo(oai):
    fmt = {"type": "json_schema", "name": "n", "schema": {"type": "integer"}, "strict": True}
    r = oai.responses.create(model="default", input=QUESTION, temperature=0, max_output_tokens=6, top_logprobs=2,
                             text={"format": fmt})
    part = r.output[0].content[0]
    assert len(part.logprobs) == r.usage.output_tokens and all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert r.text.format.type == "json_schema" and r.top_logprobs == 2
    events = list(oai.responses.create(model="default", input=QUESTION, temperature=0, max_output_tokens=6,
                                       top_logprobs=2, text={"format": fmt}, stream=True))
    streamed = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    done = [e for e in events if e.type == "response.output_text.done"][0]
    assert [lp.token for lp in done.logprobs] == [lp.token for lp in part.logprobs]
    assert streamed == [lp.token for lp in part.logprobs][:len(streamed)] and streamed


def test_responses_stream(oai):
    full = oai.responses.create(model="default", input=QUESTION, max_output_tokens=12, temperature=0).output_text
    events = list(oai.responses.create(model="default", input=QUESTION, max_output_tokens=12, temperature=0,
                                       stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == full
    assert events[-1].response.output_text == full


# --- anthropic messages ------------------------------------------------------------------------

def test_messages(claude):
    m = claude.messages.create(model="default", max_tokens=12, extra_body=GREEDY, system="Answer briefly.",
                               messages=[{"role": "user", "content": QUESTION}])
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens > 0 and m.usage.output_tokens > 0


def test_messages_stream_and_stop_sequence(claude):
    args = dict(model="default", max_tokens=12, extra_body=GREEDY,
                messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
    full = claude.messages.create(**args).content[0].text
    with claude.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full and final.content[0].text == full
    cut = full.index(" Paris")
    stopped = claude.messages.create(**args, stop_sequences=[" Paris"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == " Paris"
    assert stopped.content[0].text == full[:cut]
    with claude.messages.stream(**args, stop_sequences=[" Paris"]) as stream:
        assert "".join(stream.text_stream) == full[:cut]
        assert stream.get_final_message().stop_reason == "stop_sequence"


def test_prefill_is_continued(oai, claude):
    """A final assistant message is the start of the answer: only the continuation comes back."""
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "The capital of France is"}]
    m = claude.messages.create(model="default", max_tokens=4, extra_body=GREEDY, messages=messages)
    assert m.content[0].text.lstrip().startswith("Paris"), m.content[0].text
    r = chat(oai, messages=messages, max_tokens=4, extra_body={"continue_final_message": True})
    assert r.choices[0].message.content == m.content[0].text


def test_count_tokens(claude):
    messages = [{"role": "user", "content": QUESTION}]
    counted = claude.messages.count_tokens(model="default", messages=messages).input_tokens
    m = claude.messages.create(model="default", max_tokens=1, messages=messages)
    assert counted == m.usage.input_tokens + m.usage.cache_read_input_tokens


# --- tool calls and reasoning ------------------------------------------------------------------
# The default model's template knows neither, so this server takes Qwen2.5's template (Hermes tool
# calls, which SmolLM2's ChatML shares), changed to open the assistant's turn inside <think> when
# thinking is asked for: whatever the model writes then is reasoning.

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# A 135M model does not call tools on its own; it does copy text, and the copy is a call.
CALL = 'Copy this text exactly and write nothing else:\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_server():
    with open(os.path.join(ROOT, "tests", "data", "chat_templates", "qwen2.5.jinja")) as f:
        template = f.read()
    opening = "{{- '<|im_start|>assistant\\n' }}"
    assert template.rstrip().endswith(opening + "\n{%- endif %}"), template[-200:]
    template = template.replace(opening, opening + (
        "{%- if (enable_thinking is defined and enable_thinking) or "
        "(reasoning_effort is defined and reasoning_effort) %}{{- '<think>\\n' }}{%- endif %}"))
    with tempfile.NamedTemporaryFile("w", suffix=".jinja", delete=False) as f:
        f.write(template)
    s = Server("--chat-template", f.name)
    yield s
    s.stop()
    os.unlink(f.name)


def test_chat_tool_call(tool_server):
    oai = openai.OpenAI(api_key="x", base_url=tool_server.url + "/v1", max_retries=0)
    args = dict(model="default", messages=[{"role": "user", "content": CALL}], tools=TOOLS, temperature=0,
                max_tokens=40)
    r = oai.chat.completions.create(**args)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None
    (call,) = c.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    chunks = list(oai.chat.completions.create(**args, stream=True))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == {"city": "Paris"}
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == \
        ["tool_calls"]
    # The call goes back into the conversation with its result; the template renders both.
    follow = oai.chat.completions.create(model="default", tools=TOOLS, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert follow.choices[0].message.content
    # Without tools in the request the same text is an answer, not a call.
    plain = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": CALL}],
                                        temperature=0, max_tokens=40)
    assert plain.choices[0].message.tool_calls is None


def test_responses_and_messages_tool_calls(tool_server):
    oai = openai.OpenAI(api_key="x", base_url=tool_server.url + "/v1", max_retries=0)
    r = oai.responses.create(model="default", input=CALL, temperature=0, max_output_tokens=40,
                             tools=[{"type": "function", **TOOLS[0]["function"]}])
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    events = list(oai.responses.create(model="default", input=CALL, temperature=0, max_output_tokens=40,
                                       stream=True, tools=[{"type": "function", **TOOLS[0]["function"]}]))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    claude = anthropic.Anthropic(api_key="x", base_url=tool_server.url, max_retries=0)
    tools = [{"name": "get_weather", "description": "Get the weather in a city",
              "input_schema": TOOLS[0]["function"]["parameters"]}]
    m = claude.messages.create(model="default", max_tokens=40, extra_body=GREEDY, tools=tools,
                               messages=[{"role": "user", "content": CALL}])
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and use.input == {"city": "Paris"}
    with claude.messages.stream(model="default", max_tokens=40, extra_body=GREEDY, tools=tools,
                                messages=[{"role": "user", "content": CALL}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}
    # The result goes back as a tool_result block.
    after = claude.messages.create(model="default", max_tokens=8, extra_body=GREEDY, tools=tools, messages=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}])
    assert after.content[0].type == "text"


def test_strict_tools_with_auto_choice(tool_server):
    """Strict tools, tool_choice auto: text stays free, and a call the model writes follows the schema."""
    oai = openai.OpenAI(api_key="x", base_url=tool_server.url + "/v1", max_retries=0)
    strict = {"type": "function", "function": {
        "name": "get_weather", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}},
                       "required": ["city"], "additionalProperties": False}}}
    # The model copies a call for Paris; the schema only allows Oslo or Rome.
    r = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": CALL}], tools=[strict],
                                    temperature=0, max_tokens=40)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    (call,) = c.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Oslo", "Rome")
    # Without a call, the answer is text as before.
    r = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": QUESTION}],
                                    tools=[strict], temperature=0, max_tokens=12)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls
    # vLLM's structural tag directly.
    tag = {"type": "structural_tag", "triggers": ["<b>"],
           "structures": [{"begin": "<b>", "schema": {"type": "integer"}, "end": "</b>"}]}
    r = oai.chat.completions.create(model="default", temperature=0, max_tokens=40, response_format=tag,
                                    messages=[{"role": "user", "content": "Copy exactly: the answer is <b>forty</b>."}])
    for m in re.finditer(r"<b>(.*?)(</b>|$)", r.choices[0].message.content):
        assert re.fullmatch(r"-?[0-9]*", m.group(1)), r.choices[0].message.content


def test_reasoning(tool_server):
    oai = openai.OpenAI(api_key="x", base_url=tool_server.url + "/v1", max_retries=0)
    r = oai.chat.completions.create(model="default", messages=[{"role": "user", "content": QUESTION}],
                                    temperature=0, max_tokens=8,
                                    extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = r.choices[0].message
    assert message.reasoning_content and not message.content
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens
    streamed = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in
                       oai.chat.completions.create(model="default", messages=[{"role": "user", "content": QUESTION}],
                                                   temperature=0, max_tokens=8, stream=True,
                                                   extra_body={"chat_template_kwargs": {"enable_thinking": True}})
                       if ch.choices)
    assert streamed == message.reasoning_content
    resp = oai.responses.create(model="default", input=QUESTION, temperature=0, max_output_tokens=8,
                                reasoning={"effort": "low"})
    assert resp.output[0].type == "reasoning" and resp.output[0].content[0].text == message.reasoning_content
    claude = anthropic.Anthropic(api_key="x", base_url=tool_server.url, max_retries=0)
    args = dict(model="default", max_tokens=8, extra_body=GREEDY, thinking={"type": "enabled", "budget_tokens": 4},
                messages=[{"role": "user", "content": QUESTION}])
    m = claude.messages.create(**args)
    assert m.content[0].type == "thinking" and m.content[0].thinking == message.reasoning_content
    with claude.messages.stream(**args) as stream:
        thinking = "".join(e.delta.thinking for e in stream
                           if e.type == "content_block_delta" and e.delta.type == "thinking_delta")
    assert thinking == message.reasoning_content


# --- structured outputs ------------------------------------------------------------------------

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                           "city": {"enum": ["Paris", "Rome", "Oslo"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}


def is_person(text):
    v = json.loads(text)
    return (set(v) == {"name", "age", "city"} and isinstance(v["name"], str) and len(v["name"]) <= 12 and
            isinstance(v["age"], int) and 0 <= v["age"] <= 130 and v["city"] in ("Paris", "Rome", "Oslo"))


def test_response_format_json_schema_and_json_object(oai):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    for temperature in (0, 1):
        r = chat(oai, messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=80,
                 response_format=fmt, temperature=temperature, seed=7)
        assert r.choices[0].finish_reason == "stop" and is_person(r.choices[0].message.content)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chat(
        oai, messages=[{"role": "user", "content": "Describe a person as JSON."}], max_tokens=80,
        response_format=fmt, stream=True) if ch.choices)
    assert is_person(streamed)
    r = chat(oai, max_tokens=60, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)


def test_structured_outputs_extension(oai):
    r = chat(oai, max_tokens=20, extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}})
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", r.choices[0].message.content)
    r = chat(oai, max_tokens=20, extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
    assert r.choices[0].message.content in ("yes", "no", "maybe")
    r = oai.completions.create(model="default", prompt="A person:", max_tokens=80, temperature=0,
                               extra_body={"structured_outputs": {"json": PERSON, "disable_any_whitespace": True}})
    text = r.choices[0].text
    assert is_person(text) and not re.search(r"\s", re.sub(r'"(?:[^"\\]|\\.)*"', "", text))  # compact
    r = chat(oai, max_tokens=30, extra_body={"structured_outputs": {"grammar": 'root ::= "x" [0-9]+ "y"'}})
    assert re.fullmatch("x[0-9]+y", r.choices[0].message.content)


def test_responses_and_messages_structured(oai, claude):
    r = oai.responses.create(model="default", input="Describe a person as JSON.", temperature=0, max_output_tokens=80,
                             text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                                              "strict": True}})
    assert is_person(r.output_text)
    m = claude.messages.create(model="default", max_tokens=80, messages=[{"role": "user", "content": "A person?"}],
                               extra_body={**GREEDY, "output_config": {"format": {"type": "json_schema",
                                                                                  "schema": PERSON}}})
    assert m.stop_reason == "end_turn" and is_person(m.content[0].text)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "unit": {"$ref": "#/$defs/unit"}},
                   "required": ["city", "unit"], "$defs": {"unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string", "maxLength": 8}},
                                       "required": ["tz"], "additionalProperties": False}}}


def test_forced_tool_calls(oai, claude):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = chat(oai, messages=ask, max_tokens=150, tools=[WEATHER, TIME], tool_choice=choice)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls" and c.message.content is None
        (call,) = c.message.tool_calls
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert {"city", "unit"} <= set(args) and args["unit"] in ("celsius", "fahrenheit")
        else:
            assert choice == "required" and call.function.name == "get_time" and set(args) == {"tz"}
    chunks = list(chat(oai, messages=ask, max_tokens=150, tools=[WEATHER, TIME], stream=True,
                       tool_choice={"type": "function", "function": {"name": "get_time"}}))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_time"
    assert set(json.loads("".join(d.function.arguments or "" for d in deltas))) == {"tz"}
    r = oai.responses.create(model="default", input="Time in Oslo?", temperature=0, max_output_tokens=150,
                             tools=[{"type": "function", **TIME["function"], "strict": True}],
                             tool_choice={"type": "function", "name": "get_time"})
    (call,) = [item for item in r.output if item.type == "function_call"]
    assert call.name == "get_time" and set(json.loads(call.arguments)) == {"tz"}
    m = claude.messages.create(model="default", max_tokens=150, extra_body=GREEDY, messages=ask,
                               tools=[{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
                               tool_choice={"type": "any"})
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and use.name == "get_weather" and {"city", "unit"} <= set(use.input)


def test_structured_errors(oai, claude):
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "array", "uniqueItems": True}}})
    assert e.value.body["param"] == "response_format.json_schema" and "uniqueItems" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, response_format={"type": "json_object"}, extra_body={"structured_outputs": {"regex": "a"}})
    assert "both constrain" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, extra_body={"structured_outputs": {"regex": "a", "choice": ["b"]}})
    assert e.value.body["param"] == "structured_outputs"
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, extra_body={"structured_outputs": {"regex": "a(?=b)"}})
    assert "lookahead" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="default", max_tokens=8, messages=[
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "{"}],
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": PERSON}}})
    assert "prefilled" in e.value.body["error"]["message"]
    assert chat(oai).choices[0].message.content  # the server keeps serving


# --- errors ------------------------------------------------------------------------------------

def test_authentication(server):
    bad_oai = openai.OpenAI(api_key="wrong", base_url=server.url + "/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_oai.models.list()
    bad_claude = anthropic.Anthropic(api_key="wrong", base_url=server.url, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        bad_claude.messages.create(model="default", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "authentication_error"
    assert server.get("/health")[0] == 200  # health needs no key


def test_unknown_model(oai, claude):
    with pytest.raises(openai.NotFoundError) as e:
        chat(oai, model="gpt-nonexistent")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="claude-nonexistent", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("kw,param", [
    (dict(temperature=3), "temperature"),
    (dict(top_logprobs=3), "top_logprobs"),
    (dict(n=0), "n"),
    (dict(messages=[]), "messages"),
    (dict(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    (dict(response_format={"type": "yaml"}), "response_format"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format.json_schema"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}),
     "tool_choice"),
    (dict(logit_bias={"abc": 1}), "logit_bias"),
])
def test_bad_chat_parameters(oai, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, **kw)
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"


def test_bad_messages_parameters(claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="default", max_tokens=4, extra_body={"temperature": 1.5},
                               messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "invalid_request_error" and "temperature" in e.value.message


def test_context_length(oai, claude):
    with pytest.raises(openai.BadRequestError) as e:
        chat(oai, max_tokens=5000)
    body = e.value.body
    assert body["code"] == "context_length_exceeded"
    assert "1024" in body["message"] and "5000" in body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai.completions.create(model="default", prompt="hello " * 1500, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="default", max_tokens=2000, messages=[{"role": "user", "content": "x"}])
    assert "1024" in e.value.message


def test_body_too_large(server, oai):
    with pytest.raises(openai.APIStatusError) as e:
        chat(oai, messages=[{"role": "user", "content": "x" * (2 << 20)}])
    assert e.value.status_code == 413
    status, body = server.post("/v1/messages", b"{" + b" " * (2 << 20) + b"}", {"x-api-key": KEY})
    assert status == 413 and json.loads(body)["error"]["type"] == "request_too_large"


def test_malformed_requests(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    status, body = server.post("/v1/chat/completions", b"{not json", auth)
    assert status == 400 and "JSON" in json.loads(body)["error"]["message"]
    status, _ = server.get("/v1/chat/completions", auth)
    assert status == 405
    status, body = server.post("/v1/nothing", {}, auth)
    assert status == 404


# --- HTTP behaviour ----------------------------------------------------------------------------

def raw_exchange(server, data, responses):
    """Sends raw bytes on one connection and reads `responses` complete responses."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(data)
        buf = b""
        done = 0
        while done < responses:
            chunk = s.recv(65536)
            assert chunk, buf
            buf += chunk
            done = buf.count(b"HTTP/1.1 ")
            if done == responses:
                # the last response's body is complete once its Content-Length bytes arrived
                head, _, body = buf.rpartition(b"HTTP/1.1 ")[2].partition(b"\r\n\r\n")
                n = int(re.search(rb"Content-Length: (\d+)", head).group(1))
                if len(body) < n:
                    done -= 1
        return buf


def test_keep_alive_and_pipelining(server):
    req = f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode()
    out = raw_exchange(server, req * 3, 3)
    assert out.count(b"HTTP/1.1 200 OK") == 3


def test_client_disconnect_aborts_and_frees_kv(server):
    body = json.dumps({"model": "default", "prompt": "Once upon a time", "max_tokens": 500, "stream": True,
                       "ignore_eos": True}).encode()
    before = server.metrics().get('dinfer_requests_total{endpoint="/v1/completions",status="499"}', 0)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(65536)
        assert server.metrics()["dinfer_requests_running"] == 1
    m = server.wait_idle(timeout=10)
    assert m['dinfer_requests_total{endpoint="/v1/completions",status="499"}'] == before + 1
    assert m["dinfer_generation_tokens_total"] >= 0


@pytest.mark.parametrize("status", [503, 429])
def test_queue_full(status):
    s = Server("--max-num-seqs", "1", "--max-waiting", "1", "--queue-full-status", str(status))
    try:
        async def run():
            client = openai.AsyncOpenAI(api_key="x", base_url=s.url + "/v1", max_retries=0)
            claude = anthropic.AsyncAnthropic(api_key="x", base_url=s.url, max_retries=0)
            # One request runs (max_num_seqs 1) while another waits: the queue is full. They are long
            # enough (seconds on the CPU) that neither finishes within the sleeps below.
            long_req = dict(model="default", prompt="Once upon a time", max_tokens=1000, extra_body={"ignore_eos": True})
            first = asyncio.create_task(client.completions.create(**long_req))
            await asyncio.sleep(0.2)
            second = asyncio.create_task(client.completions.create(**long_req))
            await asyncio.sleep(0.2)
            error = openai.InternalServerError if status == 503 else openai.RateLimitError
            with pytest.raises(error) as e:
                await client.completions.create(model="default", prompt="x", max_tokens=1)
            assert e.value.status_code == status and e.value.response.headers["retry-after"] == "1"
            with pytest.raises(anthropic.APIStatusError) as e:
                await claude.messages.create(model="default", max_tokens=1, messages=[{"role": "user", "content": "x"}])
            assert e.value.status_code == status
            assert e.value.body["error"]["type"] == ("overloaded_error" if status == 503 else "rate_limit_error")
            await asyncio.gather(first, second)
        asyncio.run(run())
        s.wait_idle()
    finally:
        s.stop()


def test_graceful_shutdown_finishes_requests_in_progress():
    s = Server()
    body = json.dumps({"model": "default", "prompt": "Once upon a time", "max_tokens": 40, "stream": True,
                       "ignore_eos": True}).encode()
    with socket.create_connection(("127.0.0.1", s.port), timeout=60) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while b"data: " not in got:
            got += conn.recv(65536)
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        while True:  # the listener closes at once
            try:
                socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
            except OSError:
                break
            assert time.time() < deadline, "still accepting connections after SIGTERM"
            time.sleep(0.05)
        while b"data: [DONE]" not in got:  # the request in progress completes
            chunk = conn.recv(65536)
            assert chunk, got
            got += chunk
    assert got.count(b'"finish_reason":"length"') == 1
    assert s.proc.wait(timeout=30) == 0, s.output()


# --- load --------------------------------------------------------------------------------------

def test_500_concurrent_streams(server):
    """500 streaming requests at once over loopback: all complete, and afterwards the engine holds
    no KV blocks. Prompts and outputs are a few tokens, so that the test measures the server (500
    open streams) rather than the CPU's prefill speed."""
    n = 500
    label = 'dinfer_requests_total{endpoint="/v1/completions",status="200"}'
    before = server.metrics().get(label, 0)

    async def one(client, i):
        stream = await client.completions.create(model="default", prompt=f"{i}:", max_tokens=2, temperature=0,
                                                 stream=True)
        finish = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return finish

    async def run():
        client = openai.AsyncOpenAI(api_key=KEY, base_url=server.url + "/v1", max_retries=0, timeout=600)
        return await asyncio.gather(*(one(client, i) for i in range(n)))

    start = time.time()
    finishes = asyncio.run(run())
    elapsed = time.time() - start
    assert all(f in ("stop", "length") for f in finishes), finishes
    m = server.wait_idle()
    assert m[label] == before + n
    print(f"{n} concurrent streams completed in {elapsed:.1f} s; KV usage back to {m['dinfer_kv_cache_usage_ratio']}")
