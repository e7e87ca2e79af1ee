"""Token sampling for torch-free text generation: greedy, temperature, top-k, top-p, min-p and typical-p.

The generation loop runs in serving processes that have no torch, so it cannot use transformers'
logits warpers. This module reimplements their semantics (temperature, then top-k, top-p, min-p and
typical-p, transformers' order, with the same tie and min-tokens-to-keep rules) as jit-able JAX functions whose
parameters are per-row arrays of shape [B], so one compiled step serves a batch of requests with
different settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..errors import Torch2JaxError

__all__ = ["divide", "filter_logits", "greedy", "min_p_filter", "pick", "sample", "sampling_params", "typical_filter"]


def greedy(logits: jax.Array) -> jax.Array:
    """[B, V] -> [B] int32: index of the max logit; ties go to the lowest index and a NaN wins, as torch.argmax does.

    Two plain reductions, the max and then the lowest index holding it: XLA:CPU runs argmax's (value, index) pair
    reduction element by element, 7x slower over a 32000-token vocabulary at one row and 10x at eight."""
    top = jnp.max(logits, axis=-1, keepdims=True)  # NaN if any is: then the first NaN is the answer
    hit = (logits == top) | jnp.isnan(logits)
    index = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(hit, index, logits.shape[-1]), axis=-1)


def divide(x: jax.Array, divisor: jax.Array) -> jax.Array:
    """x / divisor, rounded as torch rounds it. XLA rewrites a division by a broadcast value into a multiplication by
    its reciprocal, which is off by one ulp for about half the elements; dividing by a materialized array (behind an
    optimization barrier) keeps the true division."""
    return x / lax.optimization_barrier(jnp.broadcast_to(divisor, x.shape))


def filter_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *,
                  min_p: jax.Array | None = None, typical_p: jax.Array | None = None) -> jax.Array:
    """[B, V] float logits -> [B, V] float32 logits scaled by 1/temperature, with -inf outside the kept set.

    temperature, top_k and top_p are [B] (or scalars, broadcast to every row). top_k = 0 (or >= V) and
    top_p = 1.0 switch that filter off for the row. Ties at the top-k boundary are all kept; top-p removes
    the tokens whose ascending cumulative probability is <= 1 - top_p, always keeping the most likely one.
    `min_p` and `typical_p` ([B], or None for off in every row) follow, as transformers' warpers do (0 and 1.0: off).
    """
    logits = jnp.asarray(logits, jnp.float32)
    batch, vocab = logits.shape
    temperature = jnp.broadcast_to(jnp.asarray(temperature, jnp.float32), (batch,))
    top_k = jnp.broadcast_to(jnp.asarray(top_k, jnp.int32), (batch,))
    top_p = jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), (batch,))

    scaled = divide(logits, temperature[:, None])

    # One stable ascending sort per row; the permutation is kept to map the top-p decision back.
    # Stable: among equal values the lower index comes first, as torch.sort(stable=True) orders them (torch's
    # default sort leaves the order of ties unspecified, so transformers' top-p is not deterministic there).
    iota = lax.broadcasted_iota(jnp.int32, (batch, vocab), 1)
    sorted_asc, order = lax.sort((scaled, iota), dimension=1, is_stable=True, num_keys=1)

    # top-k: the k-th largest value sits at ascending position V - k; everything below it goes.
    k = jnp.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
    kth = jnp.take_along_axis(sorted_asc, (vocab - k)[:, None], axis=1)
    scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    sorted_asc = jnp.where(sorted_asc < kth, -jnp.inf, sorted_asc)  # same order: the filter is monotone

    # top-p over the top-k-filtered distribution, in ascending order.
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_asc, axis=1), axis=1)
    remove_sorted = cumulative <= (1.0 - top_p)[:, None]
    remove_sorted = remove_sorted.at[:, -1].set(False)  # min_tokens_to_keep = 1
    remove_sorted = remove_sorted & (top_p < 1.0)[:, None]
    rows = lax.broadcasted_iota(jnp.int32, (batch, vocab), 0)
    remove = jnp.zeros((batch, vocab), jnp.bool_).at[rows, order].set(remove_sorted, unique_indices=True)
    scaled = jnp.where(remove, -jnp.inf, scaled)
    if min_p is not None:
        scaled = min_p_filter(scaled, min_p)
    if typical_p is not None:
        scaled = typical_filter(scaled, typical_p)
    return scaled


def min_p_filter(logits: jax.Array, min_p: jax.Array) -> jax.Array:
    """transformers' MinPLogitsWarper: -inf where a token's probability is below min_p [B] times the row's most likely
    token's (which always stays). min_p = 0 keeps every token."""
    probs = jax.nn.softmax(logits, axis=-1)
    threshold = jnp.broadcast_to(jnp.asarray(min_p, jnp.float32), logits.shape[:1])[:, None] * probs.max(axis=-1, keepdims=True)
    return jnp.where(probs < threshold, -jnp.inf, logits)


