"""Params known by shape and dtype whose values are read only when the artifact is written.

A streamed conversion (capture/streaming.py) holds no weights: each param is a `DeferredArray`
that reads its values from the checkpoint files on demand, so saving writes them in batches of
bounded bytes and peak memory does not grow with the model.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import Torch2JaxError


class DeferredArray:
    """shape + dtype now, values from `read()` later (a fresh numpy array each call)."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, read: Callable[[], np.ndarray], source: str = ""):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self._read = read
        self.source = source  # where the values come from, for messages

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def read(self) -> np.ndarray:
        values = self._read()
        if values.shape != self.shape or values.dtype != self.dtype:
            raise Torch2JaxError(f"{self.source} gave {values.dtype}{list(values.shape)}, expected {self.dtype}{list(self.shape)}")
        return values

    def __array__(self, *args, **kwargs):
        raise Torch2JaxError(
            "this param's weights were not loaded: the conversion streamed them from the checkpoint files and they are "
            "written when the model is saved. Save it (torch2jax.save) and torch2jax.load the artifact to run it"
        )

    def __repr__(self) -> str:
        return f"DeferredArray({self.dtype}{list(self.shape)} from {self.source})"


def is_deferred(value: object) -> bool:
    return isinstance(value, DeferredArray)
