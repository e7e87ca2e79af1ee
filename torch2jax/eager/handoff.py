"""Tensors across the torch <-> JAX line on CPU, at the cost of a call rather than of a conversion.

Long-lived tensors (parameters, buffers) become JAX arrays once per tensor version, zero-copy by
DLPack; a tensor that is new on every call (an input, a saved activation) goes into `jax.jit` as a
numpy view, which jit's C++ path copies faster than any Python-side conversion (2 us against 20 us
for a DLPack import of a 64x64 float32). Results come back as torch views of the JAX buffers.
"""

from __future__ import annotations

import warnings
import weakref

import jax
import numpy as np
import torch

from ..capture.torch_arrays import to_numpy


class InputSlot:
    """One tensor input position of a compiled graph: the JAX array of the tensor last seen there.

    The array is reused while the same tensor object comes back at the same `_version` (an optimizer
    step or a buffer write-back bumps it). A tensor seen at this position for the first time is
    handed over per call unless it is a Parameter; seen again, it is a buffer and is cached too.
    """

    __slots__ = ("_ref", "_version", "_array")

    def __init__(self):
        self._ref = None
        self._version = -1
        self._array = None

    def value(self, tensor: torch.Tensor | None, long_lived: bool = False):
        """`long_lived`: the position holds a parameter or buffer (aot_autograd's static inputs), shared from
        the first call: a numpy view there would be copied by jit on every call (a ResNet's BatchNorm
        statistics cost 50 us a call that way)."""
        if not isinstance(tensor, torch.Tensor):  # an optional tensor input left out
            return tensor
        ref = self._ref
        same = ref is not None and ref() is tensor
        if same and self._array is not None and tensor._version == self._version:
            return self._array
        if not (same or long_lived or isinstance(tensor, torch.nn.Parameter)):
            self._ref, self._array = weakref.ref(tensor), None
            return per_call(tensor)
        self._ref, self._version, self._array = weakref.ref(tensor), tensor._version, shared(tensor)
        return self._array


def per_call(tensor: torch.Tensor):
    """What jit takes for a tensor it sees once: a numpy view (bfloat16 included)."""
    return to_numpy(tensor)


def shared(tensor: torch.Tensor) -> jax.Array:
    """A JAX array over the tensor's memory (DLPack), copied only where XLA needs other strides."""
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    try:
        return jax.dlpack.from_dlpack(tensor)
    except Exception:  # broadcast or sliced strides: XLA takes compact layouts only
        return jax.dlpack.from_dlpack(tensor.contiguous())


_quiet = [False]


def to_tensor(array) -> torch.Tensor:
    """A torch tensor viewing a JAX result's buffer (the JAX array stays alive as its base)."""
    if array.dtype == jax.numpy.bfloat16 or array.dtype.itemsize == 1 and array.dtype.kind == "f":
        return torch.from_dlpack(array)
    host = np.asarray(array)
    if not _quiet[0]:  # torch warns once that the view is read-only to numpy; the JAX buffer is ours alone
        _quiet[0] = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(host)
    return torch.from_numpy(host)
