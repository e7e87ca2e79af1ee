"""Reductions: sum/mean/var/max/min/argmax..., softmax, cumulative ops.

Torch conventions kept here:
- `dim=None` or `[]` means every dim (except `any.dims`/`all.dims`, where `[]` reduces nothing);
  a 0-d tensor accepts dim 0 / -1 and is returned as it is.
- bfloat16/float16 inputs accumulate in float32 (torch's CPU acc type) and the interpreter casts the
  result back to the dtype torch recorded.
- Integer and bool sums/products/cumsums are int64 in torch (int32 here without x64).
- max/min/argmax/argmin propagate NaN (the first NaN's index); ties give the first index.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import LoweringError
from ..ir.dtypes import is_bool, is_floating, is_integer
from .opmath import LOW_PRECISION
from .registry import lowers


def _axes(x, dim, empty_means_all=True) -> tuple:
    """Normalized, sorted, non-negative axes; torch allows dim 0/-1 on a 0-d tensor (a no-op)."""
    if dim is None:
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    dim = list(dim)
    if not dim:
        return tuple(range(x.ndim)) if empty_means_all else ()
    if x.ndim == 0:
        return ()
    return tuple(sorted({d % x.ndim for d in dim}))


def _acc(x):
    """Upcast reduced-precision floats to float32 for accumulation, as torch does on CPU."""
    return x.astype(jnp.float32) if x.dtype in LOW_PRECISION else x


def _int_acc_dtype():
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32


def _sum_input(x, dtype):
    """The input cast the way torch's sum/prod/cumsum see it: `dtype` first, ints widened to int64."""
    if dtype is not None:
        return _acc(x.astype(dtype))
    if is_integer(x.dtype) or is_bool(x.dtype):
        return x.astype(_int_acc_dtype())
    return _acc(x)


def _count(x, axes) -> int:
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


