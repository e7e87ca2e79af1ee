"""Logits processors for torch-free generation: transformers' generation-config rules, as arrays in the compiled step.

transformers' `generate` runs a list of logits processors between the model's logits and the token choice, built
from the checkpoint's generation config and the call's arguments (GenerationMixin._get_logits_processor). This module
reimplements the ones a generation config commonly sets, with the same semantics and in the same order, as jit-able
JAX functions over the last step's logits, so the compiled decode loop runs them with no Python per token:

1. repetition_penalty (over the prompt, less its left padding, and the tokens generated so far)
2. no_repeat_ngram_size
3. bad_words_ids (one-token words always; longer ones when the history ends with the word's prefix)
4. min_length, then min_new_tokens (the end tokens masked until the length is reached)
5. forced BOS/EOS (generate/seq2seq.py forces them after the greedy / sampled pick; beam search, whose scores see the
   forced token's log-probability 0, passes them to `apply`)
6. suppress_tokens, then begin_suppress_tokens (at the first generated step)

The sampling warpers (temperature, top_k, top_p, min_p, typical_p, in that order) are generate/sampling.py's. Only the
first processor changes values; the others set logits to -inf, so their order among themselves does not matter.

Beam search (generate/beam.py) runs the same processors on the log-probabilities, per beam, as transformers does.

`GenerationSettings` is what the artifact stores of the checkpoint's generation config (its defaults, overridable per
call); `Processing` is the static part of one call's processors (which ones run: the compiled step's shape), and
`settings_arrays` the per-call arrays they read, per row where transformers' meaning allows it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import Torch2JaxError
from .beam import BEAM_NAMES
from .sampling import _bad, _per_row, divide

__all__ = [
    "GenerationSettings", "NONE", "Processing", "SETTING_NAMES", "apply", "bad_words", "begin_suppress", "forced", "min_length",
    "no_repeat_ngram", "record", "repetition_penalty", "resolve", "suppress",
]

# What `generate(...)` takes beyond the sampling settings, in transformers' names.
PROCESSOR_NAMES = ("repetition_penalty", "no_repeat_ngram_size", "min_length", "min_new_tokens", "suppress_tokens",
                   "begin_suppress_tokens", "bad_words_ids", "min_p", "typical_p")
SAMPLING_NAMES = ("do_sample", "temperature", "top_k", "top_p")
SETTING_NAMES = SAMPLING_NAMES + PROCESSOR_NAMES

# Generation-config settings that change transformers' output and that torch2jax does not apply, with the value
# that means "off": a checkpoint setting one of them gets a warning at conversion and at each generate call.
NOT_APPLIED = {
    "num_beam_groups": 1, "penalty_alpha": None, "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0, "sequence_bias": None, "exponential_decay_length_penalty": None,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "top_h": None, "guidance_scale": 1.0, "remove_invalid_values": False,
    "renormalize_logits": False, "forced_decoder_ids": None, "dola_layers": None, "watermarking_config": None,
}


@dataclass(frozen=True)
class GenerationSettings:
    """The checkpoint's generation-config values torch2jax applies (None: not set), stored in the artifact's manifest
    (`generation.settings`) so a torch-free generate call starts from the checkpoint's defaults, as transformers' does.
    The beam-search settings (generate/beam.py) are stored as the config gives them. `not_applied`: settings the config
    sets that torch2jax does not apply (diverse beam groups, contrastive search, ...), as `name=value`."""

    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram_size: int | None = None
    min_length: int | None = None
    min_new_tokens: int | None = None
    suppress_tokens: tuple[int, ...] | None = None
    begin_suppress_tokens: tuple[int, ...] | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] | None = None
    num_beams: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | str | None = None  # True, False or "never"
    num_return_sequences: int | None = None
    # transformers' ForcedEOSTokenLogitsProcessor: the last new token (a causal LM's; an encoder-decoder's spec has its own)
    forced_eos_token_id: int | None = None
    not_applied: tuple[str, ...] = ()

    @staticmethod
    def from_config(config: Any) -> GenerationSettings:
        """The settings of a transformers GenerationConfig (read by attribute: no transformers import here); warns
        once for each setting that changes transformers' output and is not applied (num_beam_groups > 1, ...)."""
        if config is None:
            return GenerationSettings()
        values: dict[str, Any] = {}
        for name in SETTING_NAMES:
            value = getattr(config, name, None)
            if value is None:
                continue
            if name in ("suppress_tokens", "begin_suppress_tokens"):
                value = tuple(int(t) for t in value)
            elif name == "bad_words_ids":
                value = tuple(tuple(int(t) for t in word) for word in value)
            elif name == "do_sample":
                value = bool(value)
            elif name in ("top_k", "no_repeat_ngram_size", "min_length", "min_new_tokens"):
                value = int(value)
            else:
                value = float(value)
            values[name] = value
        for name in BEAM_NAMES:
            value = getattr(config, name, None)
            if value is not None:
                if name == "length_penalty":
                    values[name] = float(value)
                elif name == "early_stopping":
                    values[name] = value if value == "never" else bool(value)
                else:
                    values[name] = int(value)
        forced_eos = getattr(config, "forced_eos_token_id", None)
        if isinstance(forced_eos, (list, tuple)):  # transformers forces the first of a list
            forced_eos = forced_eos[0] if forced_eos else None
        if forced_eos is not None:
            values["forced_eos_token_id"] = int(forced_eos)
        ignored = []
        for name, off in NOT_APPLIED.items():
            value = getattr(config, name, None)
            if value is not None and value != off and not (name == "guidance_scale" and value == 1):
                ignored.append(f"{name}={value!r}")
        settings = GenerationSettings(**values, not_applied=tuple(ignored))
        settings.warn_not_applied(stacklevel=3)
        return settings

    def warn_not_applied(self, stacklevel: int = 2) -> None:
        if self.not_applied:
            warnings.warn(f"the model's generation config sets {', '.join(self.not_applied)}, which torch2jax's generate "
                          "does not apply (it decodes greedy, sampled or with beam search, with the processors "
                          "docs/api.md lists): its tokens can differ from transformers' generate", UserWarning,
                          stacklevel=stacklevel + 1)

    def to_json(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value == ():
                continue
            if f.name == "bad_words_ids":
                value = [list(word) for word in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @staticmethod
    def from_json(data: Any) -> GenerationSettings:
        if not data:
            return GenerationSettings()
        if not isinstance(data, dict):
            raise Torch2JaxError(f"the manifest's generation settings are malformed (not an object: {data!r})")
        unknown = set(data) - {f.name for f in fields(GenerationSettings)}
        if unknown:
            raise Torch2JaxError(f"the manifest's generation settings hold unknown names {sorted(unknown)}: this "
                                 "artifact was written by a newer torch2jax")
        values = dict(data)
        for name in ("suppress_tokens", "begin_suppress_tokens", "not_applied"):
            if name in values:
                values[name] = tuple(values[name])
        if "bad_words_ids" in values:
            values["bad_words_ids"] = tuple(tuple(word) for word in values["bad_words_ids"])
        return GenerationSettings(**values)


@dataclass(frozen=True)
class Processing:
    """Which processors one call runs: static (hashable) for jax.jit, so a call with none runs the plain step.
    `ngram` is no_repeat_ngram_size (0: off); `history` says whether the step carries the token history."""

    repetition: bool = False
    ngram: int = 0
    bad_sequences: bool = False  # bad words of two tokens or more
    banned: bool = False  # suppress_tokens and one-token bad words
    begin_banned: bool = False  # begin_suppress_tokens
    min_length: bool = False  # min_length / min_new_tokens

    @property
    def history(self) -> bool:
        return self.repetition or self.ngram > 0 or self.bad_sequences

    @property
    def active(self) -> bool:
        return self != NONE


NONE = Processing()  # no processor: the plain step


# -- the processors: [B, V] float32 logits in, [B, V] out -----------------------------------------------------------
def _mark(batch: int, vocab: int, ids: jax.Array, hit: jax.Array) -> jax.Array:
    """[B, V] bool: True at (row, ids[row, j]) wherever hit[row, j] (a scatter into a spare column V otherwise)."""
    ids = jnp.where(hit, jnp.clip(ids, 0, vocab), vocab).astype(jnp.int32)
    rows = lax.broadcasted_iota(jnp.int32, ids.shape, 0)
    return jnp.zeros((batch, vocab + 1), jnp.bool_).at[rows, ids].set(True)[:, :vocab]


def repetition_penalty(logits: jax.Array, history: jax.Array, length: jax.Array, counted_from: jax.Array,
                       penalty: jax.Array) -> jax.Array:
    """transformers' RepetitionPenaltyLogitsProcessor: each token seen in history[:, counted_from:length] has its logit
    divided by the row's penalty where positive, multiplied where negative (once per token however often seen).
    `counted_from` [B]: the row's left padding, which transformers leaves out (its prompt_ignore_length)."""
    batch, vocab = logits.shape
    position = jnp.arange(history.shape[1])
    seen = _mark(batch, vocab, history, (position[None] < length) & (position[None] >= counted_from[:, None]))
    penalty = penalty[:, None]
    return jnp.where(seen, jnp.where(logits < 0, logits * penalty, divide(logits, penalty)), logits)


def no_repeat_ngram(logits: jax.Array, history: jax.Array, length: jax.Array, size: int) -> jax.Array:
    """transformers' NoRepeatNGramLogitsProcessor: a token that would complete an n-gram (n = `size`) already in
    history[:, :length] is banned. Every window of n tokens whose first n - 1 match the last n - 1 bans its last."""
    batch, vocab = logits.shape
    width = history.shape[1]
    if width < size:
        return logits
    starts = width - size + 1
    windows = jnp.stack([history[:, j : j + starts] for j in range(size)], axis=-1)  # [B, starts, n]
    tail = lax.dynamic_slice_in_dim(history, jnp.clip(length - (size - 1), 0, width - (size - 1)), size - 1, axis=1)
    match = (windows[..., :-1] == tail[:, None, :]).all(axis=-1)
    match = match & (jnp.arange(starts)[None] <= length - size) & (length >= size)
    return jnp.where(_mark(batch, vocab, windows[..., -1], match), -jnp.inf, logits)


def bad_words(logits: jax.Array, history: jax.Array, length: jax.Array, prefixes: jax.Array, prefix_lengths: jax.Array,
              last: jax.Array) -> jax.Array:
    """transformers' NoBadWordsLogitsProcessor for words of two tokens or more: a word's last token is banned where
    history[:, :length] ends with the word's other tokens. `prefixes` [W, P] right-aligned (entries before a word's
    own `prefix_lengths` [W] are ignored), `last` [W] the words' last tokens. One-token words are `suppress`'s."""
    batch, vocab = logits.shape
    words, room = prefixes.shape
    position = length - room + jnp.arange(room)  # the history positions the prefixes line up with
    tail = jnp.take(history, jnp.clip(position, 0, history.shape[1] - 1), axis=1)  # [B, P]
    counts = jnp.arange(room)[None] >= (room - prefix_lengths)[:, None]  # [W, P]: which entries a word has
    same = (tail[:, None, :] == prefixes[None]) & (position >= 0)[None, None]
    match = jnp.where(counts[None], same, True).all(axis=-1)  # [B, W]
    return jnp.where(_mark(batch, vocab, jnp.broadcast_to(last, (batch, words)), match), -jnp.inf, logits)


def suppress(logits: jax.Array, banned: jax.Array) -> jax.Array:
    """transformers' SuppressTokensLogitsProcessor (and one-token bad words): -inf where `banned` [V] (or [B, V])."""
    return jnp.where(banned, -jnp.inf, logits)


def begin_suppress(logits: jax.Array, banned: jax.Array, length: jax.Array, begin_at: jax.Array) -> jax.Array:
    """transformers' SuppressTokensAtBeginLogitsProcessor: -inf where `banned` [V] when the sequence is `begin_at` long."""
    return jnp.where(banned & (length == begin_at), -jnp.inf, logits)


def min_length(logits: jax.Array, eos: jax.Array, length: jax.Array, eos_from: jax.Array) -> jax.Array:
    """transformers' MinLengthLogitsProcessor and MinNewTokensLengthLogitsProcessor at once: the end tokens `eos` [V]
    bool get -inf in a row while the sequence is shorter than the row's `eos_from` [B] (the larger of min_length and
    the prompt's length plus min_new_tokens)."""
    return jnp.where(eos[None] & (length < eos_from)[:, None], -jnp.inf, logits)


def forced(logits: jax.Array, force: jax.Array) -> jax.Array:
    """transformers' ForcedBOSTokenLogitsProcessor / ForcedEOSTokenLogitsProcessor where they fire: 0 at token `force`
    (a scalar or [B]), -inf elsewhere; a negative `force` (no token forced at this step) leaves the logits as they are."""
    force = jnp.broadcast_to(jnp.asarray(force), logits.shape[:1])[:, None]
    at = lax.broadcasted_iota(jnp.int32, logits.shape, 1) == force
    return jnp.where(force >= 0, jnp.where(at, 0.0, -jnp.inf).astype(logits.dtype), logits)


def apply(logits: jax.Array, processing: Processing, arrays: dict, history: jax.Array | None, length: jax.Array,
          force: jax.Array | None = None) -> jax.Array:
    """Every processor of `processing`, in transformers' order, on [B, V] logits (as float32, as transformers' generate
    casts them) when `length` tokens of the sequence exist (history[:, :length], prompt included). `force`: a token id
    (negative: none) that transformers' forced-BOS/EOS processors leave alone at 0, every other logit -inf (beam search
    passes it: its scores add the forced token's 0)."""
    logits = jnp.asarray(logits, jnp.float32)
    if not processing.active and force is None:
        return logits
    if processing.repetition:
        logits = repetition_penalty(logits, history, length, arrays["counted_from"], arrays["repetition_penalty"])
    if processing.ngram:
        logits = no_repeat_ngram(logits, history, length, processing.ngram)
    if processing.bad_sequences:
        logits = bad_words(logits, history, length, arrays["bad_prefixes"], arrays["bad_prefix_lengths"], arrays["bad_last"])
    if processing.min_length:
        logits = min_length(logits, arrays["eos_mask"], length, arrays["eos_from"])
    if force is not None:
        logits = forced(logits, force)
    if processing.banned:
        logits = suppress(logits, arrays["banned"])
    if processing.begin_banned:
        logits = begin_suppress(logits, arrays["begin_banned"], length, arrays["begin_at"])
    return logits


def record(history: jax.Array | None, length: jax.Array, token: jax.Array) -> jax.Array | None:
    """The history with `token` [B] written at position `length` (None stays None: no processor reads it)."""
    if history is None:
        return None
    return lax.dynamic_update_slice_in_dim(history, token.astype(history.dtype)[:, None], length, axis=1)


# -- one call's settings: defaults, validation, arrays ---------------------------------------------------------------
def _rows(name: str, value: Any, batch: int, rule: str, ok: Any, kind: str = "f") -> np.ndarray:
    """`value` (a number, or one per row) as a [batch] array, raising Torch2JaxError naming `name` and `rule`."""
    array, per_row = _per_row(name, value, batch)
    if kind == "i" and array.dtype.kind == "f":
        _bad(name, array, per_row, np.isfinite(array) & (array == np.floor(array)), rule)
    array = array.astype(np.float64)
    with np.errstate(invalid="ignore"):
        _bad(name, array, per_row, np.asarray(ok(array)) & ~np.isnan(array), rule)
    return array


def _token_list(name: str, value: Any, vocab: int, beyond: bool = False) -> tuple[int, ...]:
    """`value` as token ids in [0, vocab); `beyond`: ids >= vocab are dropped, not refused (a suppressed id the model
    cannot emit: transformers' suppress processors match them against the vocabulary and so ignore them, as Whisper's
    generation config does for a model built with a smaller vocabulary)."""
    rule = f"token ids >= 0{' (ids past the vocabulary are never generated: ignored)' if beyond else f' and < {vocab}'}"
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise Torch2JaxError(f"{name} must be a list of {rule} (got {value!r})")
    out = []
    for t in value:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < (np.inf if beyond else vocab):
            raise Torch2JaxError(f"{name} must be a list of {rule} (got {t!r} in {list(value)!r})")
        if int(t) < vocab:
            out.append(int(t))
    return tuple(out)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise Torch2JaxError(f"{name} must be an integer >= 0 (0 turns it off), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Resolved:
    """One call's settings resolved against the artifact's defaults: the sampling ones as generate/sampling.py takes
    them, the processors as `Processing` (static) and their arrays."""

    do_sample: bool
    temperature: Any
    top_k: Any
    top_p: Any
    warpers: dict  # min_p / typical_p [B] float32 arrays, only those some row uses
    processing: Processing
    arrays: dict


def resolve(given: dict, defaults: GenerationSettings, batch: int, vocab: int, eos: Sequence[int], prompt_length: int,
            counted_from: np.ndarray, begin_at: int) -> Resolved:
    """The call's settings (`given`: name -> value, None for "the artifact's default") over the artifact's `defaults`,
    validated, as the compiled step takes them. `prompt_length`: the tokens before the first new one (a causal LM's
    padded prompt width, an encoder-decoder's 1); `counted_from` [B]: the positions repetition_penalty skips (left
    padding); `begin_at`: the sequence length at which begin_suppress_tokens applies; `eos`: the end tokens, which
    min_length masks and one-token bad words may not name (transformers drops those)."""
    unknown = set(given) - set(SETTING_NAMES)
    if unknown:
        raise Torch2JaxError(f"unknown generation settings {sorted(unknown)}; known: {', '.join(SETTING_NAMES)}")
    value = {name: given.get(name) if given.get(name) is not None else getattr(defaults, name) for name in SETTING_NAMES}
    do_sample = bool(value["do_sample"]) if value["do_sample"] is not None else False
    temperature = 1.0 if value["temperature"] is None else value["temperature"]
    top_k = 0 if value["top_k"] is None else value["top_k"]
    top_p = 1.0 if value["top_p"] is None else value["top_p"]

    warpers = {}
    if value["min_p"] is not None:
        min_p = _rows("min_p", value["min_p"], batch, "in [0, 1] (0 turns min-p off)", lambda a: (a >= 0) & (a <= 1))
        if do_sample and (min_p > 0).any():
            warpers["min_p"] = jnp.asarray(min_p, jnp.float32)
    if value["typical_p"] is not None:
        typical = _rows("typical_p", value["typical_p"], batch, "in (0, 1] (1.0 turns typical-p off)",
                        lambda a: (a > 0) & (a <= 1))
        if do_sample and (typical < 1).any():
            warpers["typical_p"] = jnp.asarray(typical, jnp.float32)

    arrays: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    if value["repetition_penalty"] is not None:
        penalty = _rows("repetition_penalty", value["repetition_penalty"], batch,
                        "a finite number > 0 (1.0 turns it off; > 1 penalizes repeats)", lambda a: np.isfinite(a) & (a > 0))
        if (penalty != 1).any():
            flags["repetition"] = True
            arrays["repetition_penalty"] = jnp.asarray(penalty, jnp.float32)
            arrays["counted_from"] = jnp.asarray(counted_from, jnp.int32)
    if value["no_repeat_ngram_size"] is not None:
        flags["ngram"] = _count("no_repeat_ngram_size", value["no_repeat_ngram_size"])
    eos_list = [int(t) for t in eos]
    eos_mask = np.zeros(vocab, bool)
    eos_mask[[t for t in eos_list if 0 <= t < vocab]] = True
    eos_from = np.zeros(batch, np.int64)
    if value["min_length"] is not None:
        eos_from = np.maximum(eos_from, _count("min_length", value["min_length"]))
    if value["min_new_tokens"] is not None:
        new = _rows("min_new_tokens", value["min_new_tokens"], batch, "an integer >= 0 (0 turns it off)", lambda a: a >= 0, "i")
        eos_from = np.maximum(eos_from, np.where(new > 0, prompt_length + new, 0).astype(np.int64))
    if eos_mask.any() and (eos_from > 0).any():
        flags["min_length"] = True
        arrays["eos_mask"] = jnp.asarray(eos_mask)
        arrays["eos_from"] = jnp.asarray(np.minimum(eos_from, np.iinfo(np.int32).max), jnp.int32)

    banned = np.zeros(vocab, bool)
    if value["suppress_tokens"] is not None:
        banned[list(_token_list("suppress_tokens", value["suppress_tokens"], vocab, beyond=True))] = True
    longer = []
    if value["bad_words_ids"] is not None:
        words = value["bad_words_ids"]
        if isinstance(words, (str, bytes)) or not isinstance(words, (Sequence, np.ndarray)) or len(words) == 0:
            raise Torch2JaxError(f"bad_words_ids must be a non-empty list of token id lists, e.g. [[5], [7, 9]] (got {words!r})")
        for word in words:
            word = _token_list("bad_words_ids", word, vocab)
            if not word:
                raise Torch2JaxError("bad_words_ids must not hold an empty word")
            if len(word) == 1:
                if word[0] not in eos_list:  # transformers drops a bad word that is one end token
                    banned[word[0]] = True
            else:
                longer.append(word)
    if banned.any():
        flags["banned"] = True
        arrays["banned"] = jnp.asarray(banned)
    if longer:
        room = max(len(w) for w in longer) - 1
        prefixes = np.zeros((len(longer), room), np.int32)
        for i, word in enumerate(longer):
            prefixes[i, room - (len(word) - 1):] = word[:-1]
        flags["bad_sequences"] = True
        arrays["bad_prefixes"] = jnp.asarray(prefixes)
        arrays["bad_prefix_lengths"] = jnp.asarray([len(w) - 1 for w in longer], jnp.int32)
        arrays["bad_last"] = jnp.asarray([w[-1] for w in longer], jnp.int32)
    if value["begin_suppress_tokens"] is not None:
        begin = np.zeros(vocab, bool)
        begin[list(_token_list("begin_suppress_tokens", value["begin_suppress_tokens"], vocab, beyond=True))] = True
        if begin.any():
            flags["begin_banned"] = True
            arrays["begin_banned"] = jnp.asarray(begin)
            arrays["begin_at"] = jnp.asarray(begin_at, jnp.int32)
    return Resolved(do_sample, temperature, top_k, top_p, warpers, Processing(**flags), arrays)
