"""Structured output (OpenAI's `response_format`): a reply whose text is JSON, any JSON object or one that validates
against a JSON schema, made by choosing each token among the ones a grammar allows.

llguidance (a grammar engine: JSON schema -> grammar -> allowed-token masks) does the grammar side. `Grammars` holds its
view of the model's tokenizer (built once from tokenizer.json, on first use: about a second for a large vocabulary) and
compiles a request's schema into a `Constraint` per choice; the scheduler asks each constraint for its row's mask before
every token (serve/engine.py applies it to the logits on the device) and feeds it the chosen token. The reply ends when
its grammar is complete: the matcher accepts and nothing but the end token may follow.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..errors import InputSpecError

# JSON as json.dumps writes it: ", " and ": " between items, no other whitespace (a schema's "x-guidance" options may say
# otherwise). Free whitespace would let a weak model fill its reply with blanks and never close the object.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class StructuredOutputError(InputSpecError):
    """A `response_format` (or a forced tool call's `tools`) this server cannot honour: a bad schema, or a model whose
    tokenizer the grammar engine cannot read. `param`: the request field to name in the refusal."""

    def __init__(self, message: str, param: str = "response_format"):
        super().__init__(message)
        self.param = param


class Constraint:
    """One choice's grammar state (an llguidance matcher): the tokens allowed next, and the tokens generated so far."""

    def __init__(self, matcher: Any):
        self.matcher = matcher

    def fill(self, row: np.ndarray) -> None:
        """Write the allowed-token bitmask of the next token into `row` ([mask_words] int32, C-contiguous)."""
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)

    def advance(self, token: int) -> bool:
        """Take the chosen token; True when the grammar is complete (nothing but the end token may follow). Raises
        StructuredOutputError when the token breaks the grammar (it was outside the mask) or the grammar hit a limit."""
        if not self.matcher.consume_token(int(token)) or self.matcher.is_error():
            raise StructuredOutputError(f"structured output: token {token} does not fit the grammar "
                                        f"({self.matcher.get_error() or 'rejected'})")
        return self.matcher.is_stopped()

    def copy(self) -> Constraint:
        return Constraint(self.matcher.deep_copy())


class Grammars:
    """The grammar engine over one model's tokenizer: `tokenizer` (a `tokenizers.Tokenizer`, None when the artifact has
    no tokenizer files), the model's vocabulary size (masks have one bit per logit) and its end tokens."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...] | list[int]):
        self.source, self.vocab_size, self.eos = tokenizer, vocab_size, [int(t) for t in eos_token_ids]
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def tokenizer(self) -> Any:
        """llguidance's tokenizer (an LLTokenizer), built on first use; StructuredOutputError when it cannot be."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = self._build()
            return self._tokenizer

    def _build(self) -> Any:
        if self.source is None or not hasattr(self.source, "to_str"):
            raise StructuredOutputError("structured output needs the model's tokenizer files (tokenizer.json) in the "
                                        "artifact: convert it from a model directory that has them")
        try:
            import llguidance
        except ImportError:
            raise StructuredOutputError("structured output needs llguidance on the server: pip install "
                                        "'torch2jax-aot[serve]' (or pip install llguidance)") from None
        try:
            return llguidance.LLTokenizer(self.source.to_str(), n_vocab=self.vocab_size, eos_token=self.eos or None)
        except (ValueError, RuntimeError) as err:
            raise StructuredOutputError(
                "structured output needs a tokenizer whose tokens spell bytes (byte-level BPE, SentencePiece, ...); the "
                f"grammar engine cannot read this model's tokenizer.json ({err})") from None

    @staticmethod
    def schema_of(response_format: dict) -> dict:
        """The JSON schema a response_format asks for: any JSON object for json_object, the given one for json_schema."""
        if response_format["type"] == "json_object":
            return {"type": "object"}
        return response_format["json_schema"]["schema"]

    def constraints(self, response_format: dict, n: int = 1) -> list[Constraint]:
        """`n` fresh constraints (one per choice) for a response_format ({"type": "json_object"} or {"type":
        "json_schema", ...}; protocol.py checked its shape); StructuredOutputError naming what is wrong with the schema."""
        import llguidance

        tokenizer = self.tokenizer()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(self.schema_of(response_format), defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as err:
            raise StructuredOutputError(f"'response_format': the schema is not valid JSON ({err})") from None
        return self._matchers(tokenizer, grammar, n, "'response_format': the JSON schema", "response_format")

    def lark_constraints(self, lark: str, n: int = 1, what: str = "'tools'", param: str = "tools") -> list[Constraint]:
        """`n` fresh constraints for a Lark grammar in llguidance's dialect (a forced tool call: serve/tools.py writes
        it, with `%json` schemas inside); StructuredOutputError naming `what` (and the field `param`) when the grammar
        or a schema in it cannot be used."""
        import llguidance

        try:
            tokenizer = self.tokenizer()
        except StructuredOutputError as err:
            raise StructuredOutputError(f"{what}: {err}", param) from None
        return self._matchers(tokenizer, llguidance.LLMatcher.grammar_from_lark(lark), n, what, param)

    @staticmethod
    def _matchers(tokenizer: Any, grammar: str, n: int, what: str, param: str) -> list[Constraint]:
        import llguidance

        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
        if failed:
            raise StructuredOutputError(f"{what} cannot be used: {messages[0]}", param)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise StructuredOutputError(f"{what} cannot be used: {matcher.get_error()}", param)
        first = Constraint(matcher)
        return [first] + [first.copy() for _ in range(n - 1)]
