"""Beam search as transformers' generate runs it (`num_beams` > 1), torch-free, each step inside the compiled loop.

    ids = g.generate(input_ids, attention_mask=mask, num_beams=4, max_new_tokens=32)      # [B, L + new]
    ids = g.generate(input_ids, num_beams=4, num_return_sequences=2, length_penalty=0.6)  # [2B, L + new]

transformers' beam search (GenerationMixin._beam_search) keeps, per prompt, `num_beams` running sequences and the
`num_beams` best finished ones. Each step the model's float32 logits go through log_softmax, then the logits
processors (generate/processors.py, on the log-probabilities, each beam over its own tokens so far), then each beam's
running score is added; the best K = max(2, 1 + end tokens) * num_beams of all beams' continuations are kept. Those
that end (an end token, or the last new token) are offered to the finished set (only the top `num_beams` of the K, with
their score divided by length ** length_penalty, the length counting the new tokens and the end token); the best
`num_beams` of the others run on, and the cache rows are gathered so that each row holds its new beam's keys and
values. A prompt is done once no running beam can beat its worst finished one (early_stopping False: at the current
length; "never": at the longest length where length_penalty > 0), or with early_stopping True once it holds
`num_beams` finished sequences; generation stops once every prompt is done, or when no continuation can go on. The
result holds each prompt's best `num_return_sequences` finished sequences, padded (after their end) with
transformers' fill: pad_token_id, or the first end token where pad_token_id is 0.

This module holds the search alone, as pure functions of arrays (the state is a dict of [B, num_beams, ...] arrays, so
it is carried through jax.lax.while_loop); generate/generator.py and generate/seq2seq.py run the model steps around it.
The sentinel arithmetic (-1e9 added to scores that must not be chosen) is transformers' own, in the same float32
order, so near-ties break the same way; exact ties break towards the lower index, as lax.top_k orders them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import InputSpecError
from .sampling import divide

__all__ = ["BEAM_NAMES", "Beams", "Rule", "beam_settings", "check_rows", "expand_rows", "initial_state", "log_probs", "penalties",
           "result", "step"]

BEAM_NAMES = ("num_beams", "length_penalty", "early_stopping", "num_return_sequences")
UNCHOSEN = -1.0e9  # transformers' score for what must not be chosen (finished running beams, unfinished candidates)
# Settings that may be given per prompt row (generate repeats them for each of a row's beams).
PER_ROW = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty", "min_new_tokens")


@dataclass(frozen=True)
class Beams:
    """One call's beam-search settings (static: part of the compiled step's identity)."""

    num_beams: int
    length_penalty: float = 1.0
    early_stopping: bool | str = False  # True, False or "never", as transformers takes it
    num_return_sequences: int = 1

    @property
    def rule(self) -> Rule:
        """What the compiled step needs to know statically (the length penalty itself is data: `penalties`)."""
        return Rule(self.early_stopping, self.early_stopping == "never" and self.length_penalty > 0)


@dataclass(frozen=True)
class Rule:
    """The stopping rule of a search, static in the compiled step: early_stopping, and whether the best a running beam
    may reach is judged at the longest length (early_stopping "never" with a positive length penalty) or the current."""

    early_stopping: bool | str
    at_longest: bool


def beam_settings(given: dict, defaults: Any, *, do_sample: bool, stream: bool) -> Beams | None:
    """The call's beam settings (`given`: name -> value, None for the artifact's default, the checkpoint's generation
    config `defaults`), validated; None for one sequence per prompt (num_beams 1), the greedy / sampling loop."""
    value = {name: given.get(name) if given.get(name) is not None else getattr(defaults, name, None) for name in BEAM_NAMES}
    beams = _whole("num_beams", 1 if value["num_beams"] is None else value["num_beams"], 1)
    returned = _whole("num_return_sequences", 1 if value["num_return_sequences"] is None else value["num_return_sequences"], 1)
    penalty = 1.0 if value["length_penalty"] is None else value["length_penalty"]
    if isinstance(penalty, bool) or not isinstance(penalty, (int, float, np.integer, np.floating)) or not math.isfinite(penalty):
        raise InputSpecError(f"length_penalty must be a finite number (1.0: scores averaged per token; > 1 favors longer "
                             f"sequences, < 1 shorter ones), got {penalty!r}")
    early = False if value["early_stopping"] is None else value["early_stopping"]
    if isinstance(early, np.bool_):
        early = bool(early)
    if not (isinstance(early, bool) or early == "never"):
        raise InputSpecError(f"early_stopping must be True, False or \"never\", as transformers takes it (got {early!r})")
    if beams == 1:
        if returned != 1:
            raise InputSpecError(f"num_return_sequences={returned} needs beam search with at least that many beams "
                                 f"(num_beams >= {returned}); one sequence per prompt is generated without beams")
        return None
    if returned > beams:
        raise InputSpecError(f"num_return_sequences ({returned}) must be at most num_beams ({beams}): each prompt returns "
                             "its best finished beams")
    if do_sample:
        raise InputSpecError(f"beam sampling (do_sample=True with num_beams={beams}) is not supported: pass "
                             "do_sample=False for beam search (the model's generation config may set do_sample), or "
                             "num_beams=1 to sample")
    if stream:
        raise InputSpecError("stream=True yields each step's tokens, which beam search does not settle until it ends: "
                             "call generate without stream for beam search, or with num_beams=1 to stream")
    return Beams(beams, float(penalty), early, returned)


def _whole(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise InputSpecError(f"{name} must be an integer >= {least} (got {value!r})")
    return int(value)


def check_rows(rows: int, beams: Beams, max_batch: int) -> None:
    """Each prompt runs as num_beams rows of the compiled steps, which take at most `max_batch`."""
    if rows * beams.num_beams > max_batch:
        raise InputSpecError(f"{rows} prompt(s) x num_beams={beams.num_beams} make {rows * beams.num_beams} rows, more than "
                             f"this artifact's max_batch ({max_batch}): pass fewer prompts per call, fewer beams, or "
                             "convert with a larger max_batch")


def expand_rows(given: dict, batch: int, beams: Beams) -> dict:
    """The call's settings with each per-row value (a sequence of one value per prompt) repeated for the prompt's beams."""
    out = dict(given)
    for name in PER_ROW:
        value = out.get(name)
        if value is None or np.ndim(value) == 0:
            continue
        array = np.asarray(value)
        if array.ndim != 1 or array.shape[0] != batch:
            raise InputSpecError(f"{name} must be a number or a sequence of one value per prompt: expected length "
                                 f"{batch}, got shape {tuple(array.shape)}")
        out[name] = np.repeat(array, beams.num_beams)
    return out


def fill_token(pad: int, eos: tuple[int, ...]) -> int:
    """What transformers' beam search puts after a sequence's end: pad_token_id, or the first end token where the pad id
    is 0 (it tests the pad id for truth)."""
    return (pad if pad != 0 else eos[0]) if eos else pad


def width_for(max_new_tokens: int) -> int:
    """The sequences' static width: max_new_tokens rounded up to a power of two (at least 16), so nearby lengths share
    one compiled step."""
    return max(16, 1 << (max_new_tokens - 1).bit_length())


def penalties(beams: Beams, width: int) -> jax.Array:
    """[width + 1] float32: n ** length_penalty for n new tokens, as Python computes it and torch casts it to the
    scores' float32 (computing it in float32 on the device can differ by one ulp)."""
    return jnp.asarray([1.0] + [float(n ** beams.length_penalty) for n in range(1, width + 1)], jnp.float32)


