"""Shape and view ops: view/reshape, permute, expand, cat, split, slice, squeeze, creation ops.

Views are values in JAX: a view op returns a new array, and in-place semantics are handled by
torch.export's functionalization before the graph reaches us.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.errors import InconclusiveDimensionOperation

from .registry import lowers


@lowers("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def view(x, size):
    return jnp.reshape(x, tuple(size))


@lowers("aten.permute.default")
def permute(x, dims):
    return jnp.transpose(x, tuple(dims))


@lowers("aten.t.default")
def t(x):
    return x.T if x.ndim == 2 else x


@lowers("aten.transpose.int")
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, dim0, dim1)


@lowers("aten.expand.default")
def expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


@lowers("aten.unsqueeze.default")
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim if dim >= 0 else x.ndim + 1 + dim)


@lowers("aten.squeeze.dims", "aten.squeeze.dim")
def squeeze(x, dim):
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = [d % x.ndim for d in dims] if x.ndim else []
    return jnp.squeeze(x, tuple(d for d in dims if x.shape[d] == 1))


@lowers("aten.squeeze.default")
def squeeze_all(x):
    return jnp.squeeze(x)


@lowers("aten.cat.default")
def cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or tensors[:1]
    dtype = jnp.result_type(*tensors)
    return jnp.concatenate([t.astype(dtype) for t in tensors], axis=dim)


@lowers("aten.split_with_sizes.default")
def split_with_sizes(x, split_sizes, dim=0):
    out, start = [], 0
    for size in split_sizes:
        out.append(lax.slice_in_dim(x, start, start + size, axis=dim))
        start = start + size
    return out


@lowers("aten.split.Tensor")
def split(x, split_size, dim=0):
    length = x.shape[dim]
    sizes = [min(split_size, length - s) for s in range(0, length, split_size)] if split_size else []
    sizes = sizes or [length]
    return split_with_sizes(x, sizes, dim)


@lowers("aten.slice.Tensor")
def slice_(x, dim=0, start=None, end=None, step=1):
    size = x.shape[dim]
    start = 0 if start is None else start
    end = size if end is None else end
    start = _clamp_index(start, size)
    end = _clamp_index(end, size)
    if isinstance(start, int) and isinstance(end, int) and end < start:
        end = start
    try:
        return lax.slice_in_dim(x, start, end, step, axis=dim)
    except InconclusiveDimensionOperation:
        if step != 1:
            raise
    # bounds jax cannot order against the size, such as the last `batch` of `batch * (span + 1)` (NLLB-MoE's
    # x[-tokens:]): torch.export has already checked them, so gather the run of indices they name
    start, end = (size + i if i < 0 else i for i in (start, end))  # a sign jax cannot tell raises here still
    return jnp.take(x, jnp.arange(end - start) + jnp.asarray(start), axis=dim)


def _clamp_index(i, size):
    """torch slice bounds: negatives count from the end, everything clamps into [0, size]."""
    if not isinstance(i, int):
        return i
    if isinstance(size, int):
        if i < 0:
            i += size
        return max(0, min(i, size))
    if i < 0:
        return size + i
    return i if i < 2**62 else size


@lowers("aten.select.int")
def select(x, dim, index):
    return lax.index_in_dim(x, index if index >= 0 else x.shape[dim] + index, axis=dim, keepdims=False)


@lowers("aten.full.default")
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, dtype=dtype)


@lowers("aten.full_like.default")
def full_like(x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(x.shape, fill_value, dtype=dtype or x.dtype)


@lowers("aten.zeros.default")
def zeros(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=dtype or jnp.float32)


@lowers("aten.ones.default")
def ones(size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), dtype=dtype or jnp.float32)


@lowers("aten.empty.memory_format")
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(tuple(size), dtype=dtype or jnp.float32)


@lowers("aten.empty_strided.default")
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=dtype or jnp.float32)


@lowers("aten.arange.start_step", ctx=True)
def arange(ctx, start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    """start + i * step, computed as torch does: in the dtype's accumulate type (int64 for
    integers, double for float32, float for 16-bit floats), then rounded once to the result."""
    (length,) = ctx.out_shape
    out_dtype = ctx.out_dtype
    integer = not jnp.issubdtype(out_dtype, jnp.floating)
    if integer:
        start, step = int(start), int(step)
    if isinstance(length, int) and isinstance(start, (int, float)) and isinstance(step, (int, float)):
        if integer:
            values = np.arange(length, dtype=np.int64) * step + start
        else:
            acc = np.float64 if np.dtype(out_dtype).itemsize >= 4 else np.float32
            values = acc(start) + acc(step) * np.arange(length, dtype=acc)
        return jnp.asarray(values.astype(out_dtype) if out_dtype != jnp.bfloat16 else values.astype(np.float32).astype(out_dtype))
    if integer:
        return (lax.iota(jnp.int32, length) * step + start).astype(out_dtype)
    return (lax.iota(jnp.float32, length) * step + start).astype(out_dtype)


@lowers("aten.arange.default", "aten.arange.start", ctx=True)
def arange_simple(ctx, *args, dtype=None, layout=None, device=None, pin_memory=None):
    start = args[0] if len(args) == 2 else 0
    return arange(ctx, start, args[-1], 1, dtype)


@lowers("aten.constant_pad_nd.default")
def constant_pad_nd(x, pad, value=0):
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        axis = x.ndim - 1 - i
        config[axis] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


# --- more views and view copies ------------------------------------------------------------------


def _ax(dim, ndim):
    return dim % ndim if ndim else 0


@lowers("aten.view_copy.default")
def view_copy(x, size):
    return view(x, size)


@lowers("aten.permute_copy.default")
def permute_copy(x, dims):
    return permute(x, dims)


@lowers("aten.unbind.int", "aten.unbind_copy.int")
def unbind(x, dim=0):
    dim = _ax(dim, x.ndim)
    return [lax.index_in_dim(x, i, axis=dim, keepdims=False) for i in range(x.shape[dim])]


@lowers("aten.flip.default")
def flip(x, dims):
    if x.ndim == 0:
        return x
    return jnp.flip(x, axis=tuple(sorted({_ax(d, x.ndim) for d in dims})))


@lowers("aten.repeat.default")
def repeat(x, repeats):
    repeats = tuple(repeats)
    x = jnp.reshape(x, (1,) * (len(repeats) - x.ndim) + tuple(x.shape))
    return jnp.tile(x, repeats)


@lowers("aten.diagonal.default", "aten.diagonal_copy.default")
def diagonal(x, offset=0, dim1=0, dim2=1):
    d1, d2 = _ax(dim1, x.ndim), _ax(dim2, x.ndim)
    rows, cols = _diag_coords(x.shape[d1], x.shape[d2], offset)
    xt = jnp.moveaxis(x, (d1, d2), (-2, -1))
    return xt[..., rows, cols]


def _diag_coords(n1, n2, offset):
    if offset >= 0:
        length = max(0, min(n1, n2 - offset))
        rows = np.arange(length)
        cols = rows + offset
    else:
        length = max(0, min(n1 + offset, n2))
        cols = np.arange(length)
        rows = cols - offset
    return rows.astype(np.int32), cols.astype(np.int32)


@lowers("aten.diagonal_scatter.default")
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    d1, d2 = _ax(dim1, x.ndim), _ax(dim2, x.ndim)
    rows, cols = _diag_coords(x.shape[d1], x.shape[d2], offset)
    xt = jnp.moveaxis(x, (d1, d2), (-2, -1))
    xt = xt.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(xt, (-2, -1), (d1, d2))


@lowers("aten.unfold.default", "aten.unfold_copy.default")
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return jnp.broadcast_to(x, (size,))
    dim = _ax(dimension, x.ndim)
    count = (x.shape[dim] - size) // step + 1
    idx = (np.arange(count) * step)[:, None] + np.arange(size)[None, :]
    out = jnp.take(x, jnp.asarray(idx.astype(np.int32)), axis=dim)  # (..., count, size, ...)
    return jnp.moveaxis(out, dim + 1, -1)


@lowers("aten.narrow_copy.default", "aten.narrow.default")
def narrow_copy(x, dim, start, length):
    dim = _ax(dim, x.ndim)
    if isinstance(start, int) and start < 0:
        start += x.shape[dim]
    return lax.slice_in_dim(x, start, start + length, axis=dim)


@lowers("aten.slice_copy.Tensor")
def slice_copy(x, dim=0, start=None, end=None, step=1):
    return slice_(x, dim, start, end, step)


@lowers("aten.select_copy.int")
def select_copy(x, dim, index):
    return select(x, dim, index)


@lowers("aten.slice_scatter.default")
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    if x.ndim == 0:
        return src.astype(x.dtype).reshape(())
    dim = _ax(dim, x.ndim)
    size = x.shape[dim]
    start = _clamp_index(0 if start is None else start, size)
    end = _clamp_index(size if end is None else end, size)
    if isinstance(start, int) and isinstance(end, int) and end < start:
        end = start
    key = (slice(None),) * dim + (slice(start, end, step),)
    return x.at[key].set(src.astype(x.dtype))


@lowers("aten.select_scatter.default")
def select_scatter(x, src, dim, index):
    dim = _ax(dim, x.ndim)
    if isinstance(index, int) and index < 0:
        index += x.shape[dim]
    key = (slice(None),) * dim + (index,)
    return x.at[key].set(src.astype(x.dtype))


def _strided_positions(size, stride, storage_offset):
    storage_offset = 0 if storage_offset is None else storage_offset
    pos = np.full(tuple(size), storage_offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        pos = pos + (np.arange(n) * s).reshape(shape)
    return pos


@lowers("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(x, size, stride, storage_offset=None):
    """Reads x's elements as if x were a contiguous buffer (inputs and fresh tensors are)."""
    if not storage_offset and _is_row_major(size, stride) and _same(math.prod(x.shape), math.prod(size)):
        return x.reshape(tuple(size))  # a plain reshape: also works for symbolic sizes
    pos = _strided_positions(size, stride, storage_offset)
    return x.reshape(-1)[jnp.asarray(pos.astype(np.int32))] if pos.size else jnp.zeros(tuple(size), x.dtype)


