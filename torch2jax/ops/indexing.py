"""Indexing, gather and scatter ops. Negative indices count from the end, as in torch.

Scatter-style ops build one full coordinate array per dimension (an iota for every dim but the
scattered one) and update with `.at[...]`, so `index` may be smaller than `self`/`src` in any dim,
as torch allows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .registry import lowers


def _wrap(index, size):
    return jnp.where(index < 0, index + size, index)


def _dim(dim, ndim):
    return dim % ndim if ndim else 0


def _coords(x, dim, index):
    """Full coordinates addressing x at `index` along `dim`, and positions elsewhere (index's own)."""
    if index.ndim == 0:
        index = index.reshape(1)
    if x.ndim == 0:
        return (), index.reshape(())
    dim = _dim(dim, x.ndim)
    shape = index.shape
    coords = []
    for d in range(x.ndim):
        if d == dim:
            coords.append(_wrap(index, x.shape[d]).astype(jnp.int32))
        else:
            coords.append(lax.broadcasted_iota(jnp.int32, shape, d))
    return tuple(coords), index


def _leading_block(src, shape):
    """src[:shape[0], :shape[1], ...]: the part of src that index addresses."""
    if src.ndim == 0:
        return jnp.broadcast_to(src, shape)
    return src[tuple(slice(0, s) for s in shape)]


@lowers("aten.embedding.default")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    rows = jnp.take(weight, _wrap(indices, weight.shape[0]), axis=0)
    if padding_idx is not None and padding_idx >= 0:  # torch's backward leaves the padding row's gradient zero
        rows = jnp.where((indices == padding_idx)[..., None], lax.stop_gradient(rows), rows)
    return rows


@lowers("aten.embedding_dense_backward.default")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    grad = grad_output.reshape((flat.shape[0],) + grad_output.shape[indices.ndim :])
    keep = flat != padding_idx
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.int32).at[flat].add(1)
        grad = grad / counts[flat].astype(grad.dtype).reshape((-1,) + (1,) * (grad.ndim - 1))
    grad = jnp.where(keep.reshape((-1,) + (1,) * (grad.ndim - 1)), grad, jnp.zeros((), grad.dtype))
    out = jnp.zeros((num_weights,) + grad.shape[1:], grad.dtype)
    return out.at[flat].add(grad)


@lowers("aten.index_select.default")
def index_select(x, dim, index):
    if x.ndim == 0:
        return jnp.take(x.reshape(1), index.reshape(-1), axis=0).reshape(())
    dim = _dim(dim, x.ndim)
    return jnp.take(x, _wrap(index.reshape(-1), x.shape[dim]), axis=dim)


def _index_key(x, indices):
    key = []
    for i in indices:
        if i is None:
            key.append(slice(None))
        elif i.dtype == jnp.bool_ or i.dtype == jnp.uint8:
            key.append(i.astype(jnp.bool_))
        else:
            key.append(i)
    return tuple(key)


@lowers("aten.index.Tensor")
def index(x, indices):
    """Advanced indexing with a list of optional index tensors (None keeps a dim whole)."""
    return x[_index_key(x, indices)]


@lowers("aten.index_put.default", "aten._unsafe_index_put.default")
def index_put(x, indices, values, accumulate=False):
    key = _index_key(x, indices)
    values = values.astype(x.dtype)
    mode = None
    if any(not isinstance(k, slice) and k.dtype == jnp.bool_ for k in key):
        key, values = _static_bool_key(x, key, values)
        mode = "drop"
    ref = x.at[key]
    if accumulate:
        return ref.max(values, mode=mode) if x.dtype == jnp.bool_ else ref.add(values, mode=mode)
    return ref.set(values, mode=mode)


def _static_bool_key(x, key, values):
    """Bool masks as integer indices of a static length (the mask's size), padded with an
    out-of-range index whose updates are dropped; values are padded to match."""
    out, d = [], 0
    for k in key:
        if isinstance(k, slice) or k.dtype != jnp.bool_:
            out.append(k)
            d += 1
            continue
        dims = x.shape[d : d + k.ndim]
        out.extend(_nonzero_padded(k, dims))
        d += k.ndim
    key = tuple(out)
    probe = tuple(k if isinstance(k, slice) else jnp.zeros(k.shape, jnp.int32) for k in key)
    target = jax.eval_shape(lambda a: a[probe], jax.ShapeDtypeStruct(x.shape, jnp.bool_)).shape
    try:
        jnp.broadcast_shapes(values.shape, target)
    except ValueError:
        lead = len(target) - values.ndim
        pads = [(0, max(t - v, 0)) if v != 1 else (0, 0) for v, t in zip(values.shape, target[lead:])]
        values = jnp.pad(values, pads)
    return key, values


