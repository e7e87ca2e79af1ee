"""Torch's "opmath" rule in one place: half and bfloat16 math is computed in float32 and rounded once.

Several op families follow it (elementwise, special functions, activations, the `_foreach_*` ops, and the
reductions, pools, convs and products that accumulate in float32), so the dtypes and casts live here rather
than in any one family. The interpreter rounds each result to the dtype torch recorded for the node.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..ir.dtypes import is_floating

# The dtypes torch computes in float32 ("opmath") and rounds once at the end.
LOW_PRECISION = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))


def opmath(dtype: Any) -> Any:
    """The dtype torch computes in for results of `dtype` (float32 for half and bfloat16)."""
    return jnp.float32 if np.dtype(dtype) in LOW_PRECISION else dtype


def cast(dtype: Any, *values: Any) -> list:
    """Each array or python scalar as an array of `dtype` (None stays None).

    An array that already is one is passed through: jnp.asarray costs ~12 us per call on the
    eager jax device, which runs each lowering op by op."""
    return [v if _is_array_of(v, dtype) else None if v is None else jnp.asarray(v, dtype) for v in values]


def _is_array_of(value: Any, dtype: Any) -> bool:
    return isinstance(value, jax.Array) and value.dtype == dtype and not value.weak_type


def computed_in(ctx: Any, *values: Any) -> list:
    """The operands in the compute dtype of the node's (promoted) result."""
    return cast(opmath(ctx.out_dtype), *values)


def to_float(x: Any) -> jax.Array:
    """Math functions of integer and bool tensors return the default float dtype, as torch."""
    x = jnp.asarray(x)
    if not is_floating(x.dtype) and not jnp.iscomplexobj(x):
        return x.astype(jnp.float32)
    return x.astype(jnp.float32) if x.dtype in LOW_PRECISION else x