@lowers("torch2jax.as_strided_view.default")
def as_strided_view(x, size, stride, storage_offset, view_stride, view_offset):
    """as_strided of a view whose elements do not lie in row-major order in their storage (a transposed tensor viewed
    as another shape; capture.fx.STRIDED_VIEW): torch reads the storage, so each position read is first mapped back to
    the element of x that lies there (x's own strides and offset, recorded at capture)."""
    lies_at = _strided_positions(x.shape, view_stride, view_offset).reshape(-1)
    element_at = np.full(int(lies_at.max()) + 1 if lies_at.size else 0, -1, np.int64)
    element_at[lies_at] = np.arange(lies_at.size)
    read = _strided_positions(size, stride, view_offset if storage_offset is None else storage_offset)
    if read.size and (read.max() >= element_at.size or (element_at[read] < 0).any()):
        raise ValueError("as_strided reads storage outside the view it is given, which a JAX array does not have")
    return x.reshape(-1)[jnp.asarray(element_at[read].astype(np.int32))] if read.size else jnp.zeros(tuple(size), x.dtype)


def _is_row_major(size, stride) -> bool:
    """True when `stride` is the contiguous layout of `size` (strides of size-1 dims do not matter)."""
    expected = 1
    for dim, step in reversed(list(zip(size, stride))):
        if isinstance(dim, int) and dim == 1:
            continue
        if not _same(step, expected):
            return False
        expected = expected * dim
    return True


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # symbolic dims that cannot be compared
        return False