def _nonzero_padded(mask, dims):
    coords = jnp.nonzero(mask, size=mask.size, fill_value=0)
    valid = jnp.arange(mask.size) < jnp.sum(mask.astype(jnp.int32))
    return [jnp.where(valid, c, size) for c, size in zip(coords, dims)]


@lowers("aten._unsafe_index.Tensor")
def unsafe_index(x, indices):
    return index(x, indices)


@lowers("aten.gather.default")
def gather(x, dim, index, sparse_grad=False):
    shape = index.shape
    if x.ndim == 0:
        return jnp.broadcast_to(x, shape)
    coords, _ = _coords(x.reshape(x.shape or (1,)), dim, index)
    return x[coords].reshape(shape)


def _scatter_prepare(x, dim, index, src):
    coords, index = _coords(x, dim, index)
    if x.ndim == 0:
        return x.reshape(1), (index.reshape(-1) * 0,), _leading_block(jnp.asarray(src, x.dtype).reshape(-1), (index.size,)), True
    if isinstance(src, (int, float, bool)) or getattr(src, "ndim", 1) == 0:
        vals = jnp.broadcast_to(jnp.asarray(src).astype(x.dtype), index.shape)
    else:
        vals = _leading_block(src.astype(x.dtype), index.shape)
    return x, coords, vals, False


def _finish(out, scalar):
    return out.reshape(()) if scalar else out


@lowers("aten.scatter.src", "aten.scatter.value")
def scatter(x, dim, index, src):
    base, coords, vals, scalar = _scatter_prepare(x, dim, index, src)
    return _finish(base.at[coords].set(vals), scalar)


@lowers("aten.scatter.reduce", "aten.scatter.value_reduce")
def scatter_with_reduce(x, dim, index, src, reduce):
    base, coords, vals, scalar = _scatter_prepare(x, dim, index, src)
    if reduce == "add":
        out = base.at[coords].add(vals) if base.dtype != jnp.bool_ else base.at[coords].max(vals)
    elif reduce == "multiply":
        out = base.at[coords].multiply(vals) if base.dtype != jnp.bool_ else base.at[coords].min(vals)
    else:
        raise ValueError(f"scatter reduce={reduce!r}")
    return _finish(out, scalar)


@lowers("aten.scatter_add.default")
def scatter_add(x, dim, index, src):
    return scatter_with_reduce(x, dim, index, src, "add")


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(False)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _highest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(True)
    return jnp.array(jnp.iinfo(dtype).max, dtype)


@lowers("aten.scatter_reduce.two")
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    base, coords, vals, scalar = _scatter_prepare(x, dim, index, src)
    is_bool = base.dtype == jnp.bool_
    if reduce in ("sum", "mean"):
        start = base if include_self else base.at[coords].set(jnp.zeros((), base.dtype))
        out = start.at[coords].max(vals) if is_bool else start.at[coords].add(vals)
        if reduce == "mean":
            count = jnp.ones(base.shape, jnp.int32) if include_self else jnp.zeros(base.shape, jnp.int32)
            count = count.at[coords].add(1)
            count = jnp.maximum(count, 1)
            if jnp.issubdtype(base.dtype, jnp.floating):
                out = out / count.astype(base.dtype)
            elif is_bool:
                out = out  # a bool sum divided by a count >= 1 is unchanged when cast back to bool
            else:
                out = jnp.floor_divide(out, count.astype(base.dtype))
    elif reduce == "prod":
        start = base if include_self else base.at[coords].set(jnp.ones((), base.dtype))
        out = start.at[coords].min(vals) if is_bool else start.at[coords].multiply(vals)
    elif reduce == "amax":
        start = base if include_self else base.at[coords].set(_lowest(base.dtype))
        out = start.at[coords].max(vals)
    elif reduce == "amin":
        start = base if include_self else base.at[coords].set(_highest(base.dtype))
        out = start.at[coords].min(vals)
    else:
        raise ValueError(f"scatter_reduce reduce={reduce!r}")
    return _finish(out, scalar)


@lowers("aten.masked_scatter.default")
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    xb = jnp.broadcast_to(x, shape).reshape(-1)
    mb = jnp.broadcast_to(mask, shape).reshape(-1)
    src = source.reshape(-1).astype(x.dtype)
    if src.shape[0] == 0:
        return xb.reshape(shape)
    pos = jnp.cumsum(mb.astype(jnp.int32)) - 1
    pos = jnp.clip(pos, 0, src.shape[0] - 1)
    return jnp.where(mb, src[pos], xb).reshape(shape)


