"""Random numbers on the `jax` device: one JAX key per seed, folded with a counter per draw.

`torch.manual_seed(s)` reaches `manual_seed` through the device module (torch seeds every
registered device), so a seed gives the same numbers every time, and each draw advances the
counter, so two draws differ. The stream is JAX's, not torch's CPU stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax


class _State:
    def __init__(self) -> None:
        self.seed: int | None = None
        self.key: jax.Array | None = None
        self.counter = 0


_STATE = _State()


def manual_seed(seed: int) -> None:
    _STATE.seed = int(seed)
    _STATE.key = None  # made on first use, inside the device's x64 context
    _STATE.counter = 0


_TRACED: list = []  # a key passed into a jitted forward, with its own counter


@contextlib.contextmanager
def traced(key: jax.Array) -> Iterator[None]:
    """Draws inside a jax.jit trace use `key` (an argument of the compiled function), not the seed."""
    _TRACED.append([key, 0])
    try:
        yield
    finally:
        _TRACED.pop()


def next_key() -> tuple[jax.Array, int]:
    """(the seed's key, this draw's index): a lowering folds the index into the key."""
    if _TRACED:
        entry = _TRACED[-1]
        entry[1] += 1
        return entry[0], entry[1] - 1
    if _STATE.key is None:
        if _STATE.seed is None:
            import torch

            _STATE.seed = torch.initial_seed()
        _STATE.key = jax.random.key(_STATE.seed & 0x7FFFFFFFFFFFFFFF)  # torch seeds are uint64
    index = _STATE.counter
    _STATE.counter += 1
    return _STATE.key, index


def get_state() -> tuple:
    return (_STATE.seed, _STATE.counter)


def set_state(state: tuple) -> None:
    _STATE.seed, _STATE.counter = state
    _STATE.key = None
