"""The memory behind a `jax` tensor: a mutable holder of one immutable JAX array.

JAX arrays cannot change, torch storages can, and views alias them. A torch tensor on `jax` is a
(storage, size, stride, offset) like any other; its torch storage holds no bytes, but carries a
`JaxStorage` (torch keeps one Python object per storage, so every view, `detach()` and `.data`
of a tensor finds the same holder). Reading a tensor gathers its elements from the holder's
array; writing through a view scatters into it and replaces the array, so the base and every
other view see the change, as on CPU.

The holder's array has any shape whose row-major order is the storage's element order (the
shape of the tensor that wrote it last, usually), so the common case, a fresh contiguous tensor,
reads with no work at all.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ir import dtypes

_ATTRIBUTE = "_torch2jax_storage"


class JaxStorage:
    """`array` holds `numel` elements of `dtype` in row-major order; None until first written."""

    __slots__ = ("array", "numel", "dtype", "__weakref__")

    def __init__(self, numel: int, dtype: np.dtype, array: jax.Array | None = None):
        self.numel = numel
        self.dtype = np.dtype(dtype)
        self.array = array

    def materialized(self) -> jax.Array:
        """The array, allocating zeros for storage that was never written (torch.empty's contents)."""
        if self.array is None:
            self.array = jnp.zeros((self.numel,), self.dtype)
        return self.array


def attach(tensor: Any, storage: JaxStorage) -> None:
    setattr(tensor.untyped_storage(), _ATTRIBUTE, storage)


def storage_of(tensor: Any) -> JaxStorage:
    holder = getattr(tensor.untyped_storage(), _ATTRIBUTE, None)
    if holder is None:
        raise RuntimeError(
            "this jax tensor has no torch2jax storage (it was not created by torch2jax.eager); "
            "create jax tensors with torch factory functions, .to('jax') or torch2jax.eager.torch_view"
        )
    return holder


def read(tensor: Any) -> jax.Array:
    """The tensor's elements as a JAX array of its shape."""
    holder = storage_of(tensor)
    array = holder.materialized()
    shape = tuple(tensor.shape)
    offset = tensor.storage_offset()
    want = numpy_dtype(tensor.dtype)
    if not (offset == 0 and array.shape == shape and want == holder.dtype and tensor.is_contiguous()):
        if want != holder.dtype:  # view_as_real / view_as_complex / view(dtype): the same bytes
            array = _reinterpret(array.reshape(-1), want)
        array = _reader(array.shape, array.dtype, shape, tuple(tensor.stride()), offset)(array)
    return _lazy_bits(tensor, array)


def _lazy_bits(tensor: Any, array: jax.Array) -> jax.Array:
    """torch's lazy conjugate and negative views (`conj()`, `_neg_view()`) are flags on the tensor:
    kernels that accept them (copy_, views) see the flagged tensor, so values read through one
    carry the flag's effect. Involutions: writing applies them the same way."""
    if tensor.is_conj():
        array = jnp.conj(array)
    if tensor.is_neg():
        array = -array
    return array


def write(tensor: Any, value: jax.Array) -> None:
    """Store `value` (the tensor's shape and dtype) into the elements the tensor views."""
    holder = storage_of(tensor)
    value = _lazy_bits(tensor, value)
    shape = tuple(tensor.shape)
    offset = tensor.storage_offset()
    want = numpy_dtype(tensor.dtype)
    if want != holder.dtype:  # through a view of the same bytes as another dtype
        array = _reinterpret(holder.materialized().reshape(-1), want)
        array = _writer(array.shape, array.dtype, shape, tuple(tensor.stride()), offset)(array, value)
        holder.array = _reinterpret(array, holder.dtype)
        return
    numel = int(np.prod(shape, dtype=np.int64))
    if offset == 0 and numel == holder.numel and tensor.is_contiguous():
        holder.array = value  # the whole storage, in order: the value is the new contents
        return
    array = holder.materialized()
    holder.array = _writer(array.shape, array.dtype, shape, tuple(tensor.stride()), offset)(array, value)


@functools.cache
def numpy_dtype(torch_dtype: Any) -> np.dtype:
    """The numpy / JAX dtype of a torch dtype, exactly (int64 stays int64)."""
    return dtypes.numpy_dtype(str(torch_dtype).removeprefix("torch."))


def _reinterpret(flat: jax.Array, dtype: np.dtype) -> jax.Array:
    """A flat array's bytes as `dtype`: a bitcast, or complex <-> (real, imag) pairs."""
    source = np.dtype(flat.dtype)
    if source.itemsize == dtype.itemsize:
        return jax.lax.bitcast_convert_type(flat, dtype)
    if dtype.kind == "c" and source.kind == "f" and dtype.itemsize == 2 * source.itemsize:
        pairs = flat.reshape(-1, 2)
        return jax.lax.complex(pairs[:, 0], pairs[:, 1]).astype(dtype)
    if source.kind == "c" and dtype.kind == "f" and source.itemsize == 2 * dtype.itemsize:
        return jnp.stack([jnp.real(flat), jnp.imag(flat)], axis=-1).reshape(-1).astype(dtype)
    raise NotImplementedError(
        f"the jax device cannot read storage of {source} as {dtype} (Tensor.view(dtype) between "
        "sizes other than complex <-> float pairs); copy with .to(dtype) instead"
    )


def contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def _flat_indices(shape: tuple, strides: tuple, offset: int) -> np.ndarray:
    """Storage index of every element of an as_strided view, in the view's row-major order."""
    index = np.full(shape, offset, dtype=np.int64)
    for dim, (size, stride) in enumerate(zip(shape, strides)):
        axis_shape = [1] * len(shape)
        axis_shape[dim] = size
        index = index + (np.arange(size, dtype=np.int64) * stride).reshape(axis_shape)
    # int32 where it fits: an int64 constant makes the jitted gather depend on whether x64 is on when it is traced
    # (traced once with it off, a later trace with it on mixed int32 and int64 index arithmetic and failed)
    return index.astype(np.int32) if index.size == 0 or index.max() < np.iinfo(np.int32).max else index


def _is_dense_block(shape: tuple, strides: tuple) -> bool:
    return all(st == c for size, st, c in zip(shape, strides, contiguous_strides(shape)) if size != 1)


@functools.lru_cache(maxsize=4096)
def _reader(array_shape: tuple, dtype: np.dtype, shape: tuple, strides: tuple, offset: int):
    """A jitted gather of one view layout from the storage array (a slice when the view is dense)."""
    numel = int(np.prod(shape, dtype=np.int64))
    if _is_dense_block(shape, strides):
        def read_dense(array):
            return jax.lax.slice(array.reshape(-1), (offset,), (offset + numel,)).reshape(shape)

        return jax.jit(read_dense)
    index = _flat_indices(shape, strides, offset)

    def gather(array):
        return array.reshape(-1)[index]

    return jax.jit(gather)


@functools.lru_cache(maxsize=4096)
def _writer(array_shape: tuple, dtype: np.dtype, shape: tuple, strides: tuple, offset: int):
    """A jitted scatter of a view's new values into the storage array (a slice update when dense)."""
    if _is_dense_block(shape, strides):
        def write_dense(array, value):
            flat = jax.lax.dynamic_update_slice(array.reshape(-1), value.reshape(-1).astype(array.dtype), (offset,))
            return flat.reshape(array_shape)

        return jax.jit(write_dense)
    index = _flat_indices(shape, strides, offset).reshape(-1)

    def scatter(array, value):
        return array.reshape(-1).at[index].set(value.reshape(-1).astype(array.dtype)).reshape(array_shape)

    return jax.jit(scatter)
