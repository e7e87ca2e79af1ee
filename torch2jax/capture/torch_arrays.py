"""Moving arrays between torch and numpy/JAX (convert half), bfloat16 included."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..ir.dtypes import numpy_dtype
from .fx import dtype_name

_BITCAST = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.int8, torch.float8_e5m2: torch.int8}


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor (no copy when possible), exact for bfloat16 and float8."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype in _BITCAST:
        return tensor.contiguous().view(_BITCAST[tensor.dtype]).numpy().view(numpy_dtype(dtype_name(tensor.dtype)))
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    return tensor.numpy()


def to_torch(array) -> torch.Tensor:
    """A torch tensor holding the same values as a numpy/JAX array."""
    array = np.asarray(array)
    if array.dtype == np.dtype(jnp.bfloat16):
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(array, copy=True))


def torch_view(array: np.ndarray) -> torch.Tensor:
    """A torch tensor over the array's own memory (a memory map stays one), exact for bfloat16 and float8."""
    for torch_dtype, carrier in _BITCAST.items():
        if array.dtype == numpy_dtype(dtype_name(torch_dtype)):
            return torch.from_numpy(array.view(numpy_dtype(dtype_name(carrier)))).view(torch_dtype)
    return torch.from_numpy(array)


_XLA_ALIGNMENT = 64  # XLA:CPU adopts a host buffer without copying when it is this aligned


def to_jax(tensor: torch.Tensor):
    """A JAX array with its own copy of the values, made once.

    On CPU, device_put may alias a numpy array's memory, and `to_numpy` is a view of the torch
    tensor: without the copy, torch's in-place updates (a BatchNorm step, an optimizer) would
    change the "immutable" JAX params. The copy goes into a 64-byte-aligned buffer that
    device_put then adopts, so a weight costs one copy, not a copy plus XLA's own (peak memory
    of converting a large model). device_put, not jnp.asarray: asarray compiles a copy per
    distinct shape, which dominated lowering time.
    """
    return jax.device_put(_aligned_copy(to_numpy(tensor)))


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    raw = np.empty(array.nbytes + _XLA_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _XLA_ALIGNMENT
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(out, array)
    return out