def typical_filter(logits: jax.Array, typical_p: jax.Array) -> jax.Array:
    """transformers' TypicalLogitsWarper: keep the tokens whose -log p is closest to the entropy, in that order, until
    their probability reaches typical_p [B] (the token that crosses it included, ties with it too; at least one).
    typical_p = 1.0 leaves the row as it is."""
    batch, vocab = logits.shape
    mass = jnp.broadcast_to(jnp.asarray(typical_p, jnp.float32), (batch,))
    normalized = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(normalized)
    entropy = -jnp.nansum(normalized * p, axis=-1, keepdims=True)  # nansum: -inf * 0 of removed tokens
    shifted = jnp.abs(-normalized - entropy)
    iota = lax.broadcasted_iota(jnp.int32, (batch, vocab), 1)
    sorted_shift, sorted_logits, order = lax.sort((shifted, logits, iota), dimension=1, is_stable=True, num_keys=1)
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    last = jnp.minimum(jnp.sum(cumulative < mass[:, None], axis=-1), vocab - 1)
    cut = jnp.take_along_axis(sorted_shift, last[:, None], axis=1)
    remove_sorted = (sorted_shift > cut).at[:, 0].set(False)  # min_tokens_to_keep = 1
    rows = lax.broadcasted_iota(jnp.int32, (batch, vocab), 0)
    remove = jnp.zeros((batch, vocab), jnp.bool_).at[rows, order].set(remove_sorted, unique_indices=True)
    return jnp.where(remove & (mass < 1.0)[:, None], -jnp.inf, logits)


def sample(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *,
           min_p: jax.Array | None = None, typical_p: jax.Array | None = None) -> jax.Array:
    """[B] int32 tokens drawn from softmax(filter_logits(...)) per row (jax.random.categorical)."""
    filtered = filter_logits(logits, temperature, top_k, top_p, min_p=min_p, typical_p=typical_p)
    return jax.random.categorical(key, filtered, axis=-1).astype(jnp.int32)


def pick(logits: jax.Array, key: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *, do_sample: bool,
         key_per_row: bool = False, greedy_rows: jax.Array | None = None, min_p: jax.Array | None = None,
         typical_p: jax.Array | None = None) -> jax.Array:
    """[B] int32 tokens from [B, V] logits, the one token choice of every generator and of the server's batch: the
    greedy token, or (`do_sample`) a draw from the filtered distribution with `key` for the whole batch, or with
    `key[r]` for row r when `key_per_row` (a row then draws what it would draw alone, in a batch of one, with that
    key); rows where `greedy_rows` is True take the greedy token all the same. `min_p`, `typical_p`: [B] or None
    (off), the warpers after top-p."""
    if not do_sample:
        return greedy(logits)
    if key_per_row:
        filtered = filter_logits(logits, temperature, top_k, top_p, min_p=min_p, typical_p=typical_p)
        drawn = jax.vmap(lambda k, row: jax.random.categorical(k, row[None], axis=-1)[0])(key, filtered).astype(jnp.int32)
    else:
        drawn = sample(logits, key, temperature, top_k, top_p, min_p=min_p, typical_p=typical_p)
    return drawn if greedy_rows is None else jnp.where(greedy_rows, greedy(logits), drawn)