@lowers("aten.resize.default")
def resize(x, size, memory_format=None):
    """Functional `resize_`: the first numel(size) elements of x's buffer, read in the new layout.

    Like as_strided, x is taken as a contiguous buffer (inputs and fresh tensors are). Shrinking keeps
    the leading elements; growing leaves torch's new elements uninitialized, and we fill them with 0.
    A channels-last `memory_format` lays the buffer out as N(D)HWC.
    """
    size = tuple(size)
    if _same(math.prod(x.shape), math.prod(size)) and memory_format in (None, "contiguous_format"):
        return x.reshape(size)  # also works for symbolic sizes
    n = math.prod(size)
    flat = x.reshape(-1)
    flat = flat[:n] if n <= flat.shape[0] else jnp.concatenate([flat, jnp.zeros((n - flat.shape[0],), x.dtype)])
    if memory_format in ("channels_last", "channels_last_3d") and len(size) in (4, 5):
        physical = (size[0], *size[2:], size[1])
        return jnp.moveaxis(flat.reshape(physical), -1, 1)
    return flat.reshape(size)


@lowers("aten.as_strided_scatter.default")
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    pos = _strided_positions(size, stride, storage_offset)
    if pos.size == 0:
        return x
    flat = x.reshape(-1).at[jnp.asarray(pos.reshape(-1).astype(np.int32))].set(src.reshape(-1).astype(x.dtype))
    return flat.reshape(x.shape)


