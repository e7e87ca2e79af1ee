"""Where XLA computes a value: `torch2jax.computed_once`, added by the pass of the same name.

XLA CPU fuses elementwise producers (and gathers) into their consumers even when a consumer
broadcasts the producer's result, so a costly op (cos, exp, a table lookup) is then recomputed for
every element the consumer writes. `lax.optimization_barrier` does not stop this on XLA CPU (it is
gone before fusion runs). A conditional does: its branches are separate computations, so the op is
computed once into a buffer that the consumers read. Both branches compute the same op; the
predicate only has to be unknown at compile time. CPU only: on GPUs a conditional costs a
device-to-host sync.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .registry import lookup, lowers


@lowers("torch2jax.computed_once.default")
def computed_once(op: str, *args, **kwargs):
    lowering = lookup(op)
    if lowering is None or lowering.ctx:
        raise ValueError(f"computed_once wraps a lowering that needs no context, not {op}")

    def compute():
        return lowering.fn(*args, **kwargs)

    arrays = _arrays(args)
    if not arrays:  # constants only: nothing at run time to build a predicate from
        return compute()
    return lax.platform_dependent(cpu=lambda: apart(compute, arrays), default=compute)


def apart(compute, arrays: list, instead=None):
    """compute(), in a computation of its own that XLA neither fuses into the consumers nor
    fuses the consumers into: a conditional whose two branches both compute it. Its predicate reads
    the smallest of `arrays` (compute's inputs), so it is unknown until run time; it is true only
    when that input holds a NaN. `instead`, when given, is that branch: the same result computed
    another way (up to rounding), so that a large `compute` is not in the program twice."""
    probe = min(arrays, key=_size_hint)
    runtime = jnp.isnan(jnp.sum(probe.astype(jnp.float32)))
    return lax.cond(runtime, instead or compute, compute)


def _arrays(args) -> list:
    return [leaf for leaf in jax.tree.leaves(args) if isinstance(leaf, jax.Array)]


def _size_hint(x) -> int:
    """The number of elements, a symbolic dim counted as large."""
    return math.prod(d if isinstance(d, int) else 1 << 20 for d in x.shape)
