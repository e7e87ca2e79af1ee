"""Tool calling (`tools`, `tool_choice`, `parallel_tool_calls`, tool messages) on /v1/chat/completions.

Rendering is checked against transformers' own `apply_chat_template` on the same template strings (a Hermes/Qwen-style
template and a Llama-3.1-JSON-style one, written here). The parsers are checked on texts. A random-weight model never
calls a tool by itself, so the served tests force calls (`tool_choice` named or "required"): whatever the model writes
under the grammar must come back as `tool_calls` whose arguments parse and validate against the function's schema, whole,
streamed, and through the `openai` client. The model and its byte-level BPE tokenizer are test_structured_output's; the
app runs in process (httpx over ASGI), one scheduler loop for the module."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
import pytest
import transformers
from tokenizers import Tokenizer, models

import torch2jax
from torch2jax.generate.text import ChatTemplate
from torch2jax.serve.api import build_service, create_app
from torch2jax.serve.protocol import ApiError, ChatCompletionRequest, validate
from torch2jax.serve.routes import Service, chat_text
from torch2jax.serve.tools import ToolCall, parse, parser

from .test_openai_features import chunks, post
from .test_structured_output import valid, write_model

CACHE, ROWS = 128, 4
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                            "metric": {"type": "boolean"}},
           "required": ["city", "days", "metric"], "additionalProperties": False}
LOOKUP = {"type": "object", "properties": {"word": {"type": "string", "minLength": 1, "maxLength": 6},
                                           "ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                                                   "minItems": 1, "maxItems": 2}},
          "required": ["word", "ids"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "lookup", "description": "Look a word up", "parameters": LOOKUP}}]
SCHEMAS = {"get_weather": WEATHER, "lookup": LOOKUP}
NAMES = list(SCHEMAS)
ASK = [{"role": "user", "content": "Weather in Paris?"}]

# served: short, so that prompts stay small for the tiny model's byte-level tokenizer; it names <tool_call>, so the
# parser "auto" picks is hermes
SERVED = ("{{ bos_token }}{% if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}{{ '\\n' }}{% endif %}"
          "{% for m in messages %}{{ m.role }}: {% if m.tool_calls is defined %}{% for c in m.tool_calls %}<tool_call>\n"
          "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}"
          "{% else %}{{ m.content }}{% endif %}{{ '\\n' }}{% endfor %}assistant:")
# Hermes / Qwen style: the tools' JSON in <tools>, calls as <tool_call> blocks, results in <tool_response>
HERMES = """{{- bos_token }}
{%- if tools %}
<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}
You may call functions. Their signatures:
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools>
For each call, reply with:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' and message.tool_calls is defined %}
<|im_start|>assistant
{% if message.content is defined and message.content %}{{ message.content }}
{% endif %}
{%- for call in message.tool_calls %}
{%- set fn = call.function if call.function is defined else call %}
<tool_call>
{"name": "{{ fn.name }}", "arguments": {{ fn.arguments | tojson }}}
</tool_call>
{% endfor %}
<|im_end|>
{% elif message.role == 'tool' %}
{%- if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user
{% endif %}
<tool_response>
{{ message.content }}
</tool_response>
{% if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>
{% endif %}
{%- else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
# Llama 3.1 JSON style: `tools is not none` (so `tools` must be passed as None without tools, as transformers does),
# calls as {"name", "parameters"} objects, results from the "ipython" role
LLAMA = """{{- bos_token }}
{%- if tools is not none %}
<|start_header_id|>system<|end_header_id|>

Answer with a JSON object {"name": function name, "parameters": its arguments} to call a function; several calls are
separated by ';'.
{% for t in tools %}
{{ t | tojson(indent=2) }}
{% endfor %}<|eot_id|>
{%- endif %}
{%- for m in messages %}
<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>

{% if m.tool_calls is defined %}
{%- for c in m.tool_calls %}{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}
{%- if not loop.last %}; {% endif %}{% endfor %}
{%- else %}{{ m.content }}{% endif %}<|eot_id|>
{%- endfor %}
{%- if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""
PLAIN = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The service over a tiny random-weight Llama with a byte-level BPE tokenizer and the SERVED template."""
    root = tmp_path_factory.mktemp("tools")
    write_model(root / "hf")
    (root / "served.jinja").write_text(SERVED)
    artifact = torch2jax.save(torch2jax.convert_hf(f"hf:{root / 'hf'}", max_cache_len=CACHE, max_batch=ROWS), root / "llm")
    service = build_service(artifact, warm_up="short", chunk=64, decode_block=4, chat_template=root / "served.jinja")
    service.scheduler.start()
    yield service
    service.scheduler.stop()


def ask(service, *bodies: dict) -> list[httpx.Response]:
    """Chat requests one after another: each prefills alone, so the module compiles few prefill shapes."""
    return [post(service, "/v1/chat/completions", body)[0] for body in bodies]


def valid_calls(calls: list[dict], names: list[str] = NAMES) -> list[tuple[str, dict]]:
    """Each call in OpenAI's form, with an id, naming one of `names`, its arguments JSON text that validates against
    that function's schema: (name, arguments)."""
    out = []
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] in names, call
        out.append((call["function"]["name"], valid(call["function"]["arguments"], SCHEMAS[call["function"]["name"]])))
    assert len({c["id"] for c in calls}) == len(calls)
    return out


def streamed_calls(answer: httpx.Response) -> tuple[str, list[dict], str]:
    """A streamed chat answer's (content, tool calls assembled from their deltas, finish reason)."""
    parts = [p["choices"][0] for p in chunks(answer) if p["choices"]]
    calls: dict[int, dict] = {}
    for part in parts:
        for delta in part["delta"].get("tool_calls", []):
            call = calls.setdefault(delta["index"], {"id": delta["id"], "type": delta["type"],
                                                     "function": {"name": delta["function"]["name"], "arguments": ""}})
            call["function"]["arguments"] += delta["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    reasons = [p["finish_reason"] for p in parts if p["finish_reason"]]
    assert len(reasons) == 1
    return "".join(p["delta"].get("content", "") for p in parts), [calls[i] for i in sorted(calls)], reasons[0]


# -- rendering: the same text transformers' apply_chat_template gives -------------------------------------------------
def hf_tokenizer() -> transformers.PreTrainedTokenizerFast:
    words = Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", eos_token="</s>")


def conversation(arguments_as_text: bool) -> list[dict]:
    """A system prompt, a question, the assistant's two calls (OpenAI sends arguments as JSON text and content null;
    transformers documents them as objects), the two results (one as text parts in OpenAI's form), an answer, a new
    question."""
    paris, oslo = {"city": "Paris", "days": 2, "metric": True}, {"city": "Oslo", "days": 1, "metric": False}

    def args(value: dict):
        return json.dumps(value) if arguments_as_text else value

    calls = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": args(paris)}},
             {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": args(oslo)}}]
    rain = [{"type": "text", "text": "rain, "}, {"type": "text", "text": "4 C"}] if arguments_as_text else "rain, 4 C"
    assistant = {"role": "assistant", "tool_calls": calls, **({"content": None} if arguments_as_text else {})}
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris and Oslo?"}, assistant,
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
            {"role": "tool", "tool_call_id": "call_2", "content": rain},
            {"role": "assistant", "content": "Sunny in Paris, rain in Oslo."}, {"role": "user", "content": "And Lima?"}]


@pytest.mark.parametrize("source", [HERMES, LLAMA], ids=["hermes", "llama3_json"])
def test_rendering_equals_transformers_apply_chat_template(source):
    """With tools, tool results and assistant tool calls; with tools and one question; without tools (`tools` passed as
    None, as transformers passes it: the Llama template's `tools is not none` tells). OpenAI's form on this side
    (arguments as JSON text, content null, text parts), transformers' documented form on the other."""
    reference, ours = hf_tokenizer(), Service("m", None, None, ChatTemplate(source, {"bos_token": "<s>", "eos_token": "</s>"}),
                                              None)
    cases = [(conversation(True), conversation(False), TOOLS), (ASK, ASK, TOOLS), (conversation(True), conversation(False), None)]
    rendered = []
    for openai_messages, hf_messages, tools in cases:
        body = validate({"messages": openai_messages, **({"tools": tools} if tools else {})}, ChatCompletionRequest)
        want = reference.apply_chat_template(hf_messages, tools=tools, chat_template=source, tokenize=False,
                                             add_generation_prompt=True)
        assert chat_text(body, ours) == want
        rendered.append(want)
    assert '"get_weather"' in rendered[1] and "get_weather" not in rendered[2].split("Paris and Oslo?")[0]
    assert "Oslo" in rendered[0] and "rain, 4 C" in rendered[0]


def test_a_template_that_does_not_render_tools_is_refused_naming_tools(service):
    plain = replace(service, chat_template=ChatTemplate(PLAIN, {"bos_token": "<s>"}))
    answer = post(plain, "/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "max_tokens": 4})[0]
    error = answer.json()["error"]
    assert (answer.status_code, error["param"]) == (400, "tools")
    assert "does not render tools" in error["message"] and "--chat-template" in error["message"]
    fine = post(plain, "/v1/chat/completions", {"messages": ASK, "max_tokens": 2, "temperature": 0})[0]
    assert fine.status_code == 200


# -- parsing ------------------------------------------------------------------------------------------------------
def call_pairs(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_hermes_parser():
    block = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
    assert parse("hermes", block, NAMES)[0] is None
    assert call_pairs(parse("hermes", block, NAMES)[1]) == [("get_weather", {"city": "Oslo", "days": 2})]
    several = (f'Let me check.\n{block}\n<tool_call>\n{{"name": "lookup", "arguments": "{{\\"word\\": \\"x\\"}}"}}'
               '\n</tool_call>\n')
    content, calls = parse("hermes", several, NAMES)
    assert content == "Let me check." and call_pairs(calls) == [("get_weather", {"city": "Oslo", "days": 2}),
                                                                ("lookup", {"word": "x"})]
    malformed = '<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>'
    unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    not_object = '<tool_call>\n{"name": "lookup", "arguments": [1]}\n</tool_call>'
    for text in (malformed, unknown, not_object, "plain <tool_ text", f"{block[:30]}", "  spaced  "):
        assert parse("hermes", text, NAMES) == (text, [])  # stays content, as written
    content, calls = parse("hermes", f"{unknown}\n{block}", NAMES)
    assert content == unknown and [c.name for c in calls] == ["get_weather"]


def test_llama3_json_parser():
    one = '{"name": "get_weather", "parameters": {"city": "Lima", "days": 1}}'
    two = '{"name": "lookup", "arguments": {"word": "a;b"}}'
    assert parse("llama3_json", one, NAMES)[0] is None
    assert call_pairs(parse("llama3_json", f" <|python_tag|>{one}; {two}\n", NAMES)[1]) == \
        [("get_weather", {"city": "Lima", "days": 1}), ("lookup", {"word": "a;b"})]
    for text in ('{"name": "get_weather", "parameters": {"city"', '{"name": "rm_rf", "parameters": {}}', f"{one} and more",
                 f"{one}; {{\"name\": \"nope\", \"parameters\": {{}}}}", "Sunny; 21 C", '{"city": "Lima"}'):
        assert parse("llama3_json", text, NAMES) == (text, [])  # all of it content, as written


@pytest.mark.parametrize("kind, text", [
    ("hermes", 'Sure.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "ab"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>\ndone  '),
    ("hermes", "no calls here <tool_c, just text\n"),
    ("llama3_json", '{"name": "lookup", "arguments": {"word": "ab"}};{"name": "get_weather", "parameters": {}}'),
    ("llama3_json", "text, then {\"name\": \"lookup\"}"),
])
def test_parsers_read_a_reply_fed_in_pieces_as_they_read_it_whole(kind, text):
    """Fed one character at a time (as a stream arrives), a parser gives the content and calls it gives whole, and no
    content before it is certain not to be part of a call."""
    whole_content, whole_calls = parse(kind, text, NAMES)
    reader, pieces = parser(kind, NAMES), []
    for character in text:
        pieces += reader.feed(character)
    pieces += reader.finish()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    assert "".join(p for p in pieces if isinstance(p, str)) == (whole_content or "")
    assert call_pairs(calls) == call_pairs(whole_calls)
    if kind == "hermes" and calls:
        assert all("<tool_call>" not in p for p in pieces if isinstance(p, str) and "nope" not in p)


# -- served: forced calls ---------------------------------------------------------------------------------------
def test_named_tool_choice_whole_streamed_and_sampled(service):
    """A named function: one call of it, its arguments valid JSON for its schema, content null, finish_reason
    "tool_calls"; greedy streamed equals greedy whole (but for the call ids); a sampled reply is a call too."""
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "temperature": 0}
    whole, stream, hot, looked = ask(service, body, dict(body, stream=True), dict(body, temperature=1.3, seed=5),
                                      dict(body, tool_choice={"type": "function", "function": {"name": "lookup"}}))
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [(name, arguments)] = valid_calls(choice["message"]["tool_calls"], ["get_weather"])
    content, calls, finish = streamed_calls(stream)
    assert (content, finish) == ("", "tool_calls")
    assert valid_calls(calls, ["get_weather"]) == [(name, arguments)]
    sampled = hot.json()["choices"]
    for c in sampled:
        assert c["finish_reason"] == "tool_calls" and len(valid_calls(c["message"]["tool_calls"], ["get_weather"])) == 1
    assert valid_calls(looked.json()["choices"][0]["message"]["tool_calls"], ["lookup"])[0][0] == "lookup"


def test_required_calls_any_offered_function(service):
    """"required" with parallel_tool_calls false: exactly one call of one of the tools; with parallel calls allowed
    (the default), every call valid."""
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0}
    single, parallel = ask(service, body, dict(body, parallel_tool_calls=None, temperature=1.0, seed=3))
    choice = single.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and len(valid_calls(choice["message"]["tool_calls"])) == 1
    several = parallel.json()["choices"][0]
    if several["finish_reason"] == "tool_calls":
        assert len(valid_calls(several["message"]["tool_calls"])) >= 1
    else:  # cut by max_tokens inside a later call: the calls before it are read
        assert several["finish_reason"] == "length"
        valid_calls(several["message"].get("tool_calls") or [])


def test_llama3_json_format(service):
    """With --tool-parser llama3_json the forced reply is the {"name", "parameters"} object, read back as the call."""
    service.tool_parser = "llama3_json"
    try:
        body = {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "lookup"}},
                "temperature": 0}
        whole, stream, raw = ask(service, body, dict(body, stream=True), dict(body, tool_choice="none", max_tokens=5))
    finally:
        service.tool_parser = "auto"
    choice = whole.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [(name, arguments)] = valid_calls(choice["message"]["tool_calls"], ["lookup"])
    content, calls, finish = streamed_calls(stream)
    assert (content, finish) == ("", "tool_calls") and valid_calls(calls) == [(name, arguments)]
    assert raw.json()["choices"][0]["message"].get("tool_calls") is None


def test_auto_and_none_leave_plain_text_as_content(service):
    """The random model writes no call by itself: with "auto" its text is the content unchanged (the same as with
    "none", which renders the same prompt and reads no calls), finish_reason its own; streamed the same."""
    body = {"messages": ASK, "tools": TOOLS, "temperature": 0, "max_tokens": 12}
    auto, none, stream = ask(service, body, dict(body, tool_choice="none"), dict(body, stream=True))
    a, n = auto.json()["choices"][0], none.json()["choices"][0]
    assert a["message"] == n["message"] and "tool_calls" not in a["message"] and a["message"]["content"]
    assert a["finish_reason"] == n["finish_reason"] != "tool_calls"
    assert streamed_calls(stream) == (a["message"]["content"], [], a["finish_reason"])


def test_tool_results_in_the_conversation_are_served(service):
    """A conversation with the assistant's call (arguments as JSON text, content null) and the tool's result renders
    the call as the template writes it, and is answered (the random model writes text: no calls)."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_9", "type": "function", "function": {"name": "lookup", "arguments": '{"word": "a"}'}}]},
                {"role": "tool", "tool_call_id": "call_9", "content": "ok"}]
    body = validate({"messages": messages, "tools": TOOLS}, ChatCompletionRequest)
    assert chat_text(body, service).endswith('assistant: <tool_call>\n{"name": "lookup", "arguments": {"word": "a"}}\n'
                                             '</tool_call>\ntool: ok\nassistant:')
    [answer] = ask(service, {"messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": 4})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 4 and answer.json()["choices"][0]["finish_reason"] == "length"


def test_the_openai_client_reads_tool_calls_whole_and_streamed(service):
    from openai import AsyncOpenAI

    async def run():
        app = create_app(service)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://served/v1", timeout=120) as h:
            client = AsyncOpenAI(base_url="http://served/v1", api_key="unused", http_client=h, max_retries=0)
            kwargs = dict(model="llm", messages=ASK, tools=TOOLS, temperature=0,
                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
            whole = await client.chat.completions.create(**kwargs)
            deltas = [c async for c in await client.chat.completions.create(**kwargs, stream=True)]
            return whole, deltas

    whole, deltas = asyncio.run(run())
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    valid(call.function.arguments, WEATHER)
    streamed = [t for d in deltas if d.choices for t in d.choices[0].delta.tool_calls or []]
    assert [(t.index, t.function.name, t.function.arguments) for t in streamed] == \
        [(0, "get_weather", call.function.arguments)]
    assert [d.choices[0].finish_reason for d in deltas if d.choices and d.choices[0].finish_reason] == ["tool_calls"]


# -- refusals ------------------------------------------------------------------------------------------------------
def test_bad_tool_fields_are_refused_naming_them(service):
    named = {"type": "function", "function": {"name": "nowhere"}}
    cases = [
        ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "tool_choice": named}, "tool_choice",
         "'tool_choice' names the function 'nowhere', which is not in 'tools'"),
        ("/v1/chat/completions", {"messages": ASK, "tool_choice": "auto"}, "tool_choice",
         "only allowed when 'tools' are given"),
        ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "tool_choice": "always"}, "tool_choice",
         "'tool_choice' must be \"none\", \"auto\", \"required\""),
        ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "retrieval"}]}, "tools",
         "'tools[0].type' must be 'function'"),
        ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "function", "function": {"name": "a b"}}]},
         "tools", "'tools[0].function' must be an object whose 'name'"),
        ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS + TOOLS[:1]}, "tools", "names the function 'get_weather' twice"),
        ("/v1/chat/completions", {"messages": ASK, "tools": []}, "tools", "'tools' must be a non-empty list"),
        ("/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls",
         "true or false"),
        ("/v1/chat/completions", {"messages": ASK, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "nonsense"}}}], "tool_choice": "required"}, "tools", "cannot be used"),
        ("/v1/chat/completions", {"messages": ASK, "functions": [{"name": "f"}]}, "functions", "not supported"),
        ("/v1/completions", {"prompt": "x", "tools": TOOLS}, "tools", "a /v1/chat/completions field"),
    ]
    answers = [post(service, path, body)[0] for path, body, _, _ in cases]
    for (_, body, param, message), answer in zip(cases, answers):
        error = answer.json()["error"]
        assert (answer.status_code, error["param"]) == (400, param) and message in error["message"], (body, error)
    with pytest.raises(ApiError, match="'tools' cannot be used"):
        chat_text(validate({"messages": ASK, "tools": TOOLS}, ChatCompletionRequest),
                  replace(service, chat_template=ChatTemplate(PLAIN, {})))
