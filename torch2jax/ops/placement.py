"""Where XLA computes a value: `torch2jax.computed_once`, added by passes.computed_once.

XLA CPU fuses elementwise producers into their consumers even when a consumer broadcasts the
producer's result, so an expensive op (cos, exp, ...) is then recomputed for every element the
consumer writes. `lax.optimization_barrier` does not stop this on XLA CPU (it is gone before
fusion runs). A conditional does: its branches are separate computations, so the op is computed
once into a buffer that the consumers read. Both branches compute the same op; the predicate only
has to be unknown at compile time. CPU only: on GPUs a conditional costs a device-to-host sync.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..registry import lookup, lowers


@lowers("torch2jax.computed_once.default")
def computed_once(op: str, x):
    lowering = lookup(op)
    if lowering is None or lowering.ctx:
        raise ValueError(f"computed_once wraps a plain unary lowering, not {op}")

    def separately(x):
        runtime = jnp.isnan(jnp.sum(x.astype(jnp.float32)))  # any value-dependent predicate
        return lax.cond(runtime, lowering.fn, lowering.fn, x)

    return lax.platform_dependent(x, cpu=separately, default=lowering.fn)
