"""Reductions: sum/mean/var/max/min/argmax..., softmax. `dim=None` or `[]` means all dims, as torch."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..dtypes import is_bool, is_integer
from ..registry import lowers


def _axes(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    if isinstance(dim, int):
        return dim
    return tuple(dim)


def _sum_dtype(x, dtype):
    if dtype is not None:
        return dtype
    if is_integer(x.dtype) or is_bool(x.dtype):
        return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32  # torch sums ints in int64
    return x.dtype


@lowers("aten.sum.dim_IntList")
def sum_dim(x, dim=None, keepdim=False, dtype=None):
    return jnp.sum(x, axis=_axes(x, dim), keepdims=keepdim, dtype=_sum_dtype(x, dtype))


@lowers("aten.sum.default")
def sum_all(x, dtype=None):
    return jnp.sum(x, dtype=_sum_dtype(x, dtype))


@lowers("aten.mean.dim")
def mean_dim(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.astype(dtype)
    return jnp.mean(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.mean.default")
def mean_all(x, dtype=None):
    return mean_dim(x, None, False, dtype)


@lowers("aten.prod.dim_int")
def prod_dim(x, dim, keepdim=False, dtype=None):
    return jnp.prod(x, axis=dim, keepdims=keepdim, dtype=_sum_dtype(x, dtype))


@lowers("aten.prod.default")
def prod_all(x, dtype=None):
    return jnp.prod(x, dtype=_sum_dtype(x, dtype))


@lowers("aten.var.correction")
def var(x, dim=None, correction=None, keepdim=False):
    ddof = 1 if correction is None else correction
    return jnp.var(x, axis=_axes(x, dim), ddof=ddof, keepdims=keepdim)


@lowers("aten.amax.default")
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.amin.default")
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.max.dim")
def max_dim(x, dim, keepdim=False):
    return jnp.max(x, axis=dim, keepdims=keepdim), _arg(jnp.argmax, x, dim, keepdim)


@lowers("aten.min.dim")
def min_dim(x, dim, keepdim=False):
    return jnp.min(x, axis=dim, keepdims=keepdim), _arg(jnp.argmin, x, dim, keepdim)


@lowers("aten.max.default")
def max_all(x):
    return jnp.max(x)


@lowers("aten.min.default")
def min_all(x):
    return jnp.min(x)


def _arg(fn, x, dim, keepdim):
    if dim is None:
        return fn(x.reshape(-1))
    return fn(x, axis=dim, keepdims=keepdim)


@lowers("aten.argmax.default")
def argmax(x, dim=None, keepdim=False):
    return _arg(jnp.argmax, x, dim, keepdim)


@lowers("aten.argmin.default")
def argmin(x, dim=None, keepdim=False):
    return _arg(jnp.argmin, x, dim, keepdim)


@lowers("aten.any.default")
def any_all(x):
    return jnp.any(x)


@lowers("aten.any.dim", "aten.any.dims")
def any_dim(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten.all.default")
def all_all(x):
    return jnp.all(x)


@lowers("aten.all.dim", "aten.all.dims")
def all_dim(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers("aten._softmax.default")
def softmax(x, dim, half_to_float=False):
    return jax.nn.softmax(x, axis=dim)


@lowers("aten._log_softmax.default")
def log_softmax(x, dim, half_to_float=False):
    return jax.nn.log_softmax(x, axis=dim)


@lowers("aten.cumsum.default")
def cumsum(x, dim, dtype=None):
    return jnp.cumsum(x, axis=dim, dtype=_sum_dtype(x, dtype))
