"""Tool calling (OpenAI's `tools` / `tool_choice` on /v1/chat/completions): the model writes its calls as text in its
chat template's own format, and this module reads them back out of the reply, and writes the grammar that makes a
reply a call when the request forces one.

Two formats, as the common open models write them:

    hermes        <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>, one block per call, text around them
                  (Hermes, Qwen 2.5 / 3 and most templates that mention `<tool_call>`)
    llama3_json   the whole reply is {"name": "f", "parameters": {...}} (or "arguments"), several separated by ';'
                  (Llama 3.1 / 3.2's JSON tool calling)

A parser reads a reply incrementally (`feed` text as it arrives, then `finish`), giving content text and whole calls
in order, so a streamed reply and a whole one are read by the same code. A call that is not JSON, lacks a name or an
object of arguments, or names a function the request did not offer stays in the content as the model wrote it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

PARSERS = ("hermes", "llama3_json")
CHOICES = ("auto", *PARSERS)  # `torch2jax serve --tool-parser`
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1's call prefix, when the tokenizer keeps it as text
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI allows as a function's name
# JSON written as json.dumps writes it (serve/structured.py's reasons), inside a tool call too
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    """One call read from a reply: the function's name and its arguments as JSON text (OpenAI's form)."""

    name: str
    arguments: str
    id: str = field(default_factory=call_id)

    def openai(self, index: int | None = None) -> dict:
        """The call as a message's `tool_calls` item, or as a streamed delta's (with its `index` among the reply's
        calls)."""
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


Piece = str | ToolCall  # what a parser gives: content text, or a whole call


def detect(template_source: str | None) -> str:
    """The format a chat template writes calls in: hermes when it mentions `<tool_call>`, llama3_json otherwise."""
    return "hermes" if template_source is not None and HERMES_OPEN in template_source else "llama3_json"


def resolve(choice: str, template_source: str | None) -> str:
    """The parser `--tool-parser` names ("auto": detected from the chat template)."""
    if choice == "auto":
        return detect(template_source)
    if choice not in PARSERS:
        raise ValueError(f"unknown tool parser {choice!r} (one of {', '.join(CHOICES)})")
    return choice


def template_messages(messages: list[dict]) -> list[dict]:
    """The messages as transformers' chat templates expect them: an assistant message's tool call arguments as an
    object (OpenAI sends them as JSON text; templates write `arguments | tojson`), as transformers documents them and
    vLLM passes them. Arguments that are not a JSON object stay text."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, list):
            message = dict(message, tool_calls=[_object_arguments(c) for c in calls])
        out.append(message)
    return out


def _object_arguments(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return dict(call, function=dict(function, arguments=arguments)) if isinstance(arguments, dict) else call


def _arguments(value: Any) -> str | None:
    """A call's arguments as JSON text, or None when they are not an object (an object given as JSON text counts)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def read_call(value: Any, names: Collection[str]) -> ToolCall | None:
    """A decoded JSON call {"name", "arguments" | "parameters"} as a ToolCall, or None when it is not one of `names`'
    functions with an object of arguments."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = _arguments(value.get("arguments", value.get("parameters")))
    return None if arguments is None else ToolCall(value["name"], arguments)


class ToolParser:
    """Reads one reply as it arrives: `feed(text)` and `finish()` give content text and calls, in order.

    Whitespace is held back at the end of the content until more content follows, so that the blank lines a format
    puts around its calls do not become content: with calls, the content is the text outside them without the
    whitespace before the first call and after the last; without any call, it is the reply as written."""

    def __init__(self, names: Collection[str]):
        self.names = set(names)
        self.calls = 0
        self._held = ""  # whitespace at the end of the content given so far
        self._content = False  # whether any content was given

    def feed(self, text: str) -> list[Piece]:
        raise NotImplementedError

    def finish(self) -> list[Piece]:
        raise NotImplementedError

    def _text(self, text: str, out: list[Piece]) -> None:
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body):]
        if body:
            out.append(body)
            self._content = True

    def _call(self, call: ToolCall, out: list[Piece]) -> None:
        if not self._content:
            self._held = ""  # whitespace before the first call
        out.append(call)
        self.calls += 1

    def _end(self, out: list[Piece]) -> list[Piece]:
        if self.calls == 0 and self._held:
            out.append(self._held)
        self._held = ""
        return out


