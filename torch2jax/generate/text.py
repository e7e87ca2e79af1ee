"""Text around the token loop, torch-free: streamed detokenization (incremental) with stop strings, and chat templates.

Stop strings are matched on decoded text (a stop string may span several tokens, or part of one), so a
streamed reply holds back the tail that could still be the start of a stop string, and the stop string
itself is never sent. Chat templates are rendered with jinja2 the way transformers' apply_chat_template
renders them (a sandboxed environment with trim_blocks/lstrip_blocks, `raise_exception`, `strftime_now`
and a `tojson` that does not escape HTML, the special tokens as variables), without transformers.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import InputSpecError, Torch2JaxError

INCOMPLETE = "\ufffd"  # what a decoder gives for the first bytes of a multi-byte character


class TextStream:
    """One reply's text as tokens arrive: `push(token)` -> (text safe to send now, whether a stop string ended it).

    A `tokenizers.Tokenizer` decodes incrementally (tokenizers' DecodeStream: each token costs about one token's
    decoding, and a character split across tokens comes whole once its last byte arrives); any other tokenizer with
    `decode(ids, skip_special_tokens=True)` (a transformers tokenizer) decodes the reply again at each token."""

    def __init__(self, tokenizer: Any, stop: list[str] | tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.ids: list[int] = []
        self.decoded = ""  # the reply decoded so far, before any cut at a stop string
        self.sent = ""  # text already handed out
        self.text = ""  # the reply so far (cut at a stop string once one is found)
        self.stopped = False
        self._stream = _decode_stream(tokenizer)
        self._pending = False  # tokens pushed that the incremental decoder holds until their character is whole

    def push(self, token: int) -> tuple[str, bool]:
        self.ids.append(int(token))
        if self._stream is None:
            self.decoded = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        else:
            chunk = self._stream.step(self.tokenizer, int(token))
            self._pending = chunk is None
            self.decoded += chunk or ""
        text = self.decoded
        # nothing sent can begin a stop string (that tail is held back), so search from there; the earliest wins
        found = [at for stop in self.stop if (at := text.find(stop, len(self.sent))) >= 0]
        if found:
            text, self.stopped = text[: min(found)], True
        self.text = text
        if self.stopped:
            return self._take(len(text)), True
        safe = len(text) - self._held_back(text)
        return self._take(safe), False

    def flush(self) -> str:
        """Whatever was held back, once the reply has ended without a stop string (a character cut short by the reply's
        end comes as the replacement character, as decoding the whole reply gives it)."""
        if self._pending and not self.stopped:
            whole = self.tokenizer.decode(self.ids, skip_special_tokens=True)
            if whole.startswith(self.text):
                self.text = self.decoded = whole
            self._pending = False
        return self._take(len(self.text))

    def _held_back(self, text: str) -> int:
        """Characters at the end that may still become a stop string or a whole character."""
        if text.endswith(INCOMPLETE):
            return len(text) - len(text.rstrip(INCOMPLETE))
        longest = 0
        for stop in self.stop:
            for size in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _take(self, end: int) -> str:
        if end <= len(self.sent) or not self.text.startswith(self.sent):
            return ""
        delta, self.sent = self.text[len(self.sent):end], self.text[:end]
        return delta


def _decode_stream(tokenizer: Any) -> Any:
    """An incremental decoder for a `tokenizers.Tokenizer` (None for any other tokenizer)."""
    try:
        from tokenizers import Tokenizer
        from tokenizers.decoders import DecodeStream
    except ImportError:
        return None
    return DecodeStream(skip_special_tokens=True) if isinstance(tokenizer, Tokenizer) else None


class ChatTemplate:
    """A chat template from tokenizer_config.json (or a .jinja file), rendered as transformers renders it."""

    def __init__(self, source: str, special_tokens: dict[str, str]):
        try:
            from jinja2 import meta
            from jinja2.exceptions import TemplateError
            from jinja2.ext import loopcontrols
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise Torch2JaxError("chat templates need jinja2: pip install 'torch2jax-aot[serve]'") from None

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                   sort_keys: bool = False) -> str:
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        try:
            self.template = env.from_string(source)
            variables = meta.find_undeclared_variables(env.parse(source))
        except TemplateError as err:
            raise Torch2JaxError(f"the chat template does not parse: {err}") from None
        self.source, self.special_tokens = source, special_tokens
        self.renders_tools = "tools" in variables  # whether the template reads a request's tool definitions
        self._error = TemplateError

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
               **extra: Any) -> str:
        """The prompt text for these messages (and tool definitions: OpenAI's [{"type": "function", "function":
        {...}}] list, as transformers passes `tools`; None without, as transformers passes it too, so that `tools is
        none` reads the same); a template's raise_exception (or any template error) is the request's fault."""
        try:
            return self.template.render({"documents": None, **self.special_tokens, **extra}, messages=messages, tools=tools,
                                        add_generation_prompt=add_generation_prompt)
        except self._error as err:
            raise InputSpecError(f"the chat template refused these messages: {err}") from None

    @staticmethod
    def from_files(tokenizer_config: Path | None, override: Path | None = None) -> ChatTemplate | None:
        """The template named `override`, else tokenizer_config.json's `chat_template` (its "default" one when it
        holds several); None when there is none."""
        config: dict = {}
        if tokenizer_config is not None and tokenizer_config.is_file():
            try:
                config = json.loads(tokenizer_config.read_text())
            except (OSError, ValueError) as err:
                raise Torch2JaxError(f"{tokenizer_config} is not readable JSON: {err}") from None
        source = override.read_text() if override is not None else config.get("chat_template")
        if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
        if not isinstance(source, str) or not source:
            return None
        tokens = {}
        for key, value in config.items():
            if key.endswith("_token") and value is not None:
                tokens[key] = value.get("content", "") if isinstance(value, dict) else str(value)
        return ChatTemplate(source, tokens)
