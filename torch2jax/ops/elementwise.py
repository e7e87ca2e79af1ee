"""Elementwise ops: arithmetic, comparisons, math functions, bitwise ops, casts.

Result dtypes follow torch's promotion rules. Lowerings that promote take the result dtype torch
recorded for the node (`ctx.out_dtype`) and compute in it, so 0-dim tensors and python scalars
promote as in torch, not as in JAX. Like torch on CPU, half and bfloat16 math is computed in
float32 and rounded once (the interpreter casts every result to the node's recorded dtype).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ir.dtypes import is_bool, is_floating, is_integer
from .opmath import LOW_PRECISION, cast, computed_in, opmath, to_float
from .registry import lowers


def _dtype(x):
    return jnp.result_type(x)


# --- arithmetic -----------------------------------------------------------------------------


def _alpha(y, alpha):
    if alpha is None or (alpha == 1 and not isinstance(alpha, bool)) or alpha is True:
        return y
    return y * jnp.asarray(alpha, y.dtype)


@lowers("aten.add.Tensor", "aten.add.Scalar", ctx=True)
def add(ctx, x, y, alpha=1):
    x, y = computed_in(ctx, x, y)
    if is_bool(x.dtype):
        return jnp.logical_or(x, jnp.logical_and(y, bool(alpha)))
    return x + _alpha(y, alpha)


@lowers("aten.sub.Tensor", "aten.sub.Scalar", ctx=True)
def sub(ctx, x, y, alpha=1):
    x, y = computed_in(ctx, x, y)
    return x - _alpha(y, alpha)


@lowers("aten.rsub.Tensor", "aten.rsub.Scalar", ctx=True)
def rsub(ctx, x, y, alpha=1):
    x, y = computed_in(ctx, x, y)
    return y - _alpha(x, alpha)


@lowers("aten.mul.Tensor", "aten.mul.Scalar", ctx=True)
def mul(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    if is_bool(x.dtype):
        return jnp.logical_and(x, y)
    return x * y


@lowers("aten.div.Tensor", "aten.div.Scalar", ctx=True)
def div(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return x / y


def _floor_div_float(a, b):
    """torch's floor division of floats: Python's algorithm (via fmod), a / b when b == 0."""
    mod = lax.rem(a, b)
    quotient = (a - mod) / b
    quotient = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), quotient - 1, quotient)
    floored = jnp.floor(quotient)
    floored = jnp.where(quotient - floored > 0.5, floored + 1, floored)
    floored = jnp.where(quotient == 0, jnp.copysign(jnp.zeros_like(quotient), a / b), floored)
    return jnp.where(b == 0, a / b, floored)


def _div_rounded(x, y, rounding_mode, out_dtype=None):
    if rounding_mode is None:
        return x / y
    if is_floating(x.dtype):
        if rounding_mode == "trunc":
            quotient = x / y
            if out_dtype is not None and np.dtype(out_dtype) in LOW_PRECISION:
                quotient = quotient.astype(out_dtype)  # torch rounds the quotient to half/bfloat16 first
            return jnp.trunc(quotient)
        return _floor_div_float(*jnp.broadcast_arrays(x, y))
    if is_bool(x.dtype):
        x, y = x.astype(jnp.int32), y.astype(jnp.int32)
    if rounding_mode == "trunc":
        return lax.div(*jnp.broadcast_arrays(x, y))
    return jnp.floor_divide(x, y)


@lowers("aten.div.Tensor_mode", "aten.div.Scalar_mode", ctx=True)
def div_mode(ctx, x, y, rounding_mode=None):
    x, y = computed_in(ctx, x, y)
    return _div_rounded(x, y, rounding_mode, ctx.out_dtype)


@lowers("aten.floor_divide.default", "aten.floor_divide.Scalar", ctx=True)
def floor_divide(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return _div_rounded(x, y, "floor")


@lowers("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder.Scalar_Tensor", ctx=True)
def remainder(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.remainder(x, y)  # the sign of the divisor, as torch


@lowers("aten.fmod.Tensor", "aten.fmod.Scalar", ctx=True)
def fmod(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return lax.rem(*jnp.broadcast_arrays(x, y))  # the sign of the dividend, as C fmod


@lowers("aten.neg.default")
def neg(x):
    return jnp.logical_not(x) if is_bool(_dtype(x)) else jnp.negative(x)


@lowers("aten.abs.default")
def abs_(x):
    return x if is_bool(_dtype(x)) else jnp.abs(x)


def _int_pow(base, exp):
    """Integer powers as torch: negative exponents give 0, except for bases 1 and -1."""
    base, exp = jnp.broadcast_arrays(base, exp)
    positive = jnp.power(base, jnp.maximum(exp, 0))
    odd = (exp % 2) != 0
    negative = jnp.where(base == 1, 1, jnp.where(base == -1, jnp.where(odd, -1, 1), 0)).astype(base.dtype)
    return jnp.where(exp < 0, negative, positive)


_SPECIAL_POWERS = {
    2: lambda x: x * x,
    3: lambda x: x * x * x,
    0.5: jnp.sqrt,
    -0.5: lax.rsqrt,
    -1: lambda x: 1 / x,
    -2: lambda x: 1 / (x * x),
}


@lowers("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar", ctx=True)
def pow_(ctx, x, y):
    dtype = opmath(ctx.out_dtype)
    if isinstance(y, (int, float)) and not isinstance(y, bool) and is_floating(dtype) and y in _SPECIAL_POWERS:
        return _SPECIAL_POWERS[y](jnp.asarray(x, dtype))  # the exact shortcuts torch takes
    x, y = cast(dtype, x, y)
    if is_bool(dtype):
        return jnp.logical_or(x, jnp.logical_not(y))
    if is_integer(dtype):
        return _int_pow(x, y)
    return jnp.power(x, y)


@lowers("aten.float_power.Tensor_Tensor", "aten.float_power.Tensor_Scalar", "aten.float_power.Scalar", ctx=True)
def float_power(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.power(x, y)


@lowers("aten.reciprocal.default")
def reciprocal(x):
    x = to_float(x)
    return 1 / x


@lowers("aten.square.default")
def square(x):
    if is_bool(_dtype(x)):
        return x
    x = to_float(x) if not is_integer(_dtype(x)) else x
    return x * x


# --- unary math -----------------------------------------------------------------------------


def _float_unary(name: str, fn) -> None:
    def lowering(x):
        return fn(to_float(x))

    lowering.__name__ = name
    lowers(f"aten.{name}.default")(lowering)


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
    "lgamma": jax.scipy.special.gammaln,
    "i0": jax.scipy.special.i0,
    "sinc": jnp.sinc,
}.items():
    _float_unary(_name, _fn)


def _keeps_integers(fn):
    """Rounding ops return integer and bool tensors unchanged."""

    def lowering(x):
        if not is_floating(_dtype(x)):
            return x
        return fn(to_float(x))

    return lowering


lowers("aten.ceil.default")(_keeps_integers(jnp.ceil))
lowers("aten.floor.default")(_keeps_integers(jnp.floor))
lowers("aten.trunc.default")(_keeps_integers(jnp.trunc))
lowers("aten.round.default")(_keeps_integers(jnp.round))  # half to even, as torch


@lowers("aten.round.decimals")
def round_decimals(x, decimals=0):
    if not is_floating(_dtype(x)):
        return x
    x = to_float(x)
    if decimals == 0:
        return jnp.round(x)
    if decimals > 0:
        scale = jnp.asarray(10.0**decimals, x.dtype)
        return jnp.round(x * scale) / scale
    scale = jnp.asarray(10.0 ** (-decimals), x.dtype)
    return jnp.round(x / scale) * scale


@lowers("aten.frac.default")
def frac(x):
    x = to_float(x)
    return x - jnp.trunc(x)


@lowers("aten.sign.default", "aten.sgn.default")
def sign(x):
    """Not jnp.sign: torch's sign(nan) is 0."""
    if is_bool(_dtype(x)):
        return x
    zero = jnp.zeros((), _dtype(x))
    return (x > zero).astype(_dtype(x)) - (x < zero).astype(_dtype(x))


