"""Histograms and segment reductions: histc, histogram, histogramdd, segment_reduce.

Bin assignment follows torch's CPU kernel exactly, since an element on a bin edge must land in the
same bin: histc divides (x - left) * bins / (right - left) in the input dtype and truncates;
histogram and histogramdd with a bin count do the same, then correct the bin by comparing with the
neighbouring edges; explicit bin edges use a binary search. Edges from a bin count are torch's
linspace in the input dtype. Outputs have static shapes (bin counts are python ints); bincount's
length, max(input) + 1, is read from the values: its lowering takes the length torch recorded for
the node, which the `jax` device counts from the values (eager/data_dependent.py); torch.export
cannot express it, and capture refuses it with the bounded form to use instead.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import lowers


def _linspace(start, end, steps, dtype):
    """torch's linspace: start + i * step for the first half, end - (steps - 1 - i) * step after."""
    start, end = jnp.asarray(start, dtype), jnp.asarray(end, dtype)
    step = (end - start) / (steps - 1)
    i = jnp.arange(steps)
    low = start + step * i.astype(dtype)
    high = end - step * (steps - 1 - i).astype(dtype)
    return jnp.where(i < steps // 2, low, high)


def _outer_edges(x2d, range_):
    """Per-dimension (left, right): `range_`, else the data's min and max ((0, 1) for no data),
    widened by 0.5 on each side where they are equal, as torch's histogramdd."""
    dims = x2d.shape[1]
    if range_ is not None:
        left = jnp.asarray(range_[0::2], jnp.float32)
        right = jnp.asarray(range_[1::2], jnp.float32)
    elif x2d.shape[0] == 0:
        left, right = jnp.zeros(dims), jnp.ones(dims)
    else:
        left, right = jnp.min(x2d, axis=0).astype(jnp.float32), jnp.max(x2d, axis=0).astype(jnp.float32)
    same = left == right
    return jnp.where(same, left - 0.5, left), jnp.where(same, right + 0.5, right)


def _in_dtype(dtype, value):
    """Round to the input dtype after each operation, as torch's scalar_t arithmetic does."""
    return value.astype(dtype)


def _linear_bin(x, edges, bins):
    """trunc((x - left) * bins / (right - left)) computed in the input dtype."""
    dtype = x.dtype
    left, right = edges[0], edges[-1]
    scaled = _in_dtype(dtype, _in_dtype(dtype, x - left) * jnp.asarray(bins, dtype))
    pos = jnp.trunc(_in_dtype(dtype, scaled / _in_dtype(dtype, right - left)))
    return jnp.clip(jnp.nan_to_num(pos), 0, bins).astype(jnp.int32)


def _local_search_bin(x, edges, bins):
    """The linear guess corrected against the edges at guess - 1 .. guess + 1 (an upper bound there)."""
    guess = _linear_bin(x, edges, bins)
    low = jnp.maximum(guess - 1, 0)
    high = jnp.minimum(guess + 2, bins + 1)
    count = sum(((low + k < high) & (edges[jnp.clip(low + k, 0, bins)] <= x)).astype(jnp.int32) for k in range(3))
    return low + count - 1


def _search_bin(x, edges, bins):
    return jnp.searchsorted(edges, x, side="right").astype(jnp.int32) - 1


def _histogramdd(x2d, edges, weight, density, find_bin, dtype):
    """Counts (or summed weights) of the rows of x2d in the bins between `edges[d]` in each dimension d.

    Elements outside [first edge, last edge] in any dimension, and nan, are dropped; the last bin
    includes its right edge. density divides by the total and by each bin's width.
    """
    sizes = tuple(int(e.shape[0]) - 1 for e in edges)
    keep = jnp.ones(x2d.shape[0], bool)
    flat = jnp.zeros(x2d.shape[0], jnp.int32)
    for d, (e, bins) in enumerate(zip(edges, sizes)):
        col = x2d[:, d]
        keep = keep & (col >= e[0]) & (col <= e[-1])
        pos = find_bin(col, e, bins)
        pos = jnp.clip(jnp.where(pos == bins, bins - 1, pos), 0, bins - 1)
        flat = flat * bins + pos
    ones = jnp.ones(x2d.shape[0], jnp.float32) if weight is None else weight.reshape(-1).astype(jnp.float32)
    hist = jnp.zeros(int(np.prod(sizes)), jnp.float32).at[flat].add(jnp.where(keep, ones, 0))
    hist = hist.reshape(sizes).astype(dtype)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            shape = [1] * len(sizes)
            shape[d] = sizes[d]
            hist = hist / jnp.diff(e).reshape(shape)
    return hist


@lowers("aten.histc.default")
def histc(x, bins=100, min=0, max=0):
    """min == max takes the data's range; a still-empty range widens by 1 on each side."""
    x = jnp.asarray(x).reshape(-1)
    dtype = x.dtype
    left, right = jnp.asarray(float(min), jnp.float32), jnp.asarray(float(max), jnp.float32)
    if float(min) == float(max) and x.size:
        left, right = jnp.min(x).astype(jnp.float32), jnp.max(x).astype(jnp.float32)
    same = left == right
    edges = _linspace(jnp.where(same, left - 1, left), jnp.where(same, right + 1, right), bins + 1, dtype)
    return _histogramdd(x[:, None], [edges], None, False, _linear_bin, dtype)


@lowers("aten.histogram.bin_ct")
def histogram_bin_ct(x, bins=100, range=None, weight=None, density=False):
    x2d = jnp.asarray(x).reshape(-1, 1)
    left, right = _outer_edges(x2d, range)
    edges = _linspace(left[0], right[0], bins + 1, x2d.dtype)
    return _histogramdd(x2d, [edges], weight, density, _local_search_bin, x2d.dtype), edges


@lowers("aten.histogram.bins_tensor")
def histogram_bins_tensor(x, bins, weight=None, density=False):
    x2d = jnp.asarray(x).reshape(-1, 1)
    return _histogramdd(x2d, [bins], weight, density, _search_bin, x2d.dtype), bins


def _dd_edges(x, bins, range_):
    x2d = jnp.asarray(x).reshape(-1, x.shape[-1])
    left, right = _outer_edges(x2d, range_)
    return x2d, [_linspace(left[d], right[d], b + 1, x2d.dtype) for d, b in enumerate(bins)]


@lowers("aten._histogramdd_bin_edges.default")
def histogramdd_bin_edges(x, bins, range=None, weight=None, density=False):
    return _dd_edges(x, bins, range)[1]


@lowers("aten._histogramdd_from_bin_cts.default")
def histogramdd_from_bin_cts(x, bins, range=None, weight=None, density=False):
    x2d, edges = _dd_edges(x, bins, range)
    return _histogramdd(x2d, edges, weight, density, _local_search_bin, x2d.dtype)


@lowers("aten._histogramdd_from_bin_tensors.default")
def histogramdd_from_bin_tensors(x, bins, weight=None, density=False):
    x2d = jnp.asarray(x).reshape(-1, x.shape[-1])
    return _histogramdd(x2d, list(bins), weight, density, _search_bin, x2d.dtype)


# --- segment_reduce ----------------------------------------------------------------------------

_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}