@lowers("torch2jax.masked_rows.default")
def masked_rows(x, indices):
    """x[mask] for a bool mask over x's leading dims, as capture bounds it when only masked_scatter reads it (see
    capture.data_dependent_shapes.MASKED_ROWS): the selected rows in order, then copies of the first row up to the
    mask's size."""
    (mask,) = indices
    rows = x.reshape(-1, *x.shape[mask.ndim:])
    flat = mask.reshape(-1)
    (index,) = jnp.nonzero(flat, size=flat.shape[0], fill_value=0)
    return rows[index]


@lowers("torch2jax.selected_rows.default", ctx=True)
def selected_rows(ctx, x, indices):
    """x[mask] for a bool mask over x's leading dims whose count torch proved static (the model checks it, e.g. its
    image features against its image tokens; capture.data_dependent_shapes.SELECTED_ROWS): the first so many
    selected rows, which are all of them whenever torch's own check holds."""
    (mask,) = indices
    rows = x.reshape(-1, *x.shape[mask.ndim:])
    (index,) = jnp.nonzero(mask.reshape(-1), size=ctx.out_shape[0], fill_value=0)
    ctx.check_example(ctx.node.meta.shape[0], jnp.count_nonzero(mask))  # a count taken from the example inputs
    return rows[index]


@lowers("aten.nonzero_static.default")
def nonzero_static(x, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), jnp.int32)
    if any(isinstance(d, int) and d == 0 for d in x.shape):  # jnp.nonzero pads an empty input with 0s
        return jnp.full((size, x.ndim), fill_value, jnp.int32)
    out = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(out, axis=1).astype(jnp.int32)


# nonzero and repeat_interleave(repeats) reach the interpreter when torch knows their output size without the
# values (an empty input; an explicit output_size), or when the conversion took the size from the example inputs
# (capture/example_path.py), which is then checked at run time; capture refuses the others.
@lowers("aten.nonzero.default", ctx=True)
def nonzero(ctx, x):
    ctx.check_example(ctx.node.meta.shape[0], jnp.count_nonzero(x))
    return nonzero_static(x, ctx.out_shape[0])


@lowers("aten.repeat_interleave.Tensor", ctx=True)
def repeat_interleave_counts(ctx, repeats, output_size=None):
    """Index i repeated repeats[i] times (torch's building block for repeat_interleave)."""
    positions = jnp.arange(repeats.shape[0], dtype=jnp.int32)
    ctx.check_example(ctx.node.meta.shape[0], jnp.sum(repeats))
    return jnp.repeat(positions, repeats, total_repeat_length=ctx.out_shape[0])


@lowers("aten.index_add.default")
def index_add(x, dim, index, source, alpha=1):
    if x.ndim == 0:
        x1 = x.reshape(1)
        src = jnp.asarray(source).reshape(-1)
        out = index_add(x1, 0, index.reshape(-1), src, alpha)
        return out.reshape(())
    dim = _dim(dim, x.ndim)
    source = source.astype(x.dtype)
    if alpha != 1:
        source = source * jnp.asarray(alpha, x.dtype)
    key = (slice(None),) * dim + (_wrap(index.reshape(-1), x.shape[dim]),)
    if source.ndim == 0:
        source = source.reshape(1)
    if x.dtype == jnp.bool_:
        return x.at[key].max(source)
    return x.at[key].add(source)


@lowers("aten.index_copy.default")
def index_copy(x, dim, index, source):
    if x.ndim == 0:
        return jnp.asarray(source, x.dtype).reshape(())
    dim = _dim(dim, x.ndim)
    key = (slice(None),) * dim + (_wrap(index.reshape(-1), x.shape[dim]),)
    if source.ndim == 0:
        source = source.reshape(1)
    return x.at[key].set(source.astype(x.dtype))


@lowers("aten.index_fill.int_Scalar", "aten.index_fill.int_Tensor")
def index_fill(x, dim, index, value):
    value = jnp.asarray(value).astype(x.dtype).reshape(())
    if x.ndim == 0:
        return jnp.where(index.size > 0, value, x)
    dim = _dim(dim, x.ndim)
    key = (slice(None),) * dim + (_wrap(index.reshape(-1), x.shape[dim]),)
    return x.at[key].set(value)


@lowers("aten.take.default")
def take(x, index):
    flat = x.reshape(-1)
    return flat[_wrap(index, flat.shape[0])]


