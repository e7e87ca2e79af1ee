"""The OpenAI-compatible wire format: request bodies as pydantic models (what each field may be, checked before a request
queues), refusals as OpenAI words them ({"error": {"message", "type", "param", "code"}}, naming the field and what it
must be), and the response and stream chunk shapes of /v1/completions and /v1/chat/completions.

Fields are strict (a number is not a string, a bool is not a number), a field sent as null takes its default, and fields
this server does not read are accepted and ignored, as OpenAI's own server does with fields it does not know.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from ..errors import Torch2JaxError
from .engine import TOP_LOGPROBS, Sampling
from .scheduler import Event, TokenLogprob
from .tools import NAME as FUNCTION_NAME

MAX_STOP = 4  # stop strings per request, as OpenAI allows
MAX_LEGACY_LOGPROBS = 5  # /v1/completions' `logprobs`: at most 5 most likely tokens, as OpenAI allows
UNSUPPORTED = ("suffix", "functions")  # refused unless off (`functions`: OpenAI's old form of `tools`)
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
LOGPROB_FLOOR = -9999.0  # what OpenAI reports for a token of probability 0 (JSON has no -inf)


class ApiError(Exception):
    """A request the API refuses, as OpenAI words it."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _rule(rule: str, **constraints: Any) -> Any:
    """An optional field, with what it must be in words (the refusal's 'must be ...')."""
    return Field(None, json_schema_extra={"rule": rule}, **constraints)