class HermesParser(ToolParser):
    """`<tool_call>` JSON `</tool_call>` blocks anywhere in the reply; the text outside them is content."""

    def __init__(self, names: Collection[str]):
        super().__init__(names)
        self._buffer, self._inside = "", False

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        self._buffer += text
        while True:
            if not self._inside:
                at = self._buffer.find(HERMES_OPEN)
                if at < 0:  # keep back what may still become the opening tag
                    keep = next((k for k in range(min(len(HERMES_OPEN) - 1, len(self._buffer)), 0, -1)
                                 if self._buffer.endswith(HERMES_OPEN[:k])), 0)
                    self._text(self._buffer[:len(self._buffer) - keep], out)
                    self._buffer = self._buffer[len(self._buffer) - keep:]
                    return out
                self._text(self._buffer[:at], out)
                self._buffer, self._inside = self._buffer[at:], True
            end = self._buffer.find(HERMES_CLOSE)
            if end < 0:
                return out
            end += len(HERMES_CLOSE)
            block, self._buffer, self._inside = self._buffer[:end], self._buffer[end:], False
            call = self._block(block[len(HERMES_OPEN):-len(HERMES_CLOSE)])
            if call is None:
                self._text(block, out)
            else:
                self._call(call, out)

    def _block(self, inner: str) -> ToolCall | None:
        try:
            return read_call(json.loads(inner), self.names)
        except ValueError:
            return None

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        self._text(self._buffer, out)  # an unclosed call, or the start of a tag, is content
        self._buffer, self._inside = "", False
        return self._end(out)


class Llama3JsonParser(ToolParser):
    """A reply that starts with `{` is held until it ends, then read as calls separated by ';' (all of them, or it is
    content); any other reply is content, streamed as it comes."""

    def __init__(self, names: Collection[str]):
        super().__init__(names)
        self._buffer, self._calls = "", None  # None: undecided, True: held as calls, False: content

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        if self._calls is False:
            self._text(text, out)
            return out
        self._buffer += text
        start = self._buffer.lstrip().removeprefix(PYTHON_TAG).lstrip()
        if start and self._calls is None:
            self._calls = start.startswith("{")
            if not self._calls:
                self._text(self._buffer, out)
                self._buffer = ""
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        calls = self._read(self._buffer.strip().removeprefix(PYTHON_TAG)) if self._calls else None
        if calls:
            for call in calls:
                self._call(call, out)
        else:
            self._text(self._buffer, out)
        self._buffer = ""
        return self._end(out)

    def _read(self, text: str) -> list[ToolCall] | None:
        decoder, at, calls = json.JSONDecoder(), 0, []
        while True:
            at = _skip_space(text, at)
            try:
                value, at = decoder.raw_decode(text, at)
            except ValueError:
                return None
            call = read_call(value, self.names)
            if call is None:
                return None
            calls.append(call)
            at = _skip_space(text, at)
            if at == len(text):
                return calls
            if text[at] != ";":
                return None
            at += 1


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def parser(kind: str, names: Collection[str]) -> ToolParser:
    """A fresh parser of format `kind` ("hermes" or "llama3_json") for a reply that may call `names`."""
    return {"hermes": HermesParser, "llama3_json": Llama3JsonParser}[kind](names)


def parse(kind: str, text: str, names: Collection[str]) -> tuple[str | None, list[ToolCall]]:
    """A whole reply's (content, calls): content None when the reply is calls only."""
    reader = parser(kind, names)
    pieces = reader.feed(text) + reader.finish()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    content = "".join(p for p in pieces if isinstance(p, str))
    return (content or None) if calls else content, calls


# -- the grammar of a forced call (tool_choice "required" or a named function) --------------------------------
def call_schema(function: dict, key: str) -> dict:
    """The JSON schema of one call of `function` (an OpenAI tool's "function" object): {"name": its name, key: its
    arguments}, the arguments validating against its `parameters` (no parameters: an empty object). The parameters'
    own definitions ($defs, definitions) move to the top, so that their "#/$defs/..." references still resolve."""
    parameters = dict(function.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False})
    hoisted = {k: parameters.pop(k) for k in ("$defs", "definitions") if k in parameters}
    options = dict(JSON_OPTIONS, **(parameters.pop("x-guidance", None) or {}))
    return {"type": "object", "properties": {"name": {"const": function["name"]}, key: parameters},
            "required": ["name", key], "additionalProperties": False, "x-guidance": options, **hoisted}


def grammar(kind: str, functions: list[dict], parallel: bool) -> str:
    """A Lark grammar (llguidance's dialect, with `%json` for each function's call) of a reply that is one call of one
    of `functions` (several when `parallel`), in format `kind`."""
    key = "arguments" if kind == "hermes" else "parameters"
    rules = [f"fn{i}: %json {json.dumps(call_schema(f, key))}" for i, f in enumerate(functions)]
    one = " | ".join(f"fn{i}" for i in range(len(functions)))
    if kind == "hermes":
        call = f"call: {json.dumps(HERMES_OPEN + chr(10))} ({one}) {json.dumps(chr(10) + HERMES_CLOSE)}"
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
    else:
        call = f"call: {one}"
        start = 'start: call ("; " call)*' if parallel else "start: call"
    return "\n".join([start, call, *rules]) + "\n"