@lowers("aten.put.default")
def put(x, index, source, accumulate=False):
    flat = x.reshape(-1)
    idx = _wrap(index.reshape(-1), flat.shape[0])
    src = source.reshape(-1).astype(x.dtype)
    if accumulate:
        out = flat.at[idx].max(src) if x.dtype == jnp.bool_ else flat.at[idx].add(src)
    else:
        out = flat.at[idx].set(src)
    return out.reshape(x.shape)


@lowers("aten.index_reduce.default")
def index_reduce(x, dim, index, source, reduce, include_self=True):
    if x.ndim == 0:
        return index_reduce(x.reshape(1), 0, index.reshape(-1), source.reshape(-1), reduce, include_self).reshape(())
    dim = _dim(dim, x.ndim)
    key = (slice(None),) * dim + (_wrap(index.reshape(-1), x.shape[dim]),)
    src = source.astype(x.dtype)
    if src.ndim == 0:
        src = src.reshape(1)
    is_bool = x.dtype == jnp.bool_
    if reduce == "prod":
        start = x if include_self else x.at[key].set(jnp.ones((), x.dtype))
        return start.at[key].min(src) if is_bool else start.at[key].multiply(src)
    if reduce == "amax":
        start = x if include_self else x.at[key].set(_lowest(x.dtype))
        return start.at[key].max(src)
    if reduce == "amin":
        start = x if include_self else x.at[key].set(_highest(x.dtype))
        return start.at[key].min(src)
    if reduce == "mean":
        start = x if include_self else x.at[key].set(jnp.zeros((), x.dtype))
        out = start.at[key].max(src) if is_bool else start.at[key].add(src)
        count = jnp.full((x.shape[dim],), 1 if include_self else 0, jnp.int32)
        count = jnp.maximum(count.at[key[-1]].add(1), 1)
        count = count.reshape((-1,) + (1,) * (x.ndim - dim - 1))
        if jnp.issubdtype(x.dtype, jnp.floating):
            return out / count.astype(x.dtype)
        if is_bool:
            return out
        return jnp.floor_divide(out, count.astype(x.dtype))
    raise ValueError(f"index_reduce reduce={reduce!r}")


@lowers("aten._embedding_bag.default", "aten._embedding_bag_forward_only.default")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
                  include_last_offset=False, padding_idx=-1):
    """Bags of embeddings reduced by sum (0), mean (1) or max (2); entries equal to padding_idx are left out.

    Returns torch's four outputs; only the first is the result, the others are bookkeeping
    (bag of each index, bag sizes, argmax rows for max mode) that torch keeps for its backward.
    """
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    positions = jnp.arange(indices.shape[0])
    bag = jnp.searchsorted(offsets[:num_bags], positions, side="right") - 1
    if include_last_offset:
        bag = jnp.where(positions < offsets[-1], bag, num_bags)  # past the last offset: dropped
    keep = (indices != padding_idx) if padding_idx is not None and padding_idx >= 0 else jnp.ones(indices.shape, bool)
    segment = jnp.where(keep, bag, num_bags)  # dropped entries go to an extra segment, discarded below
    rows = jnp.take(weight, indices, axis=0)
    if rows.dtype in (jnp.bfloat16, jnp.float16):
        rows = rows.astype(jnp.float32)  # torch accumulates low-precision bags in float32
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None].astype(rows.dtype)
    counts = jax.ops.segment_sum(keep.astype(jnp.int32), segment, num_segments=num_bags + 1)[:num_bags]
    if mode == 2:
        out = jax.ops.segment_max(rows, segment, num_segments=num_bags + 1)[:num_bags]
        out = jnp.where(counts[:, None] > 0, out, jnp.zeros((), rows.dtype))
        winners = jnp.where(rows == out[jnp.clip(segment, 0, num_bags - 1)], indices[:, None], -1)
        max_indices = jax.ops.segment_max(winners, segment, num_segments=num_bags + 1)[:num_bags]
    else:
        out = jax.ops.segment_sum(rows, segment, num_segments=num_bags + 1)[:num_bags]
        if mode == 1:
            out = out / jnp.maximum(counts, 1)[:, None].astype(out.dtype)
        max_indices = jnp.zeros((num_bags,), indices.dtype)
    return out.astype(weight.dtype), bag, counts, max_indices


@lowers("aten.embedding_renorm.default")
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows of `weight` used by `indices` whose p-norm exceeds max_norm are scaled to max_norm (torch adds 1e-7)."""
    used = jnp.zeros(weight.shape[0], bool).at[indices.reshape(-1)].set(True)
    norms = jnp.linalg.norm(weight.astype(jnp.float32), ord=norm_type, axis=1)
    scale = jnp.where(used & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return (weight * scale[:, None].astype(weight.dtype)).astype(weight.dtype)