class GenerationRequest(BaseModel):
    """What both endpoints read: the model, the limits, stop strings, streaming and sampling (temperature 0 is greedy;
    top_k, ignore_eos are extensions, as vLLM has them)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = _rule("a string")
    n: int | None = _rule("an integer >= 1", ge=1)
    suffix: Any = None
    functions: Any = None
    response_format: Any = None  # structured output: {"type": "json_object"} or {"type": "json_schema", "json_schema": ...}
    best_of: int | None = _rule("an integer")
    stop: str | list[str] | None = _rule(f"a string or a list of at most {MAX_STOP} strings")
    stream: bool | None = _rule("true or false")
    stream_options: dict | None = _rule('an object such as {"include_usage": true}')
    max_tokens: int | None = _rule("an integer >= 1", ge=1)
    max_completion_tokens: int | None = _rule("an integer >= 1", ge=1)
    temperature: float | None = _rule("a number in [0, 2]", ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = _rule("a number in (0, 1]", gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = _rule("an integer >= 0 (0 turns top-k off)", ge=0)
    seed: int | None = _rule("an integer")
    ignore_eos: bool | None = _rule("true or false")  # run to max_tokens
    presence_penalty: float | None = _rule("a number in [-2, 2]", ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float | None = _rule("a number in [-2, 2]", ge=-2, le=2, allow_inf_nan=False)

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value not in (None, 1, info.data.get("n") or 1):  # best_of = n: every choice is returned, as with n alone
            raise ValueError("'best_of' must be 1 or 'n' (choosing the best of more choices than are returned is not "
                             "supported)")
        return value

    @field_validator(*UNSUPPORTED)
    @classmethod
    def _off(cls, value: Any, info: Any) -> Any:
        if value not in (None, False, {"type": "text"}):
            raise ValueError(f"'{info.field_name}' is not supported by this server")
        return value

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: Any) -> Any:
        """OpenAI's shapes: {"type": "text"} (no constraint), {"type": "json_object"}, or {"type": "json_schema",
        "json_schema": {"name", "schema", "strict", "description"}}; the schema itself is checked when it is compiled."""
        if value is None:
            return None
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in RESPONSE_FORMATS:
            raise ValueError("'response_format' must be an object whose 'type' is 'text', 'json_object' or 'json_schema', "
                             f"got {json.dumps(value, default=str)[:80]}")
        if kind == "json_schema":
            spec = value.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not isinstance(spec.get("schema"), dict):
                raise ValueError("'response_format' of type 'json_schema' needs 'json_schema': {\"name\": a string, "
                                 "\"schema\": a JSON schema object, \"strict\": true or false (optional)}")
            if spec.get("strict") not in (None, True, False):
                raise ValueError("'response_format': 'json_schema.strict' must be true or false")
        return value

    @property
    def structured(self) -> dict | None:
        """The response_format that constrains the reply (json_object or json_schema), None for plain text."""
        return None if self.response_format is None or self.response_format["type"] == "text" else self.response_format

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP:
            raise ValueError(f"'stop' must be a string or a list of at most {MAX_STOP} strings")
        return value

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage", False))

    @property
    def choices(self) -> int:
        return _or(self.n, 1)

    @property
    def top_logprobs_wanted(self) -> int | None:
        """How many most likely tokens each generated token reports beside its own log-probability (None: no
        log-probabilities at all)."""
        return None

    def max_new_tokens(self, default: int) -> int:
        """max_tokens, else max_completion_tokens, else `default`."""
        return next((v for v in (self.max_tokens, self.max_completion_tokens) if v is not None), default)

    def sampling(self, choice: int = 0) -> Sampling:
        """The token choice of choice `choice` (0 to n - 1): greedy at temperature 0; with a seed, choice i draws with
        seed + i (so choice 0 is what n=1 gives), without one each choice gets a random seed."""
        seed = self.seed + choice if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        try:
            return Sampling(float(_or(self.temperature, 1.0)), int(_or(self.top_k, 0)), float(_or(self.top_p, 1.0)), seed,
                            self.top_logprobs_wanted, float(_or(self.presence_penalty, 0.0)),
                            float(_or(self.frequency_penalty, 0.0)))
        except Torch2JaxError as err:
            raise ApiError(400, str(err), "temperature") from None


class CompletionRequest(GenerationRequest):
    """/v1/completions: `prompt` is a string or token ids (or a batch of one of them); `echo` puts the prompt's text
    before each choice's; `logprobs: N` reports each token's log-probability and the N most likely (OpenAI's legacy
    form)."""

    prompt: str | list[int] | None = Field(None, validate_default=True)
    echo: bool | None = _rule("true or false")
    logprobs: int | None = _rule(f"an integer in [0, {MAX_LEGACY_LOGPROBS}]", ge=0, le=MAX_LEGACY_LOGPROBS)
    top_logprobs: int | None = _rule("an integer")

    tools: Any = None  # a /v1/chat/completions field: refused here
    tool_choice: Any = None

    @field_validator("tools", "tool_choice")
    @classmethod
    def _chat_only(cls, value: Any, info: Any) -> Any:
        if value is not None:
            raise ValueError(f"'{info.field_name}' is a /v1/chat/completions field (/v1/completions does not call tools)")
        return value

    @field_validator("logprobs")
    @classmethod
    def _not_with_echo(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("echo"):
            raise ValueError("'echo' together with 'logprobs' needs the prompt's log-probabilities, which this server "
                             "does not compute: send 'echo' or 'logprobs', not both")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _legacy(cls, value: int | None) -> int | None:
        if value not in (None, 0):
            raise ValueError("'top_logprobs' is a /v1/chat/completions field: /v1/completions takes 'logprobs': N (the N "
                             f"most likely tokens, 0 to {MAX_LEGACY_LOGPROBS})")
        return value

    @property
    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("'prompt' is required")
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
            value = value[0]  # a batch of one
        if isinstance(value, str) or (isinstance(value, list) and value and
                                      all(isinstance(t, int) and not isinstance(t, bool) for t in value)):
            return value
        raise ValueError("'prompt' must be a string, a list of token ids, or a list of one of them (batches of several "
                         "prompts: send one request each)")


class ChatCompletionRequest(GenerationRequest):
    """/v1/chat/completions: `messages`, each content a string or text parts (flattened to text here), or text and image
    parts (vision-language artifacts); `logprobs: true` reports each token's log-probability and the `top_logprobs`
    most likely."""

    messages: list[dict] | None = Field(None, validate_default=True)
    echo: Any = None  # a /v1/completions field: refused here unless off
    logprobs: bool | None = _rule("true or false")
    top_logprobs: int | None = _rule(f"an integer in [0, {TOP_LOGPROBS}]", ge=0, le=TOP_LOGPROBS)

    tools: list[dict] | None = _rule('a non-empty list of {"type": "function", "function": {"name", "description", '
                                     '"parameters"}} objects', min_length=1)
    tool_choice: str | dict | None = _rule('"none", "auto", "required" or {"type": "function", "function": {"name": ...}}')
    parallel_tool_calls: bool | None = _rule("true or false")

    @field_validator("tools")
    @classmethod
    def _functions(cls, value: list[dict] | None) -> list[dict] | None:
        """OpenAI's tools: functions only, each with a name OpenAI allows (unique), a string description and an object
        of parameters (a JSON schema, checked when a forced call compiles it)."""
        if value is None:
            return None
        seen = set()
        for i, tool in enumerate(value):
            if tool.get("type") != "function":
                raise ValueError(f"'tools[{i}].type' must be 'function' (this server calls functions only), got "
                                 f"{json.dumps(tool.get('type'), default=str)[:40]}")
            function = tool.get("function")
            if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                    not FUNCTION_NAME.match(function["name"]):
                raise ValueError(f"'tools[{i}].function' must be an object whose 'name' is 1 to 64 letters, digits, '_' "
                                 "or '-'")
            if function.get("description") is not None and not isinstance(function["description"], str):
                raise ValueError(f"'tools[{i}].function.description' must be a string")
            if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
                raise ValueError(f"'tools[{i}].function.parameters' must be a JSON schema object")
            if function["name"] in seen:
                raise ValueError(f"'tools' names the function '{function['name']}' twice")
            seen.add(function["name"])
        return value

    @field_validator("tool_choice")
    @classmethod
    def _known_choice(cls, value: str | dict | None, info: ValidationInfo) -> str | dict | None:
        if value is None:
            return None
        offered = [t["function"]["name"] for t in info.data.get("tools") or []]
        if not offered:
            raise ValueError("'tool_choice' is only allowed when 'tools' are given")
        if isinstance(value, str):
            if value not in TOOL_CHOICES:
                raise ValueError(f"'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                                 f"\"function\": {{\"name\": ...}}}}, got {json.dumps(value)[:40]}")
            return value
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if value.get("type") != "function" or not isinstance(name, str):
            raise ValueError("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                             "\"function\": {\"name\": ...}}")
        if name not in offered:
            raise ValueError(f"'tool_choice' names the function '{name}', which is not in 'tools' (they are "
                             f"{', '.join(repr(n) for n in offered)})")
        return value

    @property
    def tool_mode(self) -> str:
        """"off" (no tools), "none", "auto" (OpenAI's default with tools), "required" or "named"."""
        if not self.tools:
            return "off"
        return self.tool_choice if isinstance(self.tool_choice, str) else "named" if self.tool_choice else "auto"

    @property
    def forced_functions(self) -> list[dict] | None:
        """The functions a forced reply calls one of (the named one, or any offered with "required"); None when the
        reply is not forced to be a call."""
        if self.tool_mode == "named":
            return [t["function"] for t in self.tools if t["function"]["name"] == self.tool_choice["function"]["name"]]
        return [t["function"] for t in self.tools] if self.tool_mode == "required" else None

    @property
    def reads_tool_calls(self) -> bool:
        """Whether the reply is read for calls: tools offered and allowed, and no response_format shaping the reply
        instead ("auto" with a response_format: the reply is that format's JSON, as content)."""
        mode = self.tool_mode
        return mode in ("required", "named") or (mode == "auto" and self.structured is None)

    @property
    def function_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools or []]

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: Any) -> Any:
        if value not in (None, False):
            raise ValueError("'echo' is a /v1/completions field (/v1/chat/completions does not echo the messages)")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value not in (None, 0) and not info.data.get("logprobs"):
            raise ValueError("'top_logprobs' needs 'logprobs': true")
        return value

    @property
    def top_logprobs_wanted(self) -> int | None:
        return _or(self.top_logprobs, 0) if self.logprobs else None

    @field_validator("messages", mode="before")
    @classmethod
    def _text_messages(cls, value: Any) -> list[dict]:
        """Each message as transformers' apply_chat_template hands it to a template: keys sent as null dropped (an
        assistant message with `tool_calls` and `content: null` has no content), text parts joined."""
        if not value or not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                                for m in value):
            raise ValueError("'messages' must be a non-empty list of objects with a 'role'")
        out = []
        for m in value:
            m = {key: item for key, item in m.items() if item is not None}
            if "content" in m:
                m["content"] = flat_content(m["content"])
            if "tool_calls" in m and not (isinstance(m["tool_calls"], list) and all(
                    isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
                    for c in m["tool_calls"])):
                raise ValueError("a message's 'tool_calls' must be a list of {\"id\", \"type\": \"function\", "
                                 "\"function\": {\"name\", \"arguments\"}} objects")
            out.append(m)
        return out


