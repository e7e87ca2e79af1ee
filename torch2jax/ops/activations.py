"""Activation functions that reach the interpreter whole (most others decompose into core ops).

Formulas follow torch's CPU kernels (which branch is taken for NaN, where the scale is applied);
half and bfloat16 inputs are computed in float32 and rounded once, as torch does.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ..ir.dtypes import is_floating
from .opmath import to_float
from .registry import lowers


def _compute(x):
    x = jnp.asarray(x)
    return to_float(x) if is_floating(x.dtype) else x


@lowers("aten.relu.default")
def relu(x):
    x = jnp.asarray(x)
    return jnp.maximum(x, jnp.zeros((), x.dtype))  # NaN stays NaN


@lowers("aten.gelu.default")
def gelu(x, approximate="none"):
    x = _compute(x)
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return x * 0.5 * (1 + lax.erf(x * (1 / math.sqrt(2.0))))


@lowers("aten.silu.default")
def silu(x):
    x = _compute(x)
    return x / (1 + jnp.exp(-x))


@lowers("aten.hardtanh.default")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    x = _compute(x)
    lo, hi = jnp.asarray(min_val, x.dtype), jnp.asarray(max_val, x.dtype)
    return jnp.minimum(jnp.maximum(x, lo), hi)


@lowers("aten.leaky_relu.default")
def leaky_relu(x, negative_slope=0.01):
    x = _compute(x)
    return jnp.where(x > 0, x, x * negative_slope)


@lowers("aten.elu.default")
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """torch: x <= 0 ? expm1(x * input_scale) * (alpha * scale) : x * scale."""
    x = _compute(x)
    negative = jnp.expm1(x * input_scale) * (alpha * scale)
    return jnp.where(x <= 0, negative, x * scale)
