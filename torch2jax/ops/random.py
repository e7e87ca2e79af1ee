"""Random ops: each draws from an explicit PRNG key (LoweringContext.rng), never hidden state.

The key is the model's key folded with the node's position, so one key gives one reproducible
output and different nodes draw independently. Distributions match torch's; the bits do not.
Floats are drawn in float32 at least and cast to the dtype torch recorded for the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from ..ir.dtypes import is_floating
from ..ir.graph import Node
from .registry import lowers

_RANDOM: list[str] = []


def _random(*ops: str):
    """Register a ctx lowering and record it as random (so the interpreter asks for a key)."""
    _RANDOM.extend(ops)
    return lowers(*ops, ctx=True)


def _float(dtype):
    """The dtype to draw in: float32 for reduced-precision / non-float outputs."""
    return dtype if is_floating(dtype) and jnp.dtype(dtype).itemsize >= 4 else jnp.float32


def _uniform(ctx, shape, lo=0.0, hi=1.0):
    dtype = _float(ctx.out_dtype)
    return jax.random.uniform(ctx.rng(), tuple(shape), dtype, lo, hi)


def _normal(ctx, shape):
    return jax.random.normal(ctx.rng(), tuple(shape), _float(ctx.out_dtype))


# -- creation ----------------------------------------------------------------------------------
@_random("aten.rand.default", "aten.rand.generator")
def rand(ctx, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _uniform(ctx, ctx.out_shape)


@_random("aten.randn.default", "aten.randn.generator")
def randn(ctx, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _normal(ctx, ctx.out_shape)


@_random("aten.rand_like.default", "aten.rand_like.generator")
def rand_like(ctx, x, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _uniform(ctx, ctx.out_shape)


@_random("aten.randn_like.default", "aten.randn_like.generator")
def randn_like(ctx, x, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _normal(ctx, ctx.out_shape)


def _randint(ctx, low, high):
    """Integers uniform in [low, high), drawn as int32 (exact for the ranges int32 can hold)."""
    low = jnp.asarray(low, jnp.int32)
    high = jnp.asarray(high, jnp.int32)
    return jax.random.randint(ctx.rng(), ctx.out_shape, low, high, jnp.int32)


@_random("aten.randint.default", "aten.randint.generator")
def randint(ctx, high, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _randint(ctx, 0, high)


@_random("aten.randint.low", "aten.randint.low_generator")
def randint_low(ctx, low, high, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _randint(ctx, low, high)


@_random("aten.randint_like.default", "aten.randint_like.Tensor", "aten.randint_like.generator",
         "aten.randint_like.Tensor_generator")
def randint_like(ctx, x, high, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _randint(ctx, 0, high)


@_random("aten.randint_like.low_dtype", "aten.randint_like.low_generator_dtype")
def randint_like_low(ctx, x, low, high, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                     memory_format=None):
    return _randint(ctx, low, high)


@_random("aten.randperm.default", "aten.randperm.generator")
def randperm(ctx, n, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return jax.random.permutation(ctx.rng(), jnp.arange(n, dtype=jnp.int32))


# -- sampling with a given parameter -----------------------------------------------------------
def _bernoulli_mask(ctx, shape, p):
    u = jax.random.uniform(ctx.rng(), tuple(shape), jnp.float32)
    return u < jnp.asarray(p).astype(jnp.float32)


@_random("aten.bernoulli.default")
def bernoulli(ctx, p, generator=None):
    return _bernoulli_mask(ctx, p.shape, p)


@_random("aten.bernoulli.p")
def bernoulli_p(ctx, x, p=0.5, generator=None):
    return _bernoulli_mask(ctx, x.shape, p)


@_random("aten.bernoulli.Tensor")
def bernoulli_tensor(ctx, x, p, generator=None):
    return _bernoulli_mask(ctx, x.shape, jnp.broadcast_to(p, x.shape))


@_random("aten.native_dropout.default")
def native_dropout(ctx, x, p, train):
    if train is False:
        return x, jnp.ones(x.shape, bool)
    return dropout(ctx, x, p)


def dropout(ctx, x, p):
    """Zero each element with probability p and scale the rest by 1/(1-p); returns (out, keep)."""
    keep = _bernoulli_mask(ctx, x.shape, 1.0 - p)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    out = jnp.where(keep, x.astype(_float(x.dtype)) * scale, 0)
    return out, keep


@_random("aten.normal.Tensor_Tensor")
def normal_tensor_tensor(ctx, mean, std, generator=None):
    return mean + std * _normal(ctx, ctx.out_shape)


@_random("aten.normal.Tensor_float")
def normal_tensor_float(ctx, mean, std=1.0, generator=None):
    return mean + std * _normal(ctx, ctx.out_shape)


@_random("aten.normal.float_Tensor")
def normal_float_tensor(ctx, mean, std, generator=None):
    return mean + std * _normal(ctx, ctx.out_shape)


@_random("aten.normal.float_float")
def normal_float_float(ctx, mean, std, size, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return mean + std * _normal(ctx, ctx.out_shape)


@_random("aten.normal_functional.default")
def normal_functional(ctx, x, mean=0.0, std=1.0, generator=None):
    return mean + std * _normal(ctx, x.shape)


@_random("aten.uniform.default")
def uniform(ctx, x, low=0.0, high=1.0, generator=None):
    return low + (high - low) * _uniform(ctx, x.shape)


@_random("aten.exponential.default")
def exponential(ctx, x, lambd=1.0, generator=None):
    return jax.random.exponential(ctx.rng(), x.shape, _float(ctx.out_dtype)) / lambd


@_random("aten.geometric.default")
def geometric(ctx, x, p, generator=None):
    """Trials until the first success (1, 2, ...): floor(log(U) / log(1 - p)) + 1."""
    u = jax.random.uniform(ctx.rng(), x.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny, maxval=1.0)
    return jnp.floor(jnp.log(u) / math.log1p(-p)) + 1 if p < 1 else jnp.ones(x.shape, jnp.float32)


@_random("aten.log_normal.default")
def log_normal(ctx, x, mean=1.0, std=2.0, generator=None):
    return jnp.exp(mean + std * _normal(ctx, x.shape))


@_random("aten.cauchy.default")
def cauchy(ctx, x, median=0.0, sigma=1.0, generator=None):
    return median + sigma * jax.random.cauchy(ctx.rng(), x.shape, _float(ctx.out_dtype))


@_random("aten.random.from")
def random_from(ctx, x, low, high=None, generator=None):
    """Integers uniform in [low, high); the unbounded form (high=None) is left unsupported."""
    if high is None:
        raise NotImplementedError("random_(from) without `to` (a dtype-bounded range) is not supported")
    return jax.random.randint(ctx.rng(), x.shape, low, high, jnp.int32)


@_random("aten.random.to")
def random_to(ctx, x, high, generator=None):
    return jax.random.randint(ctx.rng(), x.shape, 0, high, jnp.int32)


@_random("aten.multinomial.default")
def multinomial(ctx, probs, num_samples, replacement=False, generator=None):
    """Category indices drawn with probability proportional to `probs` (rows of a 1-D/2-D input)."""
    logits = jnp.log(probs.astype(jnp.float32))
    if replacement:
        shape = (num_samples,) + logits.shape[:-1]
        draws = jax.random.categorical(ctx.rng(), logits, axis=-1, shape=shape)
        return jnp.moveaxis(draws, 0, -1)
    # Without replacement: Gumbel-top-k picks k distinct categories in the sequential-draw law.
    gumbel = jax.random.gumbel(ctx.rng(), logits.shape, jnp.float32)
    _, indices = jax.lax.top_k(logits + gumbel, num_samples)
    return indices


@_random("aten.rrelu_with_noise_functional.default")
def rrelu_with_noise(ctx, x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    if not training:
        slope = (lower + upper) / 2
        return jnp.where(x >= 0, x, x * slope), noise
    dtype = _float(x.dtype)
    a = jax.random.uniform(ctx.rng(), x.shape, dtype, lower, upper)
    neg = x <= 0
    out = jnp.where(neg, x.astype(dtype) * a, x)
    return out, jnp.where(neg, a, jnp.ones_like(a)).astype(noise.dtype)


# Ops that always draw; draws_random (what the interpreter asks) also consults _RANDOM_WHEN.
RANDOM_OPS: frozenset[str] = frozenset(_RANDOM)

# Ops that draw only for some arguments (attention with dropout_p > 0): op -> "does this node draw?"
_RANDOM_WHEN: dict[str, Callable[[Node], bool]] = {}


def random_when(op: str, predicate: Callable[[Node], bool]) -> None:
    """Record that `op` needs a key exactly when `predicate(node)` holds (its lowering takes ctx)."""
    _RANDOM_WHEN[op] = predicate


def draws_random(node: Node) -> bool:
    """Whether running `node` draws from the model's key."""
    predicate = _RANDOM_WHEN.get(node.op)
    return node.op in RANDOM_OPS or (predicate is not None and predicate(node))
