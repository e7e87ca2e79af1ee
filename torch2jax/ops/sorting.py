"""Sorting and selection: sort, topk, kthvalue, median, nanmedian, mode, unique, searchsorted, bucketize.

Torch's order: NaN is larger than every number (last ascending, first descending), -0.0 == 0.0,
and stable sorts keep equal elements in input order (descending too). Where torch's index among
tied values is implementation-defined (unstable sort, topk, kthvalue, median), the stable order is
used.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ..ir.dtypes import is_bool, is_floating
from .registry import lowers


def _key(x):
    return x.astype(jnp.int32) if is_bool(x.dtype) else x


def _stable_sort(x, axis, descending):
    """(values, int32 indices) sorted along `axis`, stable, NaN largest."""
    idx = lax.broadcasted_iota(jnp.int32, x.shape, axis)
    key = _key(x)
    if descending:
        # A stable ascending sort of the reversed input, reversed back, is a stable descending sort.
        key_r, idx_r = lax.rev(key, (axis,)), lax.rev(idx, (axis,))
        _, idx_s = lax.sort((key_r, idx_r), dimension=axis, is_stable=True, num_keys=1)
        idx_s = lax.rev(idx_s, (axis,))
    else:
        _, idx_s = lax.sort((key, idx), dimension=axis, is_stable=True, num_keys=1)
    return jnp.take_along_axis(x, idx_s, axis=axis), idx_s


def _axis(x, dim):
    return 0 if x.ndim == 0 else dim % x.ndim


@lowers("aten.sort.default")
def sort(x, dim=-1, descending=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    return _stable_sort(x, _axis(x, dim), descending)


@lowers("aten.sort.stable")
def sort_stable(x, stable=None, dim=-1, descending=False):
    return sort(x, dim, descending)


@lowers("aten.topk.default")
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = _axis(x, dim)
    values, indices = _stable_sort(x, axis, descending=largest)
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(indices, 0, k, axis=axis)


def _pick(values, indices, pos, axis, keepdim):
    """values/indices at per-row position `pos` (an array broadcastable with keepdim shape)."""
    v = jnp.take_along_axis(values, pos, axis=axis)
    i = jnp.take_along_axis(indices, pos, axis=axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


def _reduced_shape(x, axis):
    return tuple(1 if a == axis else s for a, s in enumerate(x.shape))


@lowers("aten.kthvalue.default")
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = _axis(x, dim)
    values, indices = _stable_sort(x, axis, descending=False)
    pos = jnp.full(_reduced_shape(x, axis), k - 1, jnp.int32)
    return _pick(values, indices, pos, axis, keepdim)


def _median(x, dim, keepdim, ignore_nan):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = _axis(x, dim)
    n = x.shape[axis]
    values, indices = _stable_sort(x, axis, descending=False)
    if is_floating(x.dtype):
        nans = jnp.sum(jnp.isnan(x), axis=axis, keepdims=True, dtype=jnp.int32)
        if ignore_nan:
            # median of the non-NaN values; an all-NaN row gives NaN at position 0
            pos = jnp.maximum(n - nans - 1, 0) // 2
        else:
            # any NaN: the result is NaN, at the first NaN (sorted to the end, stable)
            pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    else:
        pos = jnp.full(_reduced_shape(x, axis), (n - 1) // 2, jnp.int32)
    return _pick(values, indices, pos.astype(jnp.int32), axis, keepdim)


@lowers("aten.median.dim")
def median_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=False)


@lowers("aten.nanmedian.dim")
def nanmedian_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=True)


@lowers("aten.median.default")
def median_all(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=False)[0]


@lowers("aten.nanmedian.default")
def nanmedian_all(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=True)[0]


def _mode_1d(x):
    """Most frequent value (smallest on ties) and the index of its last occurrence."""
    n = x.shape[0]
    values, indices = _stable_sort(x, 0, descending=False)
    starts = jnp.concatenate([jnp.ones((1,), bool), values[1:] != values[:-1]])
    run = jnp.cumsum(starts.astype(jnp.int32)) - 1
    counts = jnp.zeros((n,), jnp.int32).at[run].add(1)
    best = jnp.argmax(counts)  # first maximal run: the smallest value among the most frequent
    last = jnp.max(jnp.where(run == best, jnp.arange(n), -1))  # stable: its last original index
    return values[last], indices[last]


@lowers("aten.mode.default")
def mode(x, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = _axis(x, dim)
    moved = jnp.moveaxis(x, axis, -1)
    batch = moved.shape[:-1]
    flat = moved.reshape((-1, moved.shape[-1]))
    v, i = jax.vmap(_mode_1d)(flat)
    v, i = v.reshape(batch), i.reshape(batch)
    if keepdim:
        v, i = jnp.expand_dims(v, axis), jnp.expand_dims(i, axis)
    return v, i


def _unique_rows(rows, k, sort):
    """Distinct rows of a (n, m) array, `k` of them: (values (k, m), inverse (n,), counts (k,)).
    Sorted lexicographically when `sort`, else runs of equal neighbouring rows (unique_consecutive)."""
    n, m = rows.shape
    order = jnp.arange(n, dtype=jnp.int32)
    if sort and n > 1 and m > 0:
        columns = [_key(rows[:, j]) for j in reversed(range(m))]  # lexsort: the last key is primary
        order = jnp.lexsort(columns).astype(jnp.int32)
    ordered = rows[order]
    differs = jnp.any(ordered[1:] != ordered[:-1], axis=1)
    starts = jnp.concatenate([jnp.ones((min(n, 1),), bool), differs])
    group = jnp.cumsum(starts.astype(jnp.int32)) - 1
    inverse = jnp.zeros((n,), jnp.int32).at[order].set(group)
    counts = jnp.zeros((k,), jnp.int32).at[group].add(1)
    values = jnp.zeros((k, m), rows.dtype).at[group].set(ordered)
    return values, inverse, counts, jnp.sum(starts)


def _unique(ctx, x, dim, sort):
    """unique / unique_consecutive, flattened (dim None) or along `dim`. Only graphs whose output size torch knows
    without the values, or whose size the conversion took from the example inputs (checked here: the count of distinct
    values), reach here (capture refuses the others as data-dependent). Outputs torch was not asked for are empty, as
    the metadata says. `sorted=False` leaves the order to the implementation in torch; it is sorted here."""
    metas = ctx.out_meta
    if dim is None:
        k = ctx.shape_of(metas[0])[0]
        values, inverse, counts, distinct = _unique_rows(x.reshape(-1, 1), k, sort)
        results = (values.reshape(-1), inverse.reshape(x.shape), counts)
        ctx.check_example(metas[0].shape[0], distinct)
    else:
        axis = dim % x.ndim  # torch refuses a dim on a 0-d tensor
        moved = jnp.moveaxis(x, axis, 0)
        k = ctx.shape_of(metas[0])[axis]
        rows = moved.reshape(moved.shape[0], math.prod(moved.shape[1:]))
        values, inverse, counts, distinct = _unique_rows(rows, k, sort)
        results = (jnp.moveaxis(values.reshape((k,) + moved.shape[1:]), 0, axis), inverse, counts)
        ctx.check_example(metas[0].shape[axis], distinct)
    wanted = [ctx.shape_of(meta) for meta in metas]
    return tuple(r if r.shape == shape else jnp.zeros(shape, r.dtype) for r, shape in zip(results, wanted))


@lowers("aten._unique2.default", ctx=True)
def unique2(ctx, x, sorted=True, return_inverse=False, return_counts=False):
    return _unique(ctx, x, None, sort=True)


@lowers("aten.unique_dim.default", ctx=True)
def unique_dim(ctx, x, dim, sorted=True, return_inverse=False, return_counts=False):
    return _unique(ctx, x, dim, sort=True)


@lowers("aten.unique_consecutive.default", ctx=True)
def unique_consecutive(ctx, x, return_inverse=False, return_counts=False, dim=None):
    return _unique(ctx, x, dim, sort=False)


def _insertion_index(seq, values, right):
    """torch's binary search as a count: left = #{s : !(s >= v)}, right = #{s : !(s > v)}."""
    seq = _key(seq)
    values = _key(values)
    s = seq[..., None, :]
    v = values[..., :, None]
    hit = ~(s > v) if right else ~(s >= v)
    return jnp.sum(hit, axis=-1, dtype=jnp.int32)


@lowers("aten.searchsorted.Tensor")
def searchsorted(seq, values, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    right = right or side == "right"
    if seq.ndim == 1:
        flat = jnp.reshape(values, (-1,))
        return _insertion_index(seq, flat, right).reshape(jnp.shape(values))
    return _insertion_index(seq, values, right)


@lowers("aten.searchsorted.Scalar")
def searchsorted_scalar(seq, value, out_int32=False, right=False, side=None, sorter=None):
    values = jnp.full(seq.shape[:-1] + (1,), value)
    out = searchsorted(seq, values, out_int32, right, side, sorter)
    return out.reshape(()) if seq.ndim == 1 else out


@lowers("aten.bucketize.Tensor")
def bucketize(x, boundaries, out_int32=False, right=False):
    flat = jnp.reshape(x, (-1,))
    return _insertion_index(boundaries, flat, right).reshape(jnp.shape(x))


@lowers("aten.bucketize.Scalar")
def bucketize_scalar(x, boundaries, out_int32=False, right=False):
    return _insertion_index(boundaries, jnp.asarray([x]), right).reshape(())
