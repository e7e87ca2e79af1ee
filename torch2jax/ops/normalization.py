"""Normalization ops kept whole: layer norm, batch norm (inference), group norm.

Low-precision inputs compute statistics in float32 and cast back, as torch's kernels do.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .registry import lowers


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
    xf = _acc(x)
    rstd = lax.rsqrt(running_var.astype(xf.dtype) + eps)
    out = _normalize(x, xf, running_mean.astype(xf.dtype), rstd, weight, bias)
    empty = jnp.zeros((0,), x.dtype)
    return out, empty, empty


@lowers("aten.native_group_norm.default")
def native_group_norm(x, weight, bias, n, c, hw, group, eps):
    xf = _acc(x)
    per_group = x.shape[1] // group * math.prod(x.shape[2:])  # spelled out: -1 cannot be inferred for an empty batch
    grouped = xf.reshape(x.shape[0], group, per_group)
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


def _batch_stats(x):
    """Per-channel mean and biased variance over (N, *spatial), in float32 for low precision."""
    xf = _acc(x)
    axes = (0,) + tuple(range(2, x.ndim))
    mean = jnp.mean(xf, axis=axes)
    var = jnp.mean(jnp.square(xf - mean.reshape(_channel_shape(x))), axis=axes)
    return xf, mean, var


def _normalize(x, xf, mean, rstd, weight, bias):
    """x * alpha + beta per channel, alpha = rstd * weight, beta = bias - mean * alpha (torch's CPU form)."""
    shape = _channel_shape(x)
    alpha = rstd if weight is None else rstd * weight.astype(rstd.dtype)
    beta = -mean * alpha if bias is None else bias.astype(rstd.dtype) - mean * alpha
    return (xf * alpha.reshape(shape) + beta.reshape(shape)).astype(x.dtype)


def _stats_dtype(x, *params):
    """torch's CPU `param_t`: float32 when a low-precision input comes with float32 parameters,
    else the input's dtype. Torch stores the batch mean and the sum of squares in it before using
    them, so bfloat16 training rounds its statistics there; so do we."""
    given = [p for p in params if p is not None]
    if x.dtype in (jnp.bfloat16, jnp.float16) and given and all(p.dtype == jnp.float32 for p in given):
        return jnp.float32
    return x.dtype


def _rounded(value, dtype):
    return value.astype(dtype).astype(value.dtype)


def _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps):
    """Training-mode batch norm: normalize with the batch's statistics and update the running ones."""
    stats = _stats_dtype(x, weight, bias, running_mean, running_var)
    xf, mean, var = _batch_stats(x)
    n = x.size // x.shape[1]
    mean = _rounded(mean, stats)
    var_sum = _rounded(var * n, stats)
    rstd = _rounded(lax.rsqrt(var_sum / n + eps), stats)
    out = _normalize(x, xf, mean, rstd, weight, bias)
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = (momentum * mean + (1 - momentum) * running_mean).astype(running_mean.dtype)
    if running_var is not None:
        unbiased = var_sum / (n - 1) if n > 1 else var_sum * jnp.inf
        new_var = (momentum * unbiased + (1 - momentum) * running_var).astype(running_var.dtype)
    return out, mean, rstd, new_mean, new_var


@lowers("aten._native_batch_norm_legit_functional.default")
def native_batch_norm_legit_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out, _, _ = batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps)
        empty = jnp.zeros((0,), jnp.float32)
        return out, empty, empty, running_mean, running_var
    return _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps)


@lowers("aten._native_batch_norm_legit.no_stats")
def native_batch_norm_legit_no_stats(x, weight, bias, training, momentum, eps):
    out, mean, rstd, _, _ = _batch_norm_train(x, weight, bias, None, None, momentum, eps)
    return out, mean, rstd


@lowers("aten._batch_norm_with_update_functional.default")
def batch_norm_with_update_functional(x, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, rstd, new_mean, new_var = _batch_norm_train(x, weight, bias, running_mean, running_var, momentum, eps)
    return out, mean, rstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


@lowers("aten._native_batch_norm_legit.default")
def native_batch_norm_legit(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training:
        # updates running_mean/var in place; torch.export functionalizes this to the _functional op
        raise NotImplementedError("in-place batch-norm statistics update: export the model functionalized")
    return batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps)