@lowers("aten.sym_storage_offset.default")
def sym_storage_offset(x):
    return 0


@lowers("aten.copy.default")
def copy(x, src, non_blocking=False):
    return jnp.broadcast_to(jnp.asarray(src).astype(x.dtype), x.shape)


@lowers("aten.fill.Scalar", "aten.fill.Tensor")
def fill(x, value):
    return jnp.full(x.shape, jnp.asarray(value).astype(x.dtype).reshape(()), dtype=x.dtype)


@lowers("aten.zeros_like.default", "aten.empty_like.default")
def zeros_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, dtype=dtype or x.dtype)


@lowers("aten.ones_like.default")
def ones_like(x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, dtype=dtype or x.dtype)


@lowers("aten.empty_permuted.default")
def empty_permuted(size, physical_layout, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=dtype or jnp.float32)


@lowers("aten.new_empty_strided.default")
def new_empty_strided(x, size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=dtype or x.dtype)


@lowers("aten.new_empty.default", "aten.new_zeros.default")
def new_zeros(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), dtype=dtype or x.dtype)


@lowers("aten.new_ones.default")
def new_ones(x, size, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), dtype=dtype or x.dtype)


@lowers("aten.new_full.default")
def new_full(x, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, dtype=dtype or x.dtype)


def _tri_indices(np_fn, row, col, offset, dtype):
    r, c = np_fn(row, offset, col)
    return jnp.asarray(np.stack([r, c]).astype(np.int64)).astype(dtype or jnp.int32)


@lowers("aten.triu_indices.default")
def triu_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(np.triu_indices, row, col, offset, dtype)


@lowers("aten.tril_indices.default")
def tril_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(np.tril_indices, row, col, offset, dtype)


# --- padding ---------------------------------------------------------------------------------------


def _pad_mode(x, padding, mode):
    """Pad the last len(padding)//2 dims; padding is torch's (last_lo, last_hi, prev_lo, ...).
    Negative amounts crop first, then jnp.pad extends (reflect: mirror without the edge; edge:
    replicate; wrap: circular)."""
    n = len(padding) // 2
    config = [(0, 0)] * x.ndim
    crop = [slice(None)] * x.ndim
    for i in range(n):
        axis = x.ndim - 1 - i
        lo, hi = padding[2 * i], padding[2 * i + 1]
        size = x.shape[axis]
        crop[axis] = slice(max(-lo, 0), size - max(-hi, 0))
        config[axis] = (max(lo, 0), max(hi, 0))
    x = x[tuple(crop)]
    return jnp.pad(x, config, mode=mode)


@lowers("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default")
def reflection_pad(x, padding):
    return _pad_mode(x, padding, "reflect")


@lowers("aten.replication_pad1d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default")
def replication_pad(x, padding):
    return _pad_mode(x, padding, "edge")


@lowers("aten._pad_circular.default")
def pad_circular(x, pad):
    return _pad_mode(x, pad, "wrap")