@lowers("aten.signbit.default")
def signbit(x):
    if is_bool(_dtype(x)):
        return jnp.zeros_like(x)
    return jnp.signbit(x) if is_floating(_dtype(x)) else x < 0


def _classify(name: str, fn, integers_are: bool) -> None:
    """`aten.<name>` of a floating value class (nan, inf, ...); integer and bool tensors are all `integers_are`."""

    def lowering(x):
        return fn(x) if is_floating(_dtype(x)) else (jnp.ones if integers_are else jnp.zeros)(jnp.shape(x), bool)

    lowering.__name__ = name
    lowers(f"aten.{name}.default")(lowering)


for _name, _fn, _integers_are in (("isnan", jnp.isnan, False), ("isinf", jnp.isinf, False),
                                  ("isfinite", jnp.isfinite, True), ("isposinf", jnp.isposinf, False),
                                  ("isneginf", jnp.isneginf, False)):
    _classify(_name, _fn, _integers_are)


@lowers("aten.nan_to_num.default")
def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    dtype = _dtype(x)
    if not is_floating(dtype):
        return x
    info = jnp.finfo(dtype)
    nan = 0.0 if nan is None else nan
    posinf = info.max if posinf is None else posinf
    neginf = info.min if neginf is None else neginf
    x = jnp.where(jnp.isnan(x), jnp.asarray(nan, dtype), x)
    x = jnp.where(jnp.isposinf(x), jnp.asarray(posinf, dtype), x)
    return jnp.where(jnp.isneginf(x), jnp.asarray(neginf, dtype), x)


