"""torch tensors on the `jax` device <-> JAX arrays, and the arguments of an op in both worlds."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from . import storage
from .storage import JaxStorage, numpy_dtype

DEVICE = "jax"


def is_jax(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == DEVICE


def wrap(array: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh contiguous `jax` tensor holding `array` (cast to `dtype` when given)."""
    array = as_array(array)
    if dtype is None:
        dtype = _torch_dtype(array.dtype)
    want = numpy_dtype(dtype)
    if array.dtype != want:
        array = array.astype(want)
    return _new_tensor(array.shape, dtype, JaxStorage(int(np.prod(array.shape, dtype=np.int64)), want, array))


def as_array(value: Any) -> jax.Array:
    """`value` as a JAX array (jnp.asarray costs ~12 us even on a JAX array: checked first)."""
    return value if isinstance(value, jax.Array) else jnp.asarray(value)


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2, "c": 3}  # V: bfloat16, float8


def scalar_dtype(dtype: np.dtype, like: np.dtype | None) -> np.dtype:
    """A CPU scalar takes the dtype of the device tensor beside it when torch's promotion would
    (a scalar of the same or a lower kind), so the lowering needs no conversion on the device."""
    if like is not None and _CATEGORY.get(dtype.kind, 9) <= _CATEGORY.get(like.kind, -1):
        return like
    return dtype


def first_dtype(args: tuple) -> np.dtype | None:
    """The dtype of the first `jax` tensor argument."""
    for value in args:
        if isinstance(value, torch.Tensor) and value.device.type == DEVICE:
            return numpy_dtype(value.dtype)
    return None


_TRACING: list = []  # non-empty while te.jit / jit_train_step trace a program


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    """Scalars become numpy constants, not device arrays, while a program is traced (a device
    array closed over by a nested jax.value_and_grad trace is mis-passed by jax.jit's fast path)."""
    _TRACING.append(True)
    try:
        yield
    finally:
        _TRACING.pop()


def scalar_array(value: Any, dtype: np.dtype) -> Any:
    """A 0-dim array of `value`: on the device, cached (moving a scalar costs ~40 us, and the same
    constants, 1, 2, 0.5, a learning rate, come back op after op); numpy while tracing."""
    if _TRACING:
        return np.asarray(value, dtype)
    return _device_scalar(value, dtype)


@functools.lru_cache(maxsize=4096)
def _device_scalar(value: Any, dtype: np.dtype) -> jax.Array:
    return jax.device_put(np.asarray(value, dtype))


def empty(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous `jax` tensor whose storage is allocated (as zeros) only when first read."""
    return _new_tensor(shape, dtype, JaxStorage(int(np.prod(shape, dtype=np.int64)), numpy_dtype(dtype)))


_META = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


def _new_tensor(shape: tuple, dtype: torch.dtype, holder: JaxStorage) -> torch.Tensor:
    """A contiguous jax tensor over `holder`. Its torch storage holds no bytes but says it has the
    tensor's size (meta's set_ sets only the count), so torch's bounds checks on views pass."""
    tensor = torch._C._acc.create_empty_tensor(shape, dtype)
    if holder.numel:
        torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
            _META, tensor, tensor.untyped_storage(), 0, shape, tensor.stride())
    storage.attach(tensor, holder)
    tensor.untyped_storage().__deepcopy__ = functools.partial(_deepcopy_storage, holder, dtype)
    return tensor


def _deepcopy_storage(holder: JaxStorage, dtype: torch.dtype, memo: dict) -> Any:
    """copy.deepcopy of a jax storage (deepcopy of a module, a state dict): a new storage holding the
    same array, which is immutable, so sharing it is a copy. torch's own would copy bytes that are not
    there. Storages shared by several tensors are copied once, as torch does."""
    copies = memo.setdefault("torch2jax", {})
    if id(holder) not in copies:
        new = JaxStorage(holder.numel, holder.dtype, holder.array)
        copies[id(holder)] = _new_tensor((holder.numel,), dtype, new).untyped_storage()
    return copies[id(holder)]


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    from ..ir.dtypes import name_of

    return getattr(torch, name_of(dtype))


def same_device_error(devices: list) -> RuntimeError:
    """torch's own message for an op over tensors on two devices."""
    first, second = devices[0], next(d for d in devices if d != devices[0])
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {first} and {second}!"
    )


def to_jax_args(value: Any, devices: list, like: np.dtype | None = None) -> Any:
    """An op's argument as its lowering takes it: tensors as arrays, dtypes as numpy dtypes.

    A 0-dim CPU tensor is a scalar, allowed beside device tensors as torch allows it; any other
    tensor from another device is collected in `devices` for torch's same-device error.
    """
    if isinstance(value, torch.Tensor):
        if value.device.type == DEVICE:
            return storage.read(value)
        if value.dim() == 0 and value.device.type == "cpu":  # a scalar, as `x * 2` passes 2
            return scalar_array(value.item(), scalar_dtype(numpy_dtype(value.dtype), like))
        devices.append(value.device)
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(to_jax_args(v, devices, like) for v in value)
    if isinstance(value, torch.dtype):
        return numpy_dtype(value)
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, (torch.layout, torch.memory_format)):
        return str(value).removeprefix("torch.")
    if isinstance(value, torch.Generator):
        return None
    return value


def check_devices(devices: list) -> None:
    """Raise torch's error when a non-scalar tensor of another device was passed."""
    if devices:
        raise same_device_error([torch.device(DEVICE, 0), *devices])


def from_jax(array: jax.Array) -> torch.Tensor:
    """Public `torch_view`: a `jax` tensor over an existing JAX array (no copy)."""
    if not isinstance(array, jax.Array):
        array = jnp.asarray(array)
    return wrap(array)