def json_object(body: bytes) -> dict:
    """A request body's JSON object, or the ApiError (400) saying why it is not one."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


def validate(data: dict, kind: type[GenerationRequest]) -> GenerationRequest:
    """The request of `kind` a body's JSON object makes, or the ApiError (400) naming the first field that is wrong."""
    try:
        return kind.model_validate(data)
    except ValidationError as err:
        raise refusal(err, data, kind) from None


def refusal(err: ValidationError, data: dict, kind: type[GenerationRequest]) -> ApiError:
    """A pydantic error as OpenAI's 400: the field, and what it must be (its rule, or the validator's words)."""
    first = err.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else None
    if first["type"] == "value_error":
        return ApiError(400, str(first["ctx"]["error"]), name)
    field = kind.model_fields.get(name) if name else None
    rule = (field.json_schema_extra or {}).get("rule") if field is not None else None
    if rule is None:
        return ApiError(400, f"'{name}': {first['msg']}", name)
    return ApiError(400, f"'{name}' must be {rule}, got {json.dumps(data.get(name), default=str)[:80]}", name)


def flat_content(content: Any) -> str | list[dict]:
    """A message's content as text: a string, or OpenAI's list of {"type": "text", "text": ...} parts joined; with
    {"type": "image_url", "image_url": {"url": ...}} parts among them, the parts in order as {"type": "text", "text"}
    and {"type": "image", "url"} (a vision-language model's template writes an image placeholder for each)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list) or not all(isinstance(p, dict) and p.get("type") in ("text", "image_url")
                                                for p in content):
        raise ValueError("a message's 'content' must be a string or a list of text and image_url parts")
    if all(p["type"] == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    parts = []
    for p in content:
        if p["type"] == "text":
            parts.append({"type": "text", "text": str(p.get("text", ""))})
            continue
        image = p.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            raise ValueError('an image_url part must be {"type": "image_url", "image_url": {"url": "data:image/png;'
                             'base64,..."}}')
        parts.append({"type": "image", "url": url})
    return parts


def image_urls(messages: list[dict]) -> list[str]:
    """The URLs of the messages' image parts, in order (flat_content's {"type": "image"} parts)."""
    return [p["url"] for m in messages if isinstance(m.get("content"), list) for p in m["content"] if p["type"] == "image"]


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


# -- responses ---------------------------------------------------------------------------------------
def usage(events: list[Event]) -> dict:
    """The usage of a request's choices, from each one's last event: the prompt counted once, every choice's tokens, and
    OpenAI's `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix cache served (the fewest over the
    choices, each of which ran the prompt in a row of its own)."""
    prompt, completion = events[0].prompt_tokens, sum(e.completion_tokens for e in events)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": min(e.cached_tokens for e in events)}}


@dataclass
class Entry:
    """One generated token's log-probability as a response writes it: the token's text, its log-probability, the most
    likely tokens' (text, log-probability), and where the token's text starts in the choice's text."""

    token: str
    logprob: float
    top: list[tuple[str, float]]
    offset: int