# --- binary math ----------------------------------------------------------------------------


@lowers("aten.atan2.default", "aten.atan2.out", ctx=True)
def atan2(ctx, x, y, out=None):
    x, y = computed_in(ctx, x, y)
    return jnp.arctan2(x, y)


@lowers("aten.hypot.default", ctx=True)
def hypot(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.hypot(x, y)


@lowers("aten.copysign.Tensor", "aten.copysign.Scalar", ctx=True)
def copysign(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.copysign(x, y)


@lowers("aten.nextafter.default")
def nextafter(x, y):
    return jnp.nextafter(x, y)


@lowers("aten.logaddexp.default", ctx=True)
def logaddexp(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.logaddexp(x, y)


@lowers("aten.logaddexp2.default", ctx=True)
def logaddexp2(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.logaddexp2(x, y)


@lowers("aten.xlogy.Tensor", "aten.xlogy.Scalar_Self", "aten.xlogy.Scalar_Other", ctx=True)
def xlogy(ctx, x, y):
    """0 where x == 0, unless y is nan (torch propagates nan from y)."""
    x, y = computed_in(ctx, x, y)
    out = jnp.where(x == 0, jnp.zeros((), x.dtype), x * jnp.log(y))
    return jnp.where(jnp.isnan(y), y, out)


@lowers("aten.special_xlog1py.default", "aten.special_xlog1py.self_scalar", "aten.special_xlog1py.other_scalar", ctx=True)
def xlog1py(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    out = jnp.where(x == 0, jnp.zeros((), x.dtype), x * jnp.log1p(y))
    return jnp.where(jnp.isnan(y), y, out)


@lowers("aten.maximum.default", ctx=True)
def maximum(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.maximum(x, y)  # propagates NaN, as torch


@lowers("aten.minimum.default", ctx=True)
def minimum(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.minimum(x, y)


@lowers("aten.fmax.default", ctx=True)
def fmax(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.fmax(x, y) if is_floating(x.dtype) else jnp.maximum(x, y)


@lowers("aten.fmin.default", ctx=True)
def fmin(ctx, x, y):
    x, y = computed_in(ctx, x, y)
    return jnp.fmin(x, y) if is_floating(x.dtype) else jnp.minimum(x, y)


@lowers("aten.clamp.default", "aten.clamp.Tensor", ctx=True)
def clamp(ctx, x, min=None, max=None):
    """max(x, min) then min(_, max): NaN anywhere gives NaN, and min > max gives max, as torch."""
    x, lo, hi = computed_in(ctx, x, min, max)
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lowers("aten.clamp_min.default", "aten.clamp_min.Tensor", ctx=True)
def clamp_min(ctx, x, min):
    return clamp(ctx, x, min, None)


@lowers("aten.clamp_max.default", "aten.clamp_max.Tensor", ctx=True)
def clamp_max(ctx, x, max):
    return clamp(ctx, x, None, max)


@lowers("aten.where.self", ctx=True)
def where(ctx, cond, x, y):
    x, y = cast(ctx.out_dtype, x, y)
    return jnp.where(cond, x, y)


@lowers("aten.lerp.Scalar", "aten.lerp.Tensor", ctx=True)
def lerp(ctx, start, end, weight):
    """torch's two-sided formula, exact at weight 0 and 1."""
    start, end, weight = computed_in(ctx, start, end, weight)
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


@lowers("prims.fma.default", ctx=True)
def fma(ctx, a, b, c):
    """a * b + c rounded once (torch's fused multiply-add prim, which dynamo writes for `addcmul_`,
    `addcdiv_` and `add_(alpha=tensor)`, as in torch.optim's steps; inductor computes it with fma).

    float32 is computed exactly in float64 (the product of two float32 is exact there) and rounded to
    odd, which makes the final rounding to float32 a single correct one; without x64, and for float64,
    by Dekker's exact product and Boldo and Melquiond's emulated fma (exact unless the product
    underflows). Half and bfloat16 compute a float32 fma and
    round once more, as torch's kernels compute them in float32. Integers, bool and complex: a * b + c.
    """
    a, b, c = computed_in(ctx, a, b, c)
    dtype = a.dtype
    if is_bool(dtype):
        return (a & b) | c
    if not is_floating(dtype) or jnp.iscomplexobj(a):
        return a * b + c
    naive = a * b + c
    if dtype == np.dtype(jnp.float32) and jax.dtypes.canonicalize_dtype(jnp.float64) == np.dtype(jnp.float64):
        wide = [v.astype(jnp.float64) for v in (a, b, c)]
        total, error = _two_sum(wide[0] * wide[1], wide[2])  # the product is exact in float64
        result = _round_to_odd(total, error).astype(dtype)
    else:
        result = _emulated_fma(a, b, c, naive)
        # a product beyond the largest float that c brings back: a quarter of everything, then times 4
        finite = jnp.isfinite(a) & jnp.isfinite(b) & jnp.isfinite(c)
        quarter = _emulated_fma(a * 0.25, b, c * 0.25, a * 0.25 * b + c * 0.25) * 4
        result = jnp.where(finite & jnp.isinf(a * b), quarter, result)
        result = jnp.where(jnp.isinf(c) & jnp.isfinite(a) & jnp.isfinite(b), c, result)  # not inf - inf
    return jnp.where(result == 0, naive, result)  # an exact zero: the plain sum has IEEE's sign of zero


def _emulated_fma(a, b, c, naive):
    """Boldo and Melquiond's fma from an exact product and sum: RN(top + RO(tail)); `naive` where a term
    is infinite or NaN (those are IEEE's results there, but for a product that overflows)."""
    high, low = _two_product(a, b)
    top, rest = _two_sum(c, high)
    tail, tail_error = _two_sum(rest, low)
    result = top + _round_to_odd(tail, tail_error)
    return jnp.where(jnp.isfinite(high) & jnp.isfinite(top), result, naive)


def _two_sum(a, b):
    """(s, e) with s = a + b rounded and s + e == a + b exactly (Knuth)."""
    s = a + b
    b_part = s - a
    return s, (a - (s - b_part)) + (b - b_part)


def _two_product(a, b):
    """(p, e) with p = a * b rounded and p + e == a * b exactly (Dekker, Veltkamp's split; an operand
    so large that the split would overflow is split scaled down by a power of two, which is exact)."""
    info = jnp.finfo(a.dtype)
    bits = (info.nmant + 2) // 2
    split = float(2**bits + 1)
    scale = float(2 ** (bits + 1))
    largest = float(info.max) / split

    def halves(x):
        big = jnp.abs(x) > largest
        x = jnp.where(big, x / scale, x)
        scaled = x * split
        high = scaled - (scaled - x)
        back = jnp.where(big, scale, 1.0).astype(x.dtype)
        return high * back, (x - high) * back

    (a_high, a_low), (b_high, b_low) = halves(a), halves(b)
    p = a * b
    return p, ((a_high * b_high - p) + a_high * b_low + a_low * b_high) + a_low * b_low


def _round_to_odd(value, error):
    """`value + error` (value the nearest float to it) rounded to odd: kept where exact or where its
    last mantissa bit is 1, else the neighbour towards the error, whose last bit is 1."""
    bits = lax.bitcast_convert_type(value, jnp.int64 if value.dtype == np.dtype(jnp.float64) else jnp.int32)
    move = (error != 0) & ((bits & 1) == 0) & jnp.isfinite(value)
    toward = jnp.where(error > 0, jnp.inf, -jnp.inf).astype(value.dtype)
    return jnp.where(move, jnp.nextafter(value, toward), value)


@lowers("aten.heaviside.default", ctx=True)
def heaviside(ctx, x, values):
    x, values = computed_in(ctx, x, values)
    zero = jnp.zeros((), x.dtype)
    return jnp.where(x == zero, values, (x > zero).astype(x.dtype))


# --- comparisons and logic ------------------------------------------------------------------


def _compare(name: str, fn) -> None:
    def lowering(x, y):
        return fn(x, y)

    lowering.__name__ = name
    lowers(f"aten.{name}.Tensor", f"aten.{name}.Scalar")(lowering)


for _name, _fn in {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}.items():
    _compare(_name, _fn)


@lowers("aten.logical_not.default")
def logical_not(x):
    return jnp.logical_not(x)


@lowers("aten.logical_and.default")
def logical_and(x, y):
    return jnp.logical_and(x, y)


@lowers("aten.logical_or.default")
def logical_or(x, y):
    return jnp.logical_or(x, y)


@lowers("aten.logical_xor.default")
def logical_xor(x, y):
    return jnp.logical_xor(x, y)


@lowers("aten.bitwise_not.default")
def bitwise_not(x):
    return jnp.invert(x)


@lowers("aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar", "aten.bitwise_and.Scalar_Tensor", ctx=True)
def bitwise_and(ctx, x, y):
    x, y = cast(ctx.out_dtype, x, y)
    return jnp.bitwise_and(x, y)


@lowers("aten.bitwise_or.Tensor", "aten.bitwise_or.Scalar", "aten.bitwise_or.Scalar_Tensor", ctx=True)
def bitwise_or(ctx, x, y):
    x, y = cast(ctx.out_dtype, x, y)
    return jnp.bitwise_or(x, y)


@lowers("aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar", "aten.bitwise_xor.Scalar_Tensor", ctx=True)
def bitwise_xor(ctx, x, y):
    x, y = cast(ctx.out_dtype, x, y)
    return jnp.bitwise_xor(x, y)


@lowers(
    "aten.bitwise_left_shift.Tensor",
    "aten.bitwise_left_shift.Tensor_Scalar",
    "aten.bitwise_left_shift.Scalar_Tensor",
    "aten.__lshift__.Tensor",
    "aten.__lshift__.Scalar",
    ctx=True,
)
def bitwise_left_shift(ctx, x, y):
    """Shifts by a negative amount or by the bit width or more give 0, as torch."""
    x, y = jnp.broadcast_arrays(*cast(ctx.out_dtype, x, y))
    bits = jnp.iinfo(x.dtype).bits
    return jnp.where((y < 0) | (y >= bits), jnp.zeros_like(x), lax.shift_left(x, y))


@lowers(
    "aten.bitwise_right_shift.Tensor",
    "aten.bitwise_right_shift.Tensor_Scalar",
    "aten.bitwise_right_shift.Scalar_Tensor",
    "aten.__rshift__.Tensor",
    "aten.__rshift__.Scalar",
    ctx=True,
)
def bitwise_right_shift(ctx, x, y):
    """Arithmetic shift; out-of-range amounts fill with the sign bit, as torch."""
    x, y = jnp.broadcast_arrays(*cast(ctx.out_dtype, x, y))
    bits = jnp.iinfo(x.dtype).bits
    shift = jnp.where((y < 0) | (y >= bits), jnp.asarray(bits - 1, y.dtype), y)
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        return jnp.where((y < 0) | (y >= bits), jnp.zeros_like(x), lax.shift_right_logical(x, y))
    return lax.shift_right_arithmetic(x, shift)


@lowers("aten.gcd.default", ctx=True)
def gcd(ctx, x, y):
    x, y = cast(ctx.out_dtype, x, y)
    return jnp.gcd(x, y)


@lowers("aten.lcm.default", ctx=True)
def lcm(ctx, x, y):
    x, y = cast(ctx.out_dtype, x, y)
    return jnp.lcm(x, y)


# --- casts and copies -----------------------------------------------------------------------


@lowers("prims.convert_element_type.default")
def convert(x, dtype):
    """astype with torch's float -> narrow integer conversion (through int32, wrapping)."""
    x = jnp.asarray(x)
    dtype = np.dtype(dtype)
    if is_floating(x.dtype) and is_integer(dtype) and dtype.itemsize < 4:
        return x.astype(jnp.int32).astype(dtype)
    return x.astype(dtype)


@lowers("aten._to_copy.default")
def to_copy(x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else convert(x, dtype)


@lowers("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default", "aten.detach.default")
def identity(x, memory_format=None):
    return x


@lowers("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(_dtype(x)), x)


@lowers("aten.frexp.Tensor")
def frexp(x):
    mantissa, exponent = jnp.frexp(to_float(x))
    return mantissa, exponent.astype(jnp.int32)


@lowers("aten.ldexp.Tensor", ctx=True)
def ldexp(ctx, x, other):
    x, other = computed_in(ctx, x, other)
    return x * jnp.exp2(other)


@lowers("aten.angle.default")
def angle(x):
    """Real inputs: pi for negatives, 0 otherwise, NaN kept."""
    x = to_float(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.asarray(np.pi, x.dtype), jnp.zeros((), x.dtype)))
