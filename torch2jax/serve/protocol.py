"""The OpenAI-compatible wire format: request bodies as pydantic models (what each field may be, checked before a request
queues), refusals as OpenAI words them ({"error": {"message", "type", "param", "code"}}, naming the field and what it
must be), and the response and stream chunk shapes of /v1/completions and /v1/chat/completions.

Fields are strict (a number is not a string, a bool is not a number), a field sent as null takes its default, and fields
this server does not read are accepted and ignored, as OpenAI's own server does with fields it does not know.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import Torch2JaxError
from .engine import Sampling
from .scheduler import Event

MAX_STOP = 4  # stop strings per request, as OpenAI allows
UNSUPPORTED = ("logprobs", "echo", "suffix", "tools", "functions", "response_format")  # refused unless off


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
    n: int | None = _rule("an integer")
    logprobs: Any = None
    echo: Any = None
    suffix: Any = None
    tools: Any = None
    functions: Any = None
    response_format: Any = None
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
    top_logprobs: int | None = _rule("an integer in [0, 20]", ge=0, le=20)

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None, info: Any) -> float | None:
        # a penalty the server would not apply changes the text the client expects: refused, not ignored
        if value not in (None, 0):
            raise ValueError(f"'{info.field_name}' is not supported by this server yet: send 0 or leave it out")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value not in (None, 0):
            raise ValueError("'top_logprobs' needs 'logprobs', which this server does not support")
        return value

    @field_validator("n", "best_of")
    @classmethod
    def _one(cls, value: int | None, info: Any) -> int | None:
        if value not in (None, 1):
            raise ValueError("only n=1 is supported: send one request per completion" if info.field_name == "n"
                             else "only best_of=1 is supported")
        return value

    @field_validator(*UNSUPPORTED)
    @classmethod
    def _off(cls, value: Any, info: Any) -> Any:
        if value not in (None, False, {"type": "text"}):
            raise ValueError(f"'{info.field_name}' is not supported by this server")
        return value

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

    def max_new_tokens(self, default: int) -> int:
        """max_tokens, else max_completion_tokens, else `default`."""
        return next((v for v in (self.max_tokens, self.max_completion_tokens) if v is not None), default)

    def sampling(self) -> Sampling:
        """The token choice: greedy at temperature 0; a request without a seed gets a random one."""
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        try:
            return Sampling(float(_or(self.temperature, 1.0)), int(_or(self.top_k, 0)), float(_or(self.top_p, 1.0)), seed)
        except Torch2JaxError as err:
            raise ApiError(400, str(err), "temperature") from None


class CompletionRequest(GenerationRequest):
    """/v1/completions: `prompt` is a string or token ids (or a batch of one of them)."""

    prompt: str | list[int] | None = Field(None, validate_default=True)

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
    """/v1/chat/completions: `messages`, each content a string or text parts (flattened to text here)."""

    messages: list[dict] | None = Field(None, validate_default=True)

    @field_validator("messages", mode="before")
    @classmethod
    def _text_messages(cls, value: Any) -> list[dict]:
        if not value or not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                                for m in value):
            raise ValueError("'messages' must be a non-empty list of objects with a 'role'")
        return [dict(m, content=flat_content(m.get("content"))) for m in value]


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


def flat_content(content: Any) -> str:
    """A message's content as text: a string, or OpenAI's list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    if content is None:
        return ""
    raise ValueError("a message's 'content' must be a string or a list of text parts (this model reads text only)")


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


# -- responses ---------------------------------------------------------------------------------------
def usage(event: Event) -> dict:
    return {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
            "total_tokens": event.prompt_tokens + event.completion_tokens}


@dataclass
class CompletionShape:
    """/v1/completions' response and chunks."""

    id: str
    created: int
    model: str

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def opening(self) -> list[dict]:
        return []

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        return {**self.head("text_completion"), "choices": [{"index": 0, "text": text, "logprobs": None,
                                                               "finish_reason": finish_reason}]}

    def whole(self, text: str, last: Event) -> dict:
        return {**self.chunk(text, last.finish_reason), "usage": usage(last)}


class ChatShape(CompletionShape):
    """/v1/chat/completions' response and chunks (the first chunk carries the role)."""

    def opening(self) -> list[dict]:
        return [{**self.head("chat.completion.chunk"), "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                                    "logprobs": None, "finish_reason": None}]}]

    def chunk(self, text: str, finish_reason: str | None) -> dict:
        delta = {"content": text} if text else {}
        return {**self.head("chat.completion.chunk"), "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                                    "finish_reason": finish_reason}]}

    def whole(self, text: str, last: Event) -> dict:
        return {**self.head("chat.completion"), "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                             "logprobs": None, "finish_reason": last.finish_reason}],
                "usage": usage(last)}