class TokenTexts:
    """The texts of one choice's tokens for its log-probabilities: a token reads as what it adds to the text of the (up
    to CONTEXT) tokens generated before it, so a choice's tokens read as its text does (a leading space included where
    the tokenizer puts one), and the most likely tokens at its place read the same way. Special tokens keep their
    names ("</s>"); a byte of a character split across tokens reads as the replacement character until the last one."""

    CONTEXT = 4

    def __init__(self, tokenizer: Any):
        self.tokenizer, self.context = tokenizer, []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False) if ids else ""

    def _text(self, token: int, before: str) -> str:
        after = self._decode([*self.context, token])
        return after[len(os.path.commonprefix([before, after])):]

    def entries(self, found: list[TokenLogprob]) -> list[Entry]:
        out = []
        for item in found:
            before = self._decode(self.context)
            out.append(Entry(self._text(item.token, before), max(item.logprob, LOGPROB_FLOOR),
                             [(self._text(t, before), max(v, LOGPROB_FLOOR)) for t, v in item.top], item.offset))
            self.context = [*self.context, item.token][-self.CONTEXT:]
        return out


@dataclass
class Choice:
    """One choice of a whole (not streamed) reply, as its events arrive."""

    index: int
    texts: TokenTexts
    text: list[str]
    entries: list[Entry]
    last: Event | None = None
    calls: list[dict] = field(default_factory=list)  # the tool calls read from the reply (OpenAI's form); text: the rest


