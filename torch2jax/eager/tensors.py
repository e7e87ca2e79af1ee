"""torch tensors on the `jax` device <-> JAX arrays, and the arguments of an op in both worlds."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..capture.torch_arrays import to_jax
from . import storage
from .storage import JaxStorage, numpy_dtype

DEVICE = "jax"


def is_jax(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == DEVICE


def wrap(array: Any, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A fresh contiguous `jax` tensor holding `array` (cast to `dtype` when given)."""
    array = jnp.asarray(array)
    if dtype is None:
        dtype = _torch_dtype(array.dtype)
    want = numpy_dtype(dtype)
    if array.dtype != want:
        array = array.astype(want)
    tensor = torch._C._acc.create_empty_tensor(array.shape, dtype)
    storage.attach(tensor, JaxStorage(int(np.prod(array.shape, dtype=np.int64)), want, array))
    return tensor


def empty(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous `jax` tensor whose storage is allocated (as zeros) only when first read."""
    tensor = torch._C._acc.create_empty_tensor(shape, dtype)
    storage.attach(tensor, JaxStorage(int(np.prod(shape, dtype=np.int64)), numpy_dtype(dtype)))
    return tensor


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    from ..ir.dtypes import name_of

    return getattr(torch, name_of(dtype))


def same_device_error(devices: list) -> RuntimeError:
    """torch's own message for an op over tensors on two devices."""
    first, second = devices[0], next(d for d in devices if d != devices[0])
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {first} and {second}!"
    )


def to_jax_args(value: Any, devices: list) -> Any:
    """An op's argument as its lowering takes it: tensors as arrays, dtypes as numpy dtypes.

    A 0-dim CPU tensor is a scalar, allowed beside device tensors as torch allows it; any other
    tensor from another device is collected in `devices` for torch's same-device error.
    """
    if isinstance(value, torch.Tensor):
        if value.device.type == DEVICE:
            return storage.read(value)
        if value.dim() == 0 and value.device.type == "cpu":
            return to_jax(value)
        devices.append(value.device)
        return None
    if isinstance(value, (list, tuple)):
        return type(value)(to_jax_args(v, devices) for v in value)
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
