"""Shape and view ops: view/reshape, permute, expand, cat, split, slice, squeeze, creation ops.

Views are values in JAX: a view op returns a new array, and in-place semantics are handled by
torch.export's functionalization before the graph reaches us.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..registry import lowers


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
    sizes = [min(split_size, length - s) for s in range(0, length, split_size)]
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
    return lax.slice_in_dim(x, start, end, step, axis=dim)


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
    (length,) = ctx.out_shape
    out_dtype = ctx.out_dtype
    if dtype is None and all(isinstance(v, int) for v in (start, step)):
        return (lax.iota(out_dtype, length) * step + start).astype(out_dtype)
    return (lax.iota(jnp.float32 if out_dtype != jnp.float64 else out_dtype, length) * step + start).astype(out_dtype)


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
