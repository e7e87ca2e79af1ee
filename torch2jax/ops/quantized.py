"""Weight-only quantized params, turned back into the weight they stand for inside the function.

The artifact holds int8 weights (one float32 scale per output row) or int4 weights (two per byte,
one float32 scale per group of input columns); `runtime/quantize.py` replaces such a weight's
placeholder by these nodes, so every consumer reads the weight as before and XLA sees the
dequantization next to the product it feeds (it folds the int8 -> float conversion into a
few-row matmul rather than writing the float weight out).

int4 bytes hold the weight's column halves: the low nibble of byte [o, j] is column j, the high nibble
column h + j (h: the first half, in whole groups). Each half unpacks elementwise, so the product is two
products over the halves of x, and XLA:CPU fuses each unpacking into its matrix-vector loop; the older
interleaved order (columns 2j and 2j + 1 in one byte, `dequantize_int4`, still read) needs an interleave
that XLA:CPU cannot fuse (a 32000x512 LM head at one row: 5.9 ms interleaved, 1.1 ms in halves, float32 1.8).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .linalg import blocked_linear, by_row_count, linear, with_bias
from .registry import lowers


@lowers("torch2jax.dequantize_int8.default")
def dequantize_int8(q, scale, dtype):
    """[out, in] int8 and [out] scales -> q * scale per row, in `dtype` (the weight's own)."""
    return (q.astype(jnp.float32) * scale[:, None]).astype(dtype)


@lowers("torch2jax.dequantize_int4_halves.default")
def dequantize_int4_halves(packed, scale, group_size, dtype):
    """[out, h] bytes (column j in the low nibble, h + j in the high one, two's complement) and [out, in / group]
    scales -> the [out, in] weight in `dtype`."""
    low, high = _int4_halves(packed, scale, group_size)
    return jnp.concatenate([low, high], axis=1).astype(dtype)


def _int4_halves(packed, scale, group_size):
    """The float32 column halves [out, h] and [out, in - h] of an int4 weight packed in halves."""
    rows, half = packed.shape
    signed = lax.bitcast_convert_type(packed, jnp.int8)
    groups, low_groups = scale.shape[1], half // group_size

    def unpack(nibbles, scales):  # [rows, k * group_size] values times their groups' scales
        count = scales.shape[1]
        grouped = nibbles[:, : count * group_size].reshape(rows, count, group_size).astype(jnp.float32)
        return (grouped * scales[:, :, None]).reshape(rows, count * group_size)

    low = unpack((signed << 4) >> 4, scale[:, :low_groups])  # arithmetic shifts: the nibble's sign extended
    high = unpack(signed >> 4, scale[:, low_groups:groups])
    return low, high


@lowers("torch2jax.dequantize_int4.default")
def dequantize_int4(packed, scale, group_size, dtype):
    """The interleaved int4 of artifacts written before the halves: [out, in / 2] bytes (column 2j in the low nibble,
    2j + 1 in the high one, two's complement) and [out, in / group] scales -> the [out, in] weight in `dtype`."""
    low = (packed & 0xF).astype(jnp.int8)
    high = (packed >> 4).astype(jnp.int8)
    values = jnp.stack([jnp.where(low > 7, low - 16, low), jnp.where(high > 7, high - 16, high)], axis=-1)
    rows = packed.shape[0]
    grouped = values.reshape(rows, -1, group_size).astype(jnp.float32) * scale[:, :, None]
    return grouped.reshape(rows, -1).astype(dtype)


@lowers("torch2jax.dynamic_int8_weight.default")
def dynamic_int8_weight(q, scale, dtype):
    """An int8-dynamic weight read by something other than a Linear (passes.quantized_products fuses those):
    the float weight, as dequantize_int8 gives it."""
    return dequantize_int8(q, scale, dtype)


@lowers("torch2jax.dynamic_int8_linear.default")
def dynamic_int8_linear(x, q, scale, bias=None):
    """x @ (q * scale).T (+ bias) with each row of x quantized to int8 as it is multiplied: x_row ~ xq_row * step_row,
    step_row = max|x_row| / 127, so x @ w.T ~ (xq @ q.T) * step * scale, an int8 x int8 product accumulated in int32.
    The weight stays int8 from the checkpoint to the multiply unit; rounding the activations is the cost (about
    half a step per element, the same order as the weight's own rounding)."""
    xf = x.astype(jnp.float32)
    step = jnp.max(jnp.abs(xf), axis=-1, keepdims=True) / 127
    step = jnp.where(step > 0, step, 1.0)
    xq = jnp.clip(jnp.round(xf / step), -127, 127).astype(jnp.int8).reshape(-1, x.shape[-1])
    acc = lax.platform_dependent(xq, q, cpu=_int8_product_cpu, default=_int8_product)
    out = acc.reshape(*x.shape[:-1], q.shape[0]).astype(jnp.float32) * step * scale
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return out.astype(x.dtype)


def _int8_product(xq, q):
    return lax.dot_general(xq, q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)


def _int8_product_cpu(xq, q):
    """At few rows XLA:CPU multiplies faster with the weight first (as linalg.linear does for float weights)."""

    def first():
        return lax.optimization_barrier(lax.dot_general(q, xq, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)).T

    return by_row_count(xq.shape[0], first, first, lambda: _int8_product(xq, q))


# Row blocks a quantized weight is dequantized in, at few rows on CPU: the largest that divides the weight's rows.
_BLOCKS = (256, 128, 64)


@lowers("torch2jax.int8_linear.default")
def int8_linear(x, q, scale, dtype, bias=None):
    """linear(x, dequantize_int8(q, scale, dtype), bias) (passes.quantized_products), see _dequantized_linear."""
    if jnp.dtype(dtype) == jnp.float32:  # the row scales after the product: one multiply per output, not per weight
        product = _dequantized_linear(x, lambda start, size: lax.dynamic_slice_in_dim(q, start, size).astype(dtype),
                                      q.shape[0], dtype, None)
        return with_bias(product * scale, bias, dtype)

    def rows(start, size):
        return dequantize_int8(lax.dynamic_slice_in_dim(q, start, size), lax.dynamic_slice_in_dim(scale, start, size), dtype)

    return _dequantized_linear(x, rows, q.shape[0], dtype, bias)


@lowers("torch2jax.int4_halves_linear.default")
def int4_halves_linear(x, packed, scale, group_size, dtype, bias=None):
    """linear(x, dequantize_int4_halves(packed, scale, group_size, dtype), bias), see _dequantized_linear. Whole, it is
    the sum of the products of x's column halves with the weight's, each unpacked where its product reads it."""
    def rows(start, size):  # the block's column halves, as blocked_linear multiplies them
        low, high = _int4_halves(lax.dynamic_slice_in_dim(packed, start, size), lax.dynamic_slice_in_dim(scale, start, size),
                                 group_size)
        return low.astype(dtype), high.astype(dtype)

    def whole(x):  # in float32, rounded to the model's dtype once, as one product would be
        low, high = _int4_halves(packed, scale, group_size)
        half, xf = low.shape[1], x.astype(jnp.float32)
        return with_bias(linear(xf[..., :half], low, None, computed_weight=True)
                         + linear(xf[..., half:], high, None, computed_weight=True), bias, dtype)

    return _dequantized_linear(x, rows, packed.shape[0], dtype, bias, whole)


@lowers("torch2jax.int4_linear.default")
def int4_linear(x, packed, scale, group_size, dtype, bias=None):
    """linear(x, dequantize_int4(packed, scale, group_size, dtype), bias) of the older interleaved int4."""
    def rows(start, size):
        return dequantize_int4(lax.dynamic_slice_in_dim(packed, start, size), lax.dynamic_slice_in_dim(scale, start, size),
                               group_size, dtype)

    return _dequantized_linear(x, rows, packed.shape[0], dtype, bias)


def _dequantized_linear(x, rows_of, rows: int, dtype, bias, whole=None):
    """The Linear of a weight dequantized by `rows_of(start, size)` (or made whole by `whole(x)`). On CPU at 2 to
    LINEAR_WEIGHT_FIRST_ROWS rows of x, a block of the weight's rows at a time (linalg.blocked_linear: the float weight
    is never written out whole); one row is a matrix-vector product that XLA:CPU fuses with the dequantization, and
    many rows amortize one dequantization over the rows, as on other platforms."""
    def dense(x):
        return whole(x) if whole is not None else linear(x, rows_of(0, rows), bias, computed_weight=True)

    block = next((b for b in _BLOCKS if rows % b == 0), None)
    if block is None:
        return dense(x)

    def cpu(x):
        def blocked():
            return blocked_linear(x, lambda start: rows_of(start, block), rows, block, dtype, bias)

        return by_row_count(math.prod(x.shape[:-1]), lambda: dense(x), blocked, lambda: dense(x))

    return lax.platform_dependent(x, cpu=cpu, default=dense)


# -- weights a checkpoint stores quantized (runtime/quantize.StoredWeight), kept in the artifact as they are stored --
def float8_values(values):
    """float32 of float8_e4m3fn values, made with integer ops: XLA:CPU's own float8 conversion is emulated element by
    element, about 3 times a float32 product's time at one row, where these fuse into the product's loop (within 10%
    of float32). The 7 bits below the sign, put at the top of a float32's exponent and mantissa, are the value times
    2^-120 for a normal value (exponent bias 7 against 127); a subnormal one (exponent 0) is its mantissa times 2^-9;
    the two codes with every bit set are NaN. Equal to the conversion on all 256 codes."""
    if values.dtype != jnp.float8_e4m3fn:
        return values.astype(jnp.float32)
    u = lax.bitcast_convert_type(values, jnp.uint8).astype(jnp.uint32)
    magnitude = u & 0x7F
    normal = lax.bitcast_convert_type((magnitude << 20) | ((u & 0x80) << 24), jnp.float32) * jnp.float32(2.0 ** 120)
    subnormal = (u & 0x7).astype(jnp.float32) * jnp.where(u & 0x80, jnp.float32(-(2.0 ** -9)), jnp.float32(2.0 ** -9))
    value = jnp.where((u & 0x78) == 0, subnormal, normal)
    return jnp.where(magnitude == 0x7F, jnp.float32(jnp.nan), value)


def _block_rows(values, scale, block_rows: int, block_cols: int, start, size: int):
    """float32 rows [start, start + size) of a block-scaled weight (`start` a multiple of `size`, traced or not)."""
    rows, cols = values.shape
    grid_rows, grid_cols = -(-rows // block_rows), -(-cols // block_cols)
    grid = scale.astype(jnp.float32).reshape(grid_rows, grid_cols)
    part = float8_values(lax.dynamic_slice_in_dim(values, start, size) if size != rows else values)
    if size == rows and rows % block_rows == 0:  # whole row blocks: the scales broadcast over each block's rows
        per_row = None
    else:
        per_row = lax.dynamic_slice_in_dim(jnp.repeat(grid, block_rows, axis=0)[:rows], start, size)
    if cols % block_cols == 0:
        if per_row is None:
            blocks = part.reshape(grid_rows, block_rows, grid_cols, block_cols) * grid[:, None, :, None]
        else:
            blocks = part.reshape(size, grid_cols, block_cols) * per_row[:, :, None]
        return blocks.reshape(size, cols)
    per_row = per_row if per_row is not None else jnp.repeat(grid, block_rows, axis=0)[:rows]
    return part * jnp.repeat(per_row, block_cols, axis=1)[:, :cols]


@lowers("torch2jax.dequantize_blocks.default")
def dequantize_blocks(values, scale, block_rows, block_cols, dtype):
    """[out, in] values (float8, as FP8 checkpoints store them) times one scale per block of block_rows x block_cols
    (the last blocks of a side that is not a multiple are partial), in float32, rounded to `dtype` once."""
    return _block_rows(values, scale, block_rows, block_cols, 0, values.shape[0]).astype(dtype)


@lowers("torch2jax.blocks_linear.default")
def blocks_linear(x, values, scale, block_rows, block_cols, dtype, bias=None):
    """linear(x, dequantize_blocks(values, scale, block_rows, block_cols, dtype), bias), see _dequantized_linear."""
    def rows(start, size):
        return _block_rows(values, scale, block_rows, block_cols, start, size).astype(dtype)

    return _dequantized_linear(x, rows, values.shape[0], dtype, bias)


def unpack_int32(packed, bits: int, count: int):
    """[n, words] int32 of 32 / bits values each (the lowest bits first, offset by 2^(bits - 1)) -> [n, count] int32."""
    words = lax.bitcast_convert_type(packed, jnp.uint32)
    shifts = jnp.arange(0, 32, bits, dtype=jnp.uint32)
    values = (words[:, :, None] >> shifts) & jnp.uint32((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1)[:, :count].astype(jnp.int32) - (1 << (bits - 1))


@lowers("torch2jax.dequantize_packed_int.default")
def dequantize_packed_int(packed, scale, bits, group_size, cols, dtype, zero_point=None):
    """[out, words] int32 words of packed `bits`-bit values (compressed-tensors' pack-quantized), [out, in / group]
    scales and, asymmetric, zero points packed alike down the rows (None: symmetric) -> (q - zero_point) * scale, in
    `dtype`."""
    rows = packed.shape[0]
    q = unpack_int32(packed, bits, cols).astype(jnp.float32).reshape(rows, -1, group_size)
    if zero_point is not None:
        q = q - unpack_int32(zero_point.T, bits, rows).T.astype(jnp.float32).reshape(rows, -1)[:, :, None]
    return (q * scale.astype(jnp.float32).reshape(rows, -1)[:, :, None]).reshape(rows, cols).astype(dtype)


@lowers("torch2jax.packed_int_linear.default")
def packed_int_linear(x, packed, scale, bits, group_size, cols, dtype, zero_point=None, bias=None):
    """linear(x, dequantize_packed_int(...), bias), see _dequantized_linear: a block of rows takes its rows' words,
    scales and zero-point words (the blocks' rows are a multiple of 32 / bits, so each block's zero points are whole words)."""
    rows = packed.shape[0]
    scale = scale.reshape(rows, -1)

    def block(start, size):
        zero = None
        if zero_point is not None:
            zero = lax.dynamic_slice_in_dim(zero_point, start * bits // 32, size * bits // 32) if size != rows else zero_point
        if size == rows:
            return dequantize_packed_int(packed, scale, bits, group_size, cols, dtype, zero)
        return dequantize_packed_int(lax.dynamic_slice_in_dim(packed, start, size), lax.dynamic_slice_in_dim(scale, start, size),
                                     bits, group_size, cols, dtype, zero)

    return _dequantized_linear(x, block, rows, dtype, bias)


@lowers("torch2jax.dequantize_packed_int_permuted.default")
def dequantize_packed_int_permuted(packed, scale, bits, group_size, cols, dtype, zero_point, columns):
    """dequantize_packed_int of a weight stored with its columns in another order (GPTQ's activation order): stored
    column j is the weight's column columns[j]; the weight comes back in its own order."""
    stored = dequantize_packed_int(packed, scale, bits, group_size, cols, dtype, zero_point)
    return jnp.take(stored, jnp.argsort(columns), axis=1)


@lowers("torch2jax.packed_int_permuted_linear.default")
def packed_int_permuted_linear(x, packed, scale, bits, group_size, cols, dtype, zero_point, columns, bias=None):
    """linear(x, dequantize_packed_int_permuted(...), bias) without unpermuting the weight: x's columns are read in the
    stored order instead (x @ W.T == x[..., columns] @ W_stored.T)."""
    return packed_int_linear(jnp.take(x, columns, axis=-1), packed, scale, bits, group_size, cols, dtype, zero_point, bias)