def _per_row(name: str, value: Any, batch: int) -> tuple[np.ndarray, bool]:
    """(`value` as a 1-D numpy array of length `batch`, whether it was given per row); a scalar is repeated."""
    if isinstance(value, jax.core.Tracer):
        raise Torch2JaxError(f"{name} must be a concrete value (a python number, sequence or array), not a traced value; "
                             f"call sampling_params outside jax.jit")
    if isinstance(value, (str, bytes)):
        raise Torch2JaxError(f"{name} must be a number or a sequence of {batch} numbers (got {value!r})")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise Torch2JaxError(f"{name} must be a number or a sequence of {batch} numbers (got {value!r}): {e}") from None
    if array.dtype.kind not in "biuf":
        raise Torch2JaxError(f"{name} must be a number or a sequence of {batch} numbers (got {value!r})")
    if array.dtype.kind == "b":
        raise Torch2JaxError(f"{name} must be a number, not a bool (got {value!r})")
    if array.ndim == 0:
        return np.full((batch,), array), False
    if array.ndim != 1 or array.shape[0] != batch:
        raise Torch2JaxError(f"{name} must be a number or a sequence of one value per row: expected length {batch}, "
                             f"got shape {tuple(array.shape)}")
    return array, True


def _bad(name: str, array: np.ndarray, per_row: bool, ok: np.ndarray, rule: str, hint: str = "") -> None:
    """Raise for the first element of `array` where `ok` is False."""
    if not ok.all():
        row = int(np.argmin(ok))
        bad = array[row].item()
        where = f" at row {row}" if per_row else ""
        raise Torch2JaxError(f"{name} must be {rule} (got {bad!r}{where}){hint}")


def sampling_params(
    batch: int,
    temperature: float | Sequence[float] | np.ndarray | jax.Array = 1.0,
    top_k: int | Sequence[int] | np.ndarray | jax.Array = 0,
    top_p: float | Sequence[float] | np.ndarray | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Validate sampling settings and broadcast them to per-row arrays.

    Each setting is a python scalar or a per-row sequence/array of concrete values. Returns
    ([batch] float32 temperature, [batch] int32 top_k, [batch] float32 top_p). Raises Torch2JaxError
    naming the bad argument, its value and the valid range: temperature finite and > 0; top_k an
    integer >= 0 (0 = off); 0 < top_p <= 1 (1.0 = off).
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise Torch2JaxError(f"batch must be an integer >= 1 (got {batch!r})")
    batch = int(batch)

    t, rows = _per_row("temperature", temperature, batch)
    t = t.astype(np.float64)
    hint = "; use do_sample=False for greedy decoding"
    _bad("temperature", t, rows, ~(t <= 0), "> 0 when sampling", hint)  # ~(t <= 0) lets nan through to the next check
    with np.errstate(over="ignore"):
        t32 = t.astype(np.float32)
    _bad("temperature", t, rows, np.isfinite(t32) & (t32 > 0), "a finite number > 0 that float32 can hold when sampling", hint)

    k, rows = _per_row("top_k", top_k, batch)
    if k.dtype.kind == "f":
        _bad("top_k", k, rows, np.isfinite(k) & (k == np.floor(k)), "an integer >= 0 (0 turns top-k off)")
    _bad("top_k", k, rows, k >= 0, "an integer >= 0 (0 turns top-k off)")
    # Values beyond the vocabulary mean "off" anyway; clip so the cast to int32 cannot wrap.
    k = np.minimum(k, np.iinfo(np.int32).max).astype(np.int32)

    p, rows = _per_row("top_p", top_p, batch)
    p = p.astype(np.float64)
    _bad("top_p", p, rows, (p > 0) & (p <= 1), "in (0, 1] (1.0 turns top-p off)")
    p32 = p.astype(np.float32)
    _bad("top_p", p, rows, p32 > 0, "in (0, 1] (it rounds to 0 in float32)")

    return jnp.asarray(t32), jnp.asarray(k), jnp.asarray(p32)
