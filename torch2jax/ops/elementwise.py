"""Elementwise ops: arithmetic, comparisons, math functions, activations, casts.

Result dtypes follow torch's promotion rules; the interpreter also casts each result to the
dtype torch recorded for the node, so a python-scalar operand never widens a result.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..dtypes import is_bool, is_floating, is_integer
from ..registry import lowers


def _scaled(y, alpha):
    return y if alpha == 1 else y * alpha


@lowers("aten.add.Tensor", "aten.add.Scalar")
def add(x, y, alpha=1):
    return jnp.add(x, _scaled(y, alpha))


@lowers("aten.sub.Tensor", "aten.sub.Scalar")
def sub(x, y, alpha=1):
    return jnp.subtract(x, _scaled(y, alpha))


@lowers("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(x, y, alpha=1):
    return jnp.subtract(y, _scaled(x, alpha))


@lowers("aten.mul.Tensor", "aten.mul.Scalar")
def mul(x, y):
    if is_bool(jnp.result_type(x)) and is_bool(jnp.result_type(y)):
        return jnp.logical_and(x, y)
    return jnp.multiply(x, y)


@lowers("aten.div.Tensor", "aten.div.Scalar")
def div(x, y):
    return jnp.true_divide(x, y)


@lowers("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def div_mode(x, y, rounding_mode=None):
    if rounding_mode is None:
        return jnp.true_divide(x, y)
    if is_integer(jnp.result_type(x, y)) or is_bool(jnp.result_type(x, y)):
        x, y = jnp.asarray(x), jnp.asarray(y)
        dtype = jnp.result_type(x, y)
        x, y = x.astype(dtype), y.astype(dtype)
        return lax.div(*jnp.broadcast_arrays(x, y)) if rounding_mode == "trunc" else jnp.floor_divide(x, y)
    quotient = jnp.true_divide(x, y)
    return jnp.trunc(quotient) if rounding_mode == "trunc" else jnp.floor(quotient)


@lowers("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(x, y):
    return div_mode(x, y, "floor")


@lowers("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder.Scalar_Tensor")
def remainder(x, y):
    return jnp.remainder(x, y)  # sign of the divisor, as torch


@lowers("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(x, y):
    return jnp.fmod(x, y)  # sign of the dividend, as torch


@lowers("aten.neg.default")
def neg(x):
    return jnp.negative(x)


@lowers("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def pow_(x, y):
    if isinstance(y, int) and not isinstance(y, bool) and y == 2:
        return x * x
    return jnp.power(x, y)


@lowers("aten.abs.default")
def abs_(x):
    return jnp.abs(x)


def _unary(op: str, fn) -> None:
    lowers(f"aten.{op}.default")(fn)


for _name, _fn in {
    "exp": jnp.exp,
    "exp2": jnp.exp2,
    "expm1": jnp.expm1,
    "log": jnp.log,
    "log2": jnp.log2,
    "log10": jnp.log10,
    "log1p": jnp.log1p,
    "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "asin": jnp.arcsin,
    "acos": jnp.arccos,
    "atan": jnp.arctan,
    "sinh": jnp.sinh,
    "cosh": jnp.cosh,
    "tanh": jnp.tanh,
    "asinh": jnp.arcsinh,
    "acosh": jnp.arccosh,
    "atanh": jnp.arctanh,
    "erf": jax.scipy.special.erf,
    "erfc": jax.scipy.special.erfc,
    "erfinv": jax.scipy.special.erfinv,
    "sigmoid": jax.nn.sigmoid,
    "reciprocal": jnp.reciprocal,
    "sign": jnp.sign,
    "ceil": jnp.ceil,
    "floor": jnp.floor,
    "trunc": jnp.trunc,
    "round": jnp.round,
    "isnan": jnp.isnan,
    "isinf": jnp.isinf,
    "logical_not": jnp.logical_not,
    "bitwise_not": jnp.invert,
}.items():
    _unary(_name, _fn)


def _float_input(x):
    """Math functions of integer tensors compute in the default float type, as torch."""
    return x.astype(jnp.float32) if not is_floating(x.dtype) and not jnp.iscomplexobj(x) else x


@lowers("aten.relu.default")
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))


@lowers("aten.gelu.default")
def gelu(x, approximate="none"):
    return jax.nn.gelu(x, approximate=approximate == "tanh")


@lowers("aten.silu.default")
def silu(x):
    return jax.nn.silu(x)


@lowers("aten.hardtanh.default")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return jnp.clip(x, min_val, max_val)


@lowers("aten.leaky_relu.default")
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lowers("aten.elu.default")
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    return scale * jnp.where(x > 0, x, alpha * jnp.expm1(x * input_scale))


@lowers("aten.atan2.default")
def atan2(x, y):
    return jnp.arctan2(_float_input(x), _float_input(y))


@lowers("aten.maximum.default")
def maximum(x, y):
    return jnp.maximum(x, y)  # propagates NaN, as torch


@lowers("aten.minimum.default")
def minimum(x, y):
    return jnp.minimum(x, y)


@lowers("aten.clamp.default", "aten.clamp.Tensor")
def clamp(x, min=None, max=None):
    out = x
    if min is not None:
        out = jnp.maximum(out, min)
    if max is not None:
        out = jnp.minimum(out, max)
    return out


@lowers("aten.where.self")
def where(cond, x, y):
    return jnp.where(cond, x, y)


@lowers("aten.eq.Tensor", "aten.eq.Scalar")
def eq(x, y):
    return jnp.equal(x, y)


@lowers("aten.ne.Tensor", "aten.ne.Scalar")
def ne(x, y):
    return jnp.not_equal(x, y)


@lowers("aten.lt.Tensor", "aten.lt.Scalar")
def lt(x, y):
    return jnp.less(x, y)


@lowers("aten.le.Tensor", "aten.le.Scalar")
def le(x, y):
    return jnp.less_equal(x, y)


@lowers("aten.gt.Tensor", "aten.gt.Scalar")
def gt(x, y):
    return jnp.greater(x, y)


@lowers("aten.ge.Tensor", "aten.ge.Scalar")
def ge(x, y):
    return jnp.greater_equal(x, y)


@lowers("aten.logical_and.default")
def logical_and(x, y):
    return jnp.logical_and(x, y)


@lowers("aten.logical_or.default")
def logical_or(x, y):
    return jnp.logical_or(x, y)


@lowers("aten.logical_xor.default")
def logical_xor(x, y):
    return jnp.logical_xor(x, y)


@lowers("aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar")
def bitwise_and(x, y):
    return jnp.bitwise_and(x, y)


@lowers("aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar")
def bitwise_or(x, y):
    return jnp.bitwise_or(x, y)


@lowers("aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar")
def bitwise_xor(x, y):
    return jnp.bitwise_xor(x, y)


@lowers("aten._to_copy.default")
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else x.astype(dtype)


@lowers("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default", "aten.detach.default")
def identity(x, memory_format=None):
    return x


@lowers("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value, dtype=x.dtype), x)
