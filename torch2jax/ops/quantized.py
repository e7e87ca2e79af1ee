"""Weight-only quantized params, turned back into the weight they stand for inside the function.

The artifact holds int8 weights (one float32 scale per output row) or int4 weights (two per byte,
one float32 scale per group of input columns); `runtime/quantize.py` replaces such a weight's
placeholder by these nodes, so every consumer reads the weight as before and XLA sees the
dequantization next to the product it feeds (it folds the int8 -> float conversion into a
few-row matmul rather than writing the float weight out).
"""

from __future__ import annotations

import jax.numpy as jnp

from .registry import lowers


@lowers("torch2jax.dequantize_int8.default")
def dequantize_int8(q, scale, dtype):
    """[out, in] int8 and [out] scales -> q * scale per row, in `dtype` (the weight's own)."""
    return (q.astype(jnp.float32) * scale[:, None]).astype(dtype)


@lowers("torch2jax.dequantize_int4.default")
def dequantize_int4(packed, scale, group_size, dtype):
    """[out, in / 2] bytes (column 2j in the low nibble, 2j + 1 in the high one, two's complement) and [out, in / group]
    scales -> the [out, in] weight in `dtype`."""
    low = (packed & 0xF).astype(jnp.int8)
    high = (packed >> 4).astype(jnp.int8)
    values = jnp.stack([jnp.where(low > 7, low - 16, low), jnp.where(high > 7, high - 16, high)], axis=-1)
    rows = packed.shape[0]
    grouped = values.reshape(rows, -1, group_size).astype(jnp.float32) * scale[:, :, None]
    return grouped.reshape(rows, -1).astype(dtype)
