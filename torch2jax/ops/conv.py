"""Convolution and pooling, kept whole: `lax.conv_general_dilated` and `lax.reduce_window`."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ..registry import lowers


def _spatial(x):
    return x.ndim - 2


def _tuple(value, n):
    return tuple(value) * n if len(value) == 1 else tuple(value)


def _dimension_numbers(n):
    spatial = "DHW"[-n:] if n <= 3 else None
    if spatial is None:
        raise NotImplementedError(f"{n}-d convolution is not supported")
    return (f"NC{spatial}", f"OI{spatial}", f"NC{spatial}")


@lowers("aten.convolution.default")
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = _spatial(x)
    stride, padding, dilation = _tuple(stride, n), _tuple(padding, n), _tuple(dilation, n)
    acc = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else None
    if not transposed:
        out = lax.conv_general_dilated(
            x,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=_dimension_numbers(n),
            feature_group_count=groups,
            preferred_element_type=acc,
        )
    else:
        out = _conv_transpose(x, weight, stride, padding, dilation, _tuple(output_padding, n), groups, acc)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * n)
    return out.astype(x.dtype)


def _conv_transpose(x, weight, stride, padding, dilation, output_padding, groups, acc):
    """Transposed conv as a dilated conv of the input with the flipped, regrouped kernel."""
    n = _spatial(x)
    in_ch = weight.shape[0]
    out_per_group = weight.shape[1]
    # torch weight: (in, out/groups, *k) -> (out, in/groups, *k), flipped spatially
    w = weight.reshape((groups, in_ch // groups, out_per_group) + weight.shape[2:])
    w = jnp.swapaxes(w, 1, 2).reshape((groups * out_per_group, in_ch // groups) + weight.shape[2:])
    w = jnp.flip(w, axis=tuple(range(2, 2 + n)))
    pads = []
    for k, s, p, d, op in zip(weight.shape[2:], stride, padding, dilation, output_padding):
        edge = d * (k - 1) - p
        pads.append((edge, edge + op))
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=(1,) * n,
        padding=pads,
        lhs_dilation=stride,
        rhs_dilation=dilation,
        dimension_numbers=_dimension_numbers(n),
        feature_group_count=groups,
        preferred_element_type=acc,
    )


def _pool_padding(x, kernel, stride, padding, dilation, ceil_mode):
    """(lo, hi) padding per spatial dim; ceil_mode adds right padding for a last partial window."""
    pads = []
    for size, k, s, p, d in zip(x.shape[2:], kernel, stride, padding, dilation):
        hi = p
        if ceil_mode:
            eff = d * (k - 1) + 1
            out = -(-(size + 2 * p - eff) // s) + 1
            if (out - 1) * s >= size + p:  # the last window must start inside the input or left pad
                out -= 1
            hi = max(p, (out - 1) * s + eff - size - p)
        pads.append((p, hi))
    return pads


@lowers("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def max_pool_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    n = _spatial(x)
    kernel = _tuple(kernel_size, n)
    stride = _tuple(stride, n) if stride else kernel
    padding = _tuple(padding if isinstance(padding, (list, tuple)) else [padding], n)
    dilation = _tuple(dilation if isinstance(dilation, (list, tuple)) else [dilation], n)
    pads = _pool_padding(x, kernel, stride, padding, dilation, ceil_mode)
    init = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    window = (1, 1) + kernel
    strides = (1, 1) + stride
    dil = (1, 1) + dilation
    full_pads = [(0, 0), (0, 0)] + pads
    values = lax.reduce_window(x, jnp.asarray(init, x.dtype), lax.max, window, strides, full_pads, window_dilation=dil)
    # indices: flat position within each (N, C) plane of the element that won
    plane = jnp.arange(math.prod(x.shape[2:]), dtype=jnp.int32).reshape(x.shape[2:])
    plane = jnp.broadcast_to(plane, x.shape)

    def select(a, b):
        va, ia = a
        vb, ib = b
        take_b = (vb > va) | jnp.isnan(vb) & ~jnp.isnan(va)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    _, indices = lax.reduce_window(
        (x, plane), (jnp.asarray(init, x.dtype), jnp.asarray(0, jnp.int32)), select, window, strides, full_pads, window_dilation=dil
    )
    return values, indices


@lowers("aten.avg_pool2d.default", "aten.avg_pool3d.default", "aten.avg_pool1d.default")
def avg_pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    n = _spatial(x)
    kernel = _tuple(kernel_size, n)
    stride = _tuple(stride, n) if stride else kernel
    padding = _tuple(padding if isinstance(padding, (list, tuple)) else [padding], n)
    pads = _pool_padding(x, kernel, stride, padding, (1,) * n, ceil_mode)
    window, strides, full_pads = (1, 1) + kernel, (1, 1) + stride, [(0, 0), (0, 0)] + pads
    acc = x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x
    total = lax.reduce_window(acc, jnp.asarray(0, acc.dtype), lax.add, window, strides, full_pads)
    if divisor_override:
        return (total / divisor_override).astype(x.dtype)
    # count: with count_include_pad the explicit padding counts, the ceil_mode overhang never does
    ones = jnp.ones(x.shape[2:], acc.dtype)
    if count_include_pad:
        ones = jnp.pad(ones, [(p, p) for p in padding], constant_values=1)
        extra = [(0, hi - p) for (p, hi), p in zip(pads, padding)]
    else:
        extra = pads
    count = lax.reduce_window(ones, jnp.asarray(0, acc.dtype), lax.add, kernel, stride, extra)
    return (total / count).astype(x.dtype)


@lowers("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(x, output_size):
    h, w = x.shape[-2:]
    oh, ow = output_size
    if h % oh == 0 and w % ow == 0:
        kh, kw = h // oh, w // ow
        summed = lax.reduce_window(x, jnp.asarray(0, x.dtype), lax.add, (1, 1, kh, kw), (1, 1, kh, kw), "VALID")
        return summed / (kh * kw)
    rows = [x[..., (i * h) // oh : -(-((i + 1) * h) // oh), :].mean(axis=-2, keepdims=True) for i in range(oh)]
    x = jnp.concatenate(rows, axis=-2)
    cols = [x[..., (j * w) // ow : -(-((j + 1) * w) // ow)].mean(axis=-1, keepdims=True) for j in range(ow)]
    return jnp.concatenate(cols, axis=-1)