# -- sum / mean / prod -------------------------------------------------------------------------
@lowers("aten.sum.dim_IntList")
def sum_dim(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(_sum_input(x, dtype), axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.sum.default")
def sum_all(x, dtype=None):
    return jnp.sum(_sum_input(x, dtype))


@lowers("aten.mean.dim")
def mean_dim(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.astype(dtype)
    axes = _axes(x, dim)
    total = jnp.sum(_acc(x), axis=axes, keepdims=keepdim)
    return total / _count(x, axes)


@lowers("aten.mean.default")
def mean_all(x, dtype=None):
    return mean_dim(x, None, False, dtype)


@lowers("aten.prod.dim_int")
def prod_dim(x, dim, keepdim=False, dtype=None):
    return jnp.prod(_sum_input(x, dtype), axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.prod.default")
def prod_all(x, dtype=None):
    return jnp.prod(_sum_input(x, dtype))


# -- var / std ---------------------------------------------------------------------------------
def _var(x, axes, correction, keepdim):
    xf = _acc(x)
    if not is_floating(xf.dtype) and not jnp.issubdtype(xf.dtype, jnp.complexfloating):
        xf = xf.astype(jnp.float32)
    n = _count(x, axes)
    mean = jnp.sum(xf, axis=axes, keepdims=True) / max(n, 1)
    dev = xf - mean
    sq = jnp.sum(jnp.real(dev * jnp.conj(dev)), axis=axes, keepdims=keepdim)
    denom = max(0.0, n - correction)  # torch divides by max(0, N - correction): 0 gives inf/nan
    return sq / jnp.asarray(denom, sq.dtype)


@lowers("aten.var.correction")
def var_correction(x, dim=None, correction=None, keepdim=False):
    return _var(x, _axes(x, dim), 1 if correction is None else correction, keepdim)


@lowers("aten.var.dim")
def var_dim(x, dim=None, unbiased=True, keepdim=False):
    return _var(x, _axes(x, dim), 1 if unbiased else 0, keepdim)


@lowers("aten.var.default")
def var_all(x, unbiased=True):
    return _var(x, _axes(x, None), 1 if unbiased else 0, False)


@lowers("aten.std.correction")
def std_correction(x, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(var_correction(x, dim, correction, keepdim))


@lowers("aten.std.dim")
def std_dim(x, dim=None, unbiased=True, keepdim=False):
    return jnp.sqrt(var_dim(x, dim, unbiased, keepdim))


@lowers("aten.std.default")
def std_all(x, unbiased=True):
    return jnp.sqrt(var_all(x, unbiased))


@lowers("aten.var_mean.correction")
def var_mean_correction(x, dim=None, correction=None, keepdim=False):
    return var_correction(x, dim, correction, keepdim), mean_dim(x, dim, keepdim)


@lowers("aten.std_mean.correction")
def std_mean_correction(x, dim=None, correction=None, keepdim=False):
    return std_correction(x, dim, correction, keepdim), mean_dim(x, dim, keepdim)


# -- max / min / argmax / argmin -----------------------------------------------------------------
def _cmp_view(x):
    """Bool compares as int (jnp.argmax handles floats' NaN as the largest and smallest already)."""
    return x.astype(jnp.int32) if is_bool(x.dtype) else x


@lowers("aten.amax.default")
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.amin.default")
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.aminmax.default")
def aminmax(x, dim=None, keepdim=False):
    axes = _axes(x, dim)
    return jnp.min(x, axis=axes, keepdims=keepdim), jnp.max(x, axis=axes, keepdims=keepdim)


def _arg(fn, x, dim, keepdim):
    x = _cmp_view(x)
    if dim is None:
        out = fn(x.reshape(-1))
        return out.reshape((1,) * x.ndim) if keepdim else out
    if x.ndim == 0:
        return jnp.zeros((), jnp.int32)
    return fn(x, axis=dim % x.ndim, keepdims=keepdim)


@lowers("aten.max.dim")
def max_dim(x, dim, keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim), _arg(jnp.argmax, x, dim, keepdim)


@lowers("aten.min.dim")
def min_dim(x, dim, keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim), _arg(jnp.argmin, x, dim, keepdim)


@lowers("aten.max.default")
def max_all(x):
    return jnp.max(x)


@lowers("aten.min.default")
def min_all(x):
    return jnp.min(x)


@lowers("aten.argmax.default")
def argmax(x, dim=None, keepdim=False):
    return _arg(jnp.argmax, x, dim, keepdim)


@lowers("aten.argmin.default")
def argmin(x, dim=None, keepdim=False):
    return _arg(jnp.argmin, x, dim, keepdim)


# -- any / all ---------------------------------------------------------------------------------
def _any_or_all(name: str, fn, *also: str) -> None:
    """`aten.<name>` over everything, one dim or several dims (`also`: more overloads of the whole-tensor form)."""

    @lowers(f"aten.{name}.default", *also)
    def whole(x):
        return fn(x)

    @lowers(f"aten.{name}.dim")
    def over_dim(x, dim, keepdim=False):
        return fn(x, axis=_axes(x, dim), keepdims=keepdim)

    @lowers(f"aten.{name}.dims")
    def over_dims(x, dim=None, keepdim=False):
        return fn(x, axis=_axes(x, dim, empty_means_all=False), keepdims=keepdim)


_any_or_all("any", jnp.any)
# `_is_all_true` is what torch.export leaves of `torch._check(t.all())`-style checks on a bool tensor
_any_or_all("all", jnp.all, "aten._is_all_true.default")


@lowers("aten.count_nonzero.dim_IntList")
def count_nonzero_dims(x, dim):
    return jnp.sum(x != 0, axis=_axes(x, dim), dtype=_int_acc_dtype())


@lowers("aten.count_nonzero.default")
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=_axes(x, dim), dtype=_int_acc_dtype())


@lowers("aten.hash_tensor.default")
def hash_tensor(x, dim=(), keepdim=False, mode=0):
    """torch's xor hash: each element's 64-bit pattern (floats as float64, integers sign-extended to
    int64), xor-reduced over `dim` (`[]` means every dim). The result is uint64, which JAX holds only
    with x64 enabled: without it no 32-bit value could equal torch's, so we refuse rather than truncate."""
    if mode != 0:
        raise LoweringError(f"hash_tensor: only mode=0 (xor of the 64-bit patterns) exists, got mode={mode}")
    if not jax.config.jax_enable_x64:
        raise LoweringError(
            "hash_tensor returns uint64 bit patterns, which JAX represents only with 64-bit types enabled: "
            "set JAX_ENABLE_X64=1 (or jax.config.update('jax_enable_x64', True)) before converting"
        )
    if is_floating(x.dtype):
        bits = lax.bitcast_convert_type(x.astype(jnp.float64), jnp.uint64)
    elif is_bool(x.dtype) or jnp.dtype(x.dtype) == jnp.uint64:
        bits = x.astype(jnp.uint64)
    else:
        bits = lax.bitcast_convert_type(x.astype(jnp.int64), jnp.uint64)
    axes = _axes(x, dim)
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes)
    return jnp.expand_dims(out, axes) if keepdim else out


@lowers("aten.logsumexp.default")
def logsumexp(x, dim, keepdim=False):
    xf = _acc(x)
    if not is_floating(xf.dtype):
        xf = xf.astype(jnp.float32)
    axes = _axes(x, dim)
    if not axes:
        return xf
    m = jnp.max(xf, axis=axes, keepdims=True)
    m = jnp.where(jnp.isinf(m), jnp.zeros_like(m), m)  # torch: all -inf gives -inf, an inf gives inf
    out = jnp.log(jnp.sum(jnp.exp(xf - m), axis=axes, keepdims=True)) + m
    return out if keepdim else jnp.squeeze(out, axes)


# -- softmax -----------------------------------------------------------------------------------
def _softmax_parts(x, dim):
    xf = _acc(x)
    if x.ndim == 0:
        xf = xf.reshape(1)
        dim = 0
    shifted = xf - jnp.max(xf, axis=dim, keepdims=True)
    return shifted, dim


@lowers("aten._softmax.default")
def softmax(x, dim, half_to_float=False):
    if x.size == 0:
        return _acc(x)
    shifted, axis = _softmax_parts(x, dim)
    e = jnp.exp(shifted)
    return (e / jnp.sum(e, axis=axis, keepdims=True)).reshape(x.shape)


@lowers("aten._log_softmax.default")
def log_softmax(x, dim, half_to_float=False):
    """x - max - log(sum(exp(x - max))); over the last dim, torch's CPU kernel for bfloat16/float16
    stores the sum and its log in the input dtype (a row whose max dominates gives exactly 0 there)."""
    if x.size == 0:
        return _acc(x)
    shifted, axis = _softmax_parts(x, dim)
    total = jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True)
    if x.dtype in LOW_PRECISION and axis % max(x.ndim, 1) == max(x.ndim, 1) - 1:
        log_total = jnp.log(total.astype(x.dtype).astype(total.dtype)).astype(x.dtype).astype(total.dtype)
        return (shifted - log_total).reshape(x.shape)
    return (shifted - jnp.log(total)).reshape(x.shape)


@lowers("aten._safe_softmax.default")
def safe_softmax(x, dim, dtype=None):
    """Softmax that gives 0 (not NaN) on rows that are entirely -inf."""
    if dtype is not None:
        x = x.astype(dtype)
    out = softmax(x, dim)
    if x.ndim == 0:
        return jnp.where(jnp.isneginf(x), jnp.zeros_like(out), out)
    dead = jnp.all(jnp.isneginf(x), axis=dim, keepdims=True)
    return jnp.where(dead, jnp.zeros_like(out), out)


# -- cumulative --------------------------------------------------------------------------------
def _scan_axis(x, dim):
    return 0 if x.ndim == 0 else dim % x.ndim


@lowers("aten.cumsum.default")
def cumsum(x, dim, dtype=None):
    x = _sum_input(x, dtype)
    return x if x.ndim == 0 else jnp.cumsum(x, axis=_scan_axis(x, dim))


@lowers("aten.cumprod.default")
def cumprod(x, dim, dtype=None):
    x = _sum_input(x, dtype)
    return x if x.ndim == 0 else jnp.cumprod(x, axis=_scan_axis(x, dim))


@lowers("aten.logcumsumexp.default")
def logcumsumexp(x, dim):
    xf = _acc(x)
    if not is_floating(xf.dtype):
        xf = xf.astype(jnp.float32)
    if xf.ndim == 0:
        return xf
    return lax.cumlogsumexp(xf, axis=_scan_axis(xf, dim))


def _cum_extreme(x, dim, better):
    """cummax/cummin: the running extreme and its index; NaN wins, ties take the later index."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = _scan_axis(x, dim)
    v = _cmp_view(x)
    idx = lax.broadcasted_iota(jnp.int32, x.shape, axis)

    def combine(a, b):
        av, ai = a
        bv, bi = b
        if is_floating(v.dtype):
            take_b = jnp.isnan(bv) | (~jnp.isnan(av) & better(bv, av))
        else:
            take_b = better(bv, av)
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    values, indices = lax.associative_scan(combine, (v, idx), axis=axis)
    return values.astype(x.dtype), indices


@lowers("aten.cummax.default")
def cummax(x, dim):
    return _cum_extreme(x, dim, lambda b, a: b >= a)


@lowers("aten.cummin.default")
def cummin(x, dim):
    return _cum_extreme(x, dim, lambda b, a: b <= a)


# -- norms -------------------------------------------------------------------------------------
@lowers("aten.linalg_vector_norm.default")
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.astype(dtype)
    a = jnp.abs(_acc(x))
    if not is_floating(a.dtype):
        a = a.astype(jnp.float32)
    axes = _axes(x, dim)
    ord = float(ord)
    if ord == float("inf"):
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)