@dataclass
class CompletionShape:
    """/v1/completions' response and chunks; `top`: the most likely tokens each token reports (None: no logprobs)."""

    id: str
    created: int
    model: str
    top: int | None = None

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def opening(self, index: int, echo: str = "") -> list[dict]:
        """The chunks a streamed choice starts with: the echoed prompt."""
        return [self.chunk(index, echo, None, [])] if echo else []

    def logprobs(self, entries: list[Entry]) -> dict | None:
        """OpenAI's legacy form: tokens, token_logprobs, top_logprobs (the most likely tokens and the chosen one, text to
        log-probability), text_offset."""
        if self.top is None:
            return None
        tops = []
        for e in entries:
            top: dict[str, float] = {}
            for text, value in e.top:
                top.setdefault(text, value)
            top.setdefault(e.token, e.logprob)
            tops.append(top)
        return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries], "top_logprobs": tops,
                "text_offset": [e.offset for e in entries]}

    def chunk(self, index: int, text: str, finish_reason: str | None, entries: list[Entry]) -> dict:
        return {**self.head("text_completion"), "choices": [{"index": index, "text": text, "logprobs": self.logprobs(entries),
                                                               "finish_reason": finish_reason}]}

    def whole(self, choices: list[Choice]) -> dict:
        return {**self.head("text_completion"),
                "choices": [{"index": c.index, "text": "".join(c.text), "logprobs": self.logprobs(c.entries),
                             "finish_reason": c.last.finish_reason} for c in choices],
                "usage": usage([c.last for c in choices])}


class ChatShape(CompletionShape):
    """/v1/chat/completions' response and chunks (each choice's first chunk carries the role)."""

    def opening(self, index: int, echo: str = "") -> list[dict]:
        return [{**self.head("chat.completion.chunk"), "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                                    "logprobs": None, "finish_reason": None}]}]

    def logprobs(self, entries: list[Entry]) -> dict | None:
        """OpenAI's chat form: per token, its text, log-probability, UTF-8 bytes and the `top_logprobs` most likely."""
        if self.top is None:
            return None

        def one(text: str, value: float) -> dict:
            return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

        return {"content": [dict(one(e.token, e.logprob), top_logprobs=[one(t, v) for t, v in e.top]) for e in entries],
                "refusal": None}

    def chunk(self, index: int, text: str, finish_reason: str | None, entries: list[Entry],
              calls: list[dict] | None = None) -> dict:
        """A delta of content, and of whole tool calls (each with its `index` among the choice's calls)."""
        delta: dict[str, Any] = {"content": text} if text else {}
        if calls:
            delta["tool_calls"] = calls
        return {**self.head("chat.completion.chunk"), "choices": [{"index": index, "delta": delta,
                                                                    "logprobs": self.logprobs(entries),
                                                                    "finish_reason": finish_reason}]}

    def whole(self, choices: list[Choice]) -> dict:
        return {**self.head("chat.completion"),
                "choices": [{"index": c.index, "message": message(c), "logprobs": self.logprobs(c.entries),
                             "finish_reason": finish_reason(c.last.finish_reason, bool(c.calls))} for c in choices],
                "usage": usage([c.last for c in choices])}


def message(choice: Choice) -> dict:
    """A whole chat choice's message: its text as content; with tool calls, the text outside them (null when none)."""
    text = "".join(choice.text)
    if not choice.calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": choice.calls}


def finish_reason(reason: str, called: bool) -> str:
    """"tool_calls" for a reply that ended by itself having called tools (one cut at max_tokens stays "length")."""
    return "tool_calls" if called and reason == "stop" else reason