def initial_state(batch: int, beams: Beams, width: int, fill: int) -> dict:
    """The search before the first step: beam 0 of each prompt at score 0, the others at -1e9 (so that the first step's
    continuations all come from one beam), no finished sequence."""
    nb = beams.num_beams
    scores = jnp.zeros((batch, nb), jnp.float32).at[:, 1:].set(UNCHOSEN)
    tokens = jnp.full((batch, nb, width), fill, jnp.int32)
    return {"scores": scores, "tokens": tokens, "done_scores": jnp.full((batch, nb), UNCHOSEN, jnp.float32),
            "done_tokens": tokens, "done_lengths": jnp.zeros((batch, nb), jnp.int32),
            "finished": jnp.zeros((batch, nb), bool), "open": jnp.ones((batch,), bool)}


def log_probs(logits: jax.Array) -> jax.Array:
    """[R, V] logits -> float32 log-probabilities, what beam search scores and its processors see."""
    return jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)


def _take(array: jax.Array, index: jax.Array) -> jax.Array:
    """array[b, index[b, j], ...]: [B, N, ...] gathered along the beam dim by [B, M] indices."""
    return jnp.take_along_axis(array, index.reshape(index.shape + (1,) * (array.ndim - 2)), axis=1)


def _unless(scores: jax.Array, blocked: jax.Array) -> jax.Array:
    """scores + blocked * -1e9, as transformers adds its sentinel (float32, in this order)."""
    return scores + jnp.where(blocked, jnp.float32(UNCHOSEN), jnp.float32(0.0))


