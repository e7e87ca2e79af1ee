"""Normalization ops kept whole: layer norm, batch norm (inference), group norm.

Low-precision inputs compute statistics in float32 and cast back, as torch's kernels do.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..registry import lowers


def _acc(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


@lowers("aten.native_layer_norm.default")
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = _acc(x)
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (xf - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.astype(x.dtype), mean, rstd


def _channel_shape(x):
    return (1, -1) + (1,) * (x.ndim - 2)


@lowers("aten._native_batch_norm_legit_no_training.default")
def batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    shape = _channel_shape(x)
    xf = _acc(x)
    out = (xf - running_mean.reshape(shape)) * lax.rsqrt(running_var.reshape(shape) + eps)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    empty = jnp.zeros((0,), x.dtype)
    return out.astype(x.dtype), empty, empty


@lowers("aten.native_group_norm.default")
def native_group_norm(x, weight, bias, n, c, hw, group, eps):
    xf = _acc(x)
    grouped = xf.reshape(x.shape[0], group, -1)
    mean = jnp.mean(grouped, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(grouped - mean), axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((grouped - mean) * rstd).reshape(x.shape)
    shape = _channel_shape(x)
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out.astype(x.dtype), mean.reshape(x.shape[0], group), rstd.reshape(x.shape[0], group)