@lowers("aten.bincount.default", ctx=True)
def bincount(ctx, x, weights=None, minlength=0):
    """Occurrences of each value 0 .. length - 1 in the 1-d integer `x`, or the sum of `weights` at them.

    The length (max(x) + 1, at least minlength) is the node's, as torch recorded it. torch's CPU
    kernel adds in the output dtype, in input order: float32 weights in float32, other weights in
    float64 (the node's dtype), no weights (or an empty input) as int64 counts.
    """
    (length,) = ctx.out_shape
    dtype = ctx.out_dtype
    values = jnp.ones(x.shape, dtype) if weights is None or x.shape[0] == 0 else weights.astype(dtype)
    return jnp.zeros((length,), dtype).at[x].add(values, mode="drop")


@lowers("aten.segment_reduce.default")
def segment_reduce(data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    """Reduce consecutive segments of `data` along the last axis of `lengths` (or `offsets`).

    As torch's CPU kernel: the segment axis is lengths.dim() - 1 (leading dims of lengths batch
    over data's); each segment folds its elements in order into `initial` (or the reduction's
    identity), rounding to data's dtype at each step; max and min propagate nan; mean divides by
    the segment length, and an empty segment's mean is `initial`, or nan without one.
    """
    if indices is not None or (lengths is None and offsets is None):
        raise NotImplementedError("segment_reduce needs lengths or offsets (torch does not support indices either)")
    if lengths is not None:
        axis = lengths.ndim - 1
        ends = jnp.cumsum(lengths, axis=-1)
        starts = ends - lengths
    else:
        axis = offsets.ndim - 1
        starts, ends = offsets[..., :-1], offsets[..., 1:]
    if reduce not in _FOLD:
        raise NotImplementedError(f"segment_reduce: unknown reduction {reduce!r}")
    dtype = data.dtype
    inner = (1,) * (data.ndim - axis - 1)
    starts, ends = starts.reshape(starts.shape + inner), ends.reshape(ends.shape + inner)
    fold = _FOLD[reduce]
    first = _IDENTITY[reduce] if initial is None else float(initial)
    acc = jnp.full(starts.shape[: axis + 1] + data.shape[axis + 1 :], first, jnp.float32).astype(dtype)

    def step(j, acc):
        value = jnp.expand_dims(lax.dynamic_index_in_dim(data, j, axis, keepdims=False), axis)
        member = (starts <= j) & (j < ends)
        return jnp.where(member, fold(acc.astype(jnp.float32), value.astype(jnp.float32)).astype(dtype), acc)

    out = lax.fori_loop(0, data.shape[axis], step, acc)
    if reduce == "mean":
        count = (ends - starts).astype(dtype)
        divided = (out.astype(jnp.float32) / count.astype(jnp.float32)).astype(dtype)
        out = jnp.where(count > 0, divided, jnp.nan if initial is None else out)
    return out


def _nan_max(acc, x):
    return jnp.where(jnp.isnan(x), x, jnp.maximum(acc, x))


def _nan_min(acc, x):
    return jnp.where(jnp.isnan(x), x, jnp.minimum(acc, x))


_FOLD = {"sum": jnp.add, "mean": jnp.add, "prod": jnp.multiply, "max": _nan_max, "min": _nan_min}