def step(state: dict, scores: jax.Array, at: jax.Array, max_new: jax.Array, penalty: jax.Array, eos: jax.Array, *,
         rule: Rule) -> tuple[dict, jax.Array, jax.Array, jax.Array]:
    """One beam-search step. `scores` [B * num_beams, V]: the running beams' processed log-probabilities for new token
    number `at` (0-based); `max_new`: max_new_tokens; `penalty`: `penalties(...)`; `eos` [E]: the end tokens. Returns
    (the new state, [B * num_beams] the cache row each new beam continues, [B * num_beams] its new token, whether the
    search is over)."""
    batch, nb, width = state["tokens"].shape
    vocab = scores.shape[-1]
    keep = max(2, 1 + eos.shape[0]) * nb  # enough that num_beams run on even if the best all end (beams_to_keep)
    total = scores.reshape(batch, nb, vocab) + state["scores"][:, :, None]
    top, index = lax.top_k(total.reshape(batch, nb * vocab), keep)
    source, token = index // vocab, (index % vocab).astype(jnp.int32)
    written = (jnp.arange(width) == at)[None, None]
    candidates = jnp.where(written, token[:, :, None], _take(state["tokens"], source))  # [B, K, width]
    ends = jnp.isin(token, eos) | (at + 1 >= max_new)  # transformers' end-token and max-length stopping criteria

    # the best num_beams continuations that have not ended run on
    running = _unless(top, ends)
    _, chosen = lax.top_k(running, nb)
    new_scores = jnp.take_along_axis(running, chosen, axis=1)

    # the ended ones among the top num_beams join the finished set if they beat its worst
    offered = ends & (jnp.arange(keep) < nb)[None]
    candidate = divide(top, penalty[at + 1])
    if rule.early_stopping is True:
        candidate = _unless(candidate, jnp.all(state["finished"], axis=1, keepdims=True))
    candidate = _unless(candidate, ~state["open"][:, None])
    candidate = _unless(candidate, ~offered)
    merged = jnp.concatenate([state["done_scores"], candidate], axis=1)
    _, best = lax.top_k(merged, nb)
    lengths = jnp.concatenate([state["done_lengths"], jnp.broadcast_to((at + 1).astype(jnp.int32), offered.shape)], axis=1)
    done_scores = jnp.take_along_axis(merged, best, axis=1)
    finished = jnp.take_along_axis(jnp.concatenate([state["finished"], offered], axis=1), best, axis=1)
    new_state = {
        "scores": new_scores,
        "tokens": _take(candidates, chosen),
        "done_scores": done_scores,
        "done_tokens": _take(jnp.concatenate([state["done_tokens"], candidates], axis=1), best),
        "done_lengths": jnp.take_along_axis(lengths, best, axis=1),
        "finished": finished,
    }

    # can a running beam still beat the worst finished one? (transformers' early-stop heuristic)
    longest = max_new if rule.at_longest else at + 1
    best_possible = divide(new_scores[:, :1], penalty[longest])
    worst = jnp.where(finished, jnp.min(done_scores, axis=1, keepdims=True), jnp.float32(UNCHOSEN))
    new_state["open"] = state["open"] & jnp.any(best_possible > worst, axis=1)
    over = ~(jnp.any(new_state["open"]) & ~(jnp.all(finished) & (rule.early_stopping is True)) & ~jnp.all(ends))

    rows = (jnp.take_along_axis(source, chosen, axis=1) + jnp.arange(batch)[:, None] * nb).reshape(-1)
    return new_state, rows, jnp.take_along_axis(token, chosen, axis=1).reshape(-1), over


def result(state: dict, prefix: np.ndarray, beams: Beams) -> np.ndarray:
    """[B * num_return_sequences, P + new] ids, as transformers returns them: each prompt's `prefix` row (a causal LM's
    prompt, an encoder-decoder's start token), then its best finished sequences, cut after the longest of them."""
    returned = beams.num_return_sequences
    tokens = np.asarray(state["done_tokens"])[:, :returned]
    lengths = np.asarray(state["done_lengths"])[:, :returned]
    new = int(lengths.max()) if lengths.size else 0
    rows = tokens.reshape(-1, tokens.shape[-1])[:, :new].astype(prefix.dtype)
    return np.concatenate([np.repeat(prefix, returned, axis=0), rows], axis=1)
