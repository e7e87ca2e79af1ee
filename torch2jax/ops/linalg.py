"""Matrix products.

Low-precision inputs (bfloat16, float16) multiply with float32 accumulation
(`preferred_element_type`) and round once at the end, as torch's CPU/GPU kernels do; the
`add*` variants fold `beta * self` into the float32 result before that single rounding.
"""

from __future__ import annotations

import functools
import operator
import string

import jax.numpy as jnp
import numpy as np
from jax import lax

from .opmath import LOW_PRECISION
from .registry import lowers


def _acc_dtype(dtype):
    return jnp.float32 if jnp.dtype(dtype) in LOW_PRECISION else None


def _product(a, b, fn=jnp.matmul):
    """a @ b, accumulated in float32 for low precision; returned in the accumulation dtype."""
    dtype = jnp.result_type(a, b)
    if dtype == jnp.bool_:
        # torch's bool matmul is an OR of ANDs
        return fn(a.astype(jnp.int32), b.astype(jnp.int32)) > 0
    acc = _acc_dtype(dtype)
    if acc is None:
        return fn(a, b)
    # XLA CPU's dot thunk refuses some bfloat16 x bfloat16 -> float32 dots (an operand fused from a
    # float32 -> bfloat16 convert, as in a training graph's weight gradient): on CPU the operands are
    # widened first, which is exact (a product of two bfloat16 numbers fits float32) and sums alike.
    return lax.platform_dependent(
        a, b,
        cpu=lambda a, b: fn(a.astype(acc), b.astype(acc)),
        default=lambda a, b: fn(a, b, preferred_element_type=acc),
    )


def _scale(value, factor):
    if value.dtype == jnp.bool_:
        return value & bool(factor)
    return value if factor == 1 else value * factor


def _add_product(bias, product, beta, alpha, dtype):
    """beta * bias + alpha * product; beta == 0 ignores bias entirely (its NaNs included)."""
    if jnp.issubdtype(dtype, jnp.integer):  # torch casts the scalars to the integer type first
        beta, alpha = int(beta), int(alpha)
    out = _scale(product, alpha)
    if beta != 0:
        b = bias.astype(out.dtype)
        out = (out | _scale(b, beta)) if out.dtype == jnp.bool_ else out + _scale(b, beta)
    return out.astype(dtype)


@lowers("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def mm(a, b):
    return _product(a, b).astype(jnp.result_type(a, b))


@lowers("aten._int_mm.default")
def int_mm(a, b):
    """int8 @ int8 -> int32, accumulated in int32 (torchao's dynamically quantized linear): the product x86 and
    GPU units run natively, so the operands stay int8 into the dot."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


# Up to this many rows (and no more than half the experts), gathering each row's expert matrix beats every expert's
# product (XLA CPU, 4 experts of 2816x512, one core: 2 rows 0.8 ms gathered, 1.7 ms dense; 8 rows 37 ms gathered).
EXPERT_GATHER_ROWS = 4


@lowers("torch2jax.expert_bmm.default")
def expert_bmm(weights, ids, other, weights_first):
    """bmm(weights[ids], other) if weights_first else bmm(other, weights[ids]), from every expert's
    product with every row, then each row's pick (see passes.expert_matmul); for a few rows (a decode
    step's), from the gathered matrices themselves. Each value is the same dot product as the gathered
    bmm's, in the same accumulation dtype."""
    dtype = jnp.result_type(weights, other)
    acc = _acc_dtype(dtype)
    weights, other = weights.astype(dtype), other.astype(dtype)
    ids = jnp.where(ids < 0, ids + weights.shape[0], ids)  # wrapped as index does; out-of-range ids clamp, as the gather did
    ids = ids.astype(jnp.int32)
    rows, experts = other.shape[0], weights.shape[0]

    def gathered():  # a decode step's few rows: only their experts' matrices are read
        picked = jnp.take(weights, ids, axis=0, mode="clip")
        spec = "snk,skm->snm" if weights_first else "smk,skn->smn"
        operands = (picked, other) if weights_first else (other, picked)
        return jnp.einsum(spec, *operands, preferred_element_type=acc).astype(dtype)

    def dense():
        # The weights contract over the dim they are stored with (no copy of every expert's matrix per call: XLA CPU
        # transposed the stack to [K, E * N] on each call when the rows came first): weights_first [E, N, S, M], else
        # [S, M, E, N].
        if weights_first:
            every = lax.dot_general(weights, other, (((2,), (1,)), ((), ())), preferred_element_type=acc)
            picked = jnp.take_along_axis(every, ids[None, None, :, None], axis=0, mode="clip")[0]
            return jnp.transpose(picked, (1, 0, 2)).astype(dtype)
        every = lax.dot_general(other, weights, (((2,), (1,)), ((), ())), preferred_element_type=acc)
        return jnp.take_along_axis(every, ids[:, None, None, None], axis=2, mode="clip")[:, :, 0].astype(dtype)

    if isinstance(rows, int):
        return (gathered if rows <= EXPERT_GATHER_ROWS and 2 * rows <= experts else dense)()
    rows = jnp.asarray(rows)  # symbolic: decided once the artifact's shapes are known, as by_row_count does
    return lax.cond((rows <= EXPERT_GATHER_ROWS) & (2 * rows <= experts), gathered, dense)


@lowers("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default")
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """Mixture-of-experts products: rows of `a` [S, K] sorted by expert, expert g's rows ending at offs[g], each
    times its expert's matrix b[g] [K, N] (`lax.ragged_dot`); rows past offs[-1] are zero, as transformers'
    fallback leaves them. Without offs, a and b are 3-D: a batched matmul. (transformers registers
    `transformers::grouped_mm_fallback` for its experts; torch's `_grouped_mm` is the same product.)"""
    if bias is not None:
        raise NotImplementedError("grouped_mm with a bias is not supported")
    if offs is None:
        out = _product(a, b)
    else:
        if a.ndim != 2 or b.ndim != 3:
            raise NotImplementedError(f"grouped_mm with offs lowers [S, K] x [groups, K, N]; got {a.shape} x {b.shape}")
        sizes = jnp.diff(offs.astype(jnp.int32), prepend=0)

        def ragged(x, y, **kw):
            return lax.ragged_dot(x, y, sizes, **kw)

        out = _product(a, b, ragged)
    return out.astype(out_dtype or jnp.result_type(a, b))


@lowers("aten.mv.default")
def mv(a, v):
    return _product(a, v).astype(jnp.result_type(a, v))


@lowers("aten.dot.default", "aten.vdot.default")
def dot(a, b):  # real dtypes only: vdot's conjugation is the identity there
    return _product(a, b, jnp.dot).astype(jnp.result_type(a, b))


@lowers("aten.addmm.default", "aten.addmv.default", "aten.baddbmm.default")
def addmm(bias, a, b, beta=1, alpha=1):
    dtype = jnp.result_type(bias, a, b)
    return _add_product(bias, _product(a, b), beta, alpha, dtype)


# Up to this many rows, XLA CPU multiplies x @ w.T faster as (w @ x.T).T: with w as the right-hand
# side its dot re-lays all of w out on every call, which costs more than the product itself at few
# rows (768x3072 weight: 0.39x the time at 8 rows, 0.65x at 32, 0.98x at 64, 1.08x at 128).
LINEAR_WEIGHT_FIRST_ROWS = 64


@lowers("torch2jax.linear.default")
def linear(x, weight, bias=None, *, computed_weight: bool = False):
    """x @ weight.T (+ bias): mm/addmm (or an n-d matmul) of a transposed matrix, as torch.export writes nn.Linear
    (passes.linear_products). Same values as those ops; on CPU, at few rows, the weight goes first.
    `computed_weight`: the weight is made in the function (a dequantization), which a one-row product on CPU fuses
    into its loop (see _weight_first)."""
    dtype = jnp.result_type(x, weight)
    lead = x.shape[:-1]
    if x.ndim != 2:  # rows of any leading shape (a Linear on [batch, seq, features]) multiply as one [rows, features]
        x = x.reshape(-1, x.shape[-1])
    if jnp.issubdtype(dtype, jnp.floating):
        product = lax.platform_dependent(x, weight, cpu=functools.partial(_weight_first, computed_weight=computed_weight),
                                         default=_weight_last)
    else:
        product = _weight_last(x, weight)
    if len(lead) != 1:
        product = product.reshape(*lead, weight.shape[0])
    return with_bias(product, bias, dtype)


def blocked_linear(x, weight_rows, rows: int, block: int, dtype, bias=None):
    """linear(x, w, bias) for a weight w of `rows` rows that `weight_rows(start)` makes `block` rows at a time (a
    dequantization), as one array or as a tuple of its column parts (an int4 weight's halves, each multiplied with
    x's matching columns: the parts are never joined): a loop over blocks, each block's rows made and multiplied
    (weight first, as `linear` at few rows) while they are in cache. XLA:CPU otherwise writes the whole float32
    weight out before a matrix product (a bfloat16 or int8 weight: 2 to 5 times float32's time at 8 rows); a
    matrix-vector product (one row of x) needs none of this (see _weight_first). Same values as `linear` of the whole
    weight."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    acc = _acc_dtype(dtype) or dtype

    def one_block(i, out):
        product = lax.optimization_barrier(_parts_product(weight_rows(i * block), x2.T))
        return lax.dynamic_update_slice(out, product.astype(acc), (i * block, 0))

    product = lax.fori_loop(0, rows // block, one_block, jnp.zeros((rows, x2.shape[0]), acc)).T
    return with_bias(product.reshape(*lead, rows), bias, dtype)


def _parts_product(weight, xt):
    """weight @ xt, `weight` given whole or as a tuple of its column parts."""
    if not isinstance(weight, tuple):
        return _product(weight, xt)
    total, start = None, 0
    for part in weight:
        product = _product(part, xt[start:start + part.shape[1]])
        total = product if total is None else total + product
        start += part.shape[1]
    return total


def with_bias(product, bias, dtype):
    """A Linear's product (in its accumulation dtype) with the bias added as torch's addmm adds it, in `dtype`."""
    if bias is None:
        return product.astype(dtype)
    return _add_product(bias, product, 1, 1, jnp.result_type(bias, dtype))


def _weight_last(x, weight):
    """x @ weight.T as one dot contracting the weight's second axis. Written as matmul(x, weight.T), XLA:CPU copies
    the transposed weight out on every call for some shapes (a 1536 x 4096 float32 weight at one row: 14 ms for the
    copy, 0.75 ms for the product)."""
    return _product(x, weight, fn=_contract_last_axes)


def _contract_last_axes(a, b, **kwargs):
    return lax.dot_general(a, b, (((a.ndim - 1,), (1,)), ((), ())), **kwargs)


def _weight_first(x, weight, computed_weight=False):
    """(weight @ x.T).T where x has 2 to LINEAR_WEIGHT_FIRST_ROWS rows. The barrier keeps XLA
    from folding the transpose back into the dot; the transpose fuses into whatever reads the result.
    One row stays x @ weight.T: for a computed weight (an int8 or int4 dequantization) or a low-precision one,
    XLA:CPU fuses what makes it into one matrix-vector loop that reads the stored weight once, where the
    weight-first dot writes the float32 weight out first (5x slower on a 32000x512 LM head), up to
    FUSED_ROW_FEATURES input features (_row_times_rows); a stored float32 weight is read as stored (_weight_last)."""

    def first():
        if x.dtype == weight.dtype and weight.dtype in LOW_PRECISION:
            return _low_precision_rows(x, weight)
        return lax.optimization_barrier(_product(weight, x.T)).T

    def one():  # the barrier keeps a bias add out of the dot's fusion, which would take the weight's producer's place
        if computed_weight or weight.dtype in LOW_PRECISION:
            return lax.optimization_barrier(_row_times_rows(x, weight))
        return lax.optimization_barrier(_weight_last(_computed_once(x), weight))

    def many():
        return _weight_last(x, weight)

    return by_row_count(x.shape[0], one, first, many)


# XLA:CPU fuses what makes a one-row product's weight (a widening, a dequantization) into the product's loop, which
# then reads the stored weight at memory speed (bfloat16, one core: 25-32 GB/s at 512-32000 x 896-3072; int8 23-25
# GB/s), only while the row is under 16 KiB: up to this many float32 features. A longer row is multiplied in parts of
# at most this many features, each part's product kept whole by a barrier (summed after, XLA would fuse the sum into
# the product and the part's weight would be written out first): an int8 1536 x 4096 product at one row, 0.31 ms in
# two parts, 2.3 ms as a multiply and row sum, 6.7 ms as one product (the float32 weight written out transposed).
FUSED_ROW_FEATURES = 3072


def _row_times_rows(x, weight):
    """x [1, K] @ weight.T for a bfloat16 (float16) or computed (dequantized) weight, in the accumulation dtype (float32
    for low precision): one fused loop per part of at most FUSED_ROW_FEATURES (float32) features, the weight made or
    widened where the product reads it."""
    dtype = jnp.result_type(x, weight)
    acc = _acc_dtype(dtype) or dtype
    row, weight = x.astype(acc), weight.astype(acc)
    features = weight.shape[1]
    limit = max(1, FUSED_ROW_FEATURES * 4 // jnp.dtype(acc).itemsize)
    if features <= limit:
        return jnp.matmul(_computed_once(row), weight.T)
    parts = -(-features // limit)
    size = -(-features // parts)
    products = [jnp.matmul(_computed_once(row[:, start:start + size]), weight[:, start:start + size].T)
                for start in range(0, features, size)]
    products = lax.optimization_barrier(tuple(products))
    return functools.reduce(operator.add, products)


def _computed_once(row):
    """`row` as it is, but written out before a matrix-vector product reads it. XLA:CPU fuses the row's elementwise
    producers (an RMSNorm's scaling) into the product's loop, which then computes them again for every weight element
    (40% more time on an int8 1408x512 product); optimization_barrier does not stop it (XLA:CPU drops barriers before
    fusing). A reduce-window is never fused into a loop: max(row, -inf) over a window of the row and a padding is the
    row, NaN and -inf included."""
    column = row[..., None]
    window = (1,) * row.ndim + (2,)
    padding = ((0, 0),) * row.ndim + ((0, 1),)
    return lax.reduce_window(column, -jnp.inf, lax.max, window, (1,) * column.ndim, padding)[..., 0]


def _low_precision_rows(x, weight):
    """x @ weight.T for bfloat16 (float16) x and weight at a few rows, accumulated in float32 by the dot itself.
    The widened operands `_product` makes on CPU write a float32 copy of the weight on every call and read it
    back: three times the stored weight's bytes, where this reads them once (a bfloat16 Llama decoding 8 rows:
    5.6 -> 25.9 tok/s per row, float32 27.7). x passes a barrier first: XLA:CPU's dot refuses a bfloat16 operand
    fused from a float32 convert."""
    x = lax.optimization_barrier(x)
    return lax.dot_general(x, weight, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def by_row_count(rows, one, few, many):
    """one() at one row, few() at 2 to LINEAR_WEIGHT_FIRST_ROWS rows, many() above: how a product on CPU is made
    depends on its row count. With a symbolic count the choice is a switch, decided once the artifact's shapes are
    known."""
    if isinstance(rows, int):
        return (one if rows == 1 else few if rows <= LINEAR_WEIGHT_FIRST_ROWS else many)()
    rows = jnp.asarray(rows)
    return lax.switch(jnp.where(rows == 1, 0, jnp.where(rows <= LINEAR_WEIGHT_FIRST_ROWS, 1, 2)), [one, few, many])


@lowers("aten.addbmm.default")
def addbmm(bias, a, b, beta=1, alpha=1):
    dtype = jnp.result_type(bias, a, b)
    if dtype in LOW_PRECISION:
        # torch runs addmm_ once per batch into the low-precision result: one rounding per batch
        out = _add_product(bias, _product(a[0], b[0]), beta, alpha, dtype) if a.shape[0] else None
        for i in range(1, a.shape[0]):
            out = _add_product(out, _product(a[i], b[i]), 1, alpha, dtype)
        if out is not None:
            return jnp.broadcast_to(out, (a.shape[1], b.shape[2]))
        product = jnp.zeros((a.shape[1], b.shape[2]), jnp.float32)
    elif dtype == jnp.bool_:
        product = jnp.any(_product(a, b), axis=0)
    else:
        product = jnp.einsum("bij,bjk->ik", a, b, preferred_element_type=_acc_dtype(dtype))
    return _add_product(bias, product, beta, alpha, dtype)


@lowers("aten.addr.default")
def addr(bias, u, v, beta=1, alpha=1):
    dtype = jnp.result_type(bias, u, v)
    if dtype == jnp.bool_:
        product = u[:, None] & v[None, :]
    else:
        acc = _acc_dtype(dtype) or dtype
        product = u.astype(acc)[:, None] * v.astype(acc)[None, :]
    return _add_product(bias, product, beta, alpha, dtype)


@lowers("aten.linalg_vecdot.default")
def linalg_vecdot(x, y, dim=-1):
    dtype = jnp.result_type(x, y)
    acc = _acc_dtype(dtype) or dtype
    return jnp.sum(x.astype(acc) * y.astype(acc), axis=dim).astype(dtype)


@lowers("aten._trilinear.default")
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """sum over `sumdim` of i1 * i2 * i3, each unsqueezed at its `expand` dims (nn.functional.bilinear)."""
    ndim = i1.ndim + len(expand1)
    letters = string.ascii_letters[:ndim]
    dtype = jnp.result_type(i1, i2, i3)
    operands, subscripts, sizes = [], [], {}
    for x, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        kept = [d for d in range(ndim) if d not in set(expand)]
        operands.append(x)
        subscripts.append("".join(letters[d] for d in kept))
        for d, size in zip(kept, x.shape):
            sizes[d] = size if sizes.get(d, 1) == 1 else sizes[d]
    # broadcast size-1 dims explicitly: einsum wants equal sizes per letter
    operands = [
        jnp.broadcast_to(x, tuple(sizes[letters.index(c)] for c in sub)) for x, sub in zip(operands, subscripts)
    ]
    out_dims = [d for d in range(ndim) if d not in set(sumdim)]
    present = [d for d in out_dims if d in sizes]
    spec = ",".join(subscripts) + "->" + "".join(letters[d] for d in present)
    if dtype == jnp.bool_:
        out = jnp.einsum(spec, *(x.astype(jnp.int32) for x in operands)) != 0
    else:
        out = jnp.einsum(spec, *operands, preferred_element_type=_acc_dtype(dtype))
    return out.reshape(tuple(sizes.get(d, 1) for d in out_dims)).astype(dtype)


# --- pairwise distances --------------------------------------------------------------------------


def _p_norm(diff, p, axis=-1):
    """torch's vector p-norm of differences: p=0 counts nonzeros, inf takes the max."""
    a = jnp.abs(diff)
    if p == 0:
        return jnp.sum((a != 0).astype(diff.dtype), axis=axis)
    if p == float("inf"):
        return jnp.max(a, axis=axis)
    if p == 1:
        return jnp.sum(a, axis=axis)
    if p == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axis))
    return jnp.sum(a**p, axis=axis) ** (1.0 / p)


@lowers("aten._cdist_forward.default")
def cdist_forward(x1, x2, p, compute_mode=None):
    dtype = jnp.result_type(x1, x2)
    acc = _acc_dtype(dtype) or dtype
    a, b = x1.astype(acc), x2.astype(acc)
    rows, cols = x1.shape[-2], x2.shape[-2]
    # torch's choice: 0/None -> matmul form when p == 2 and either side has more than 25 rows; 1 -> always
    use_mm = p == 2 and (compute_mode == 1 or ((compute_mode in (None, 0)) and (rows > 25 or cols > 25)))
    if use_mm:
        na = jnp.sum(a * a, axis=-1, keepdims=True)
        nb = jnp.sum(b * b, axis=-1, keepdims=True)
        ones_a, ones_b = jnp.ones_like(na), jnp.ones_like(nb)
        left = jnp.concatenate([a * -2, na, ones_a], axis=-1)
        right = jnp.concatenate([b, ones_b, nb], axis=-1)
        sq = jnp.matmul(left, jnp.swapaxes(right, -1, -2))
        return jnp.sqrt(jnp.maximum(sq, 0)).astype(dtype)
    diff = a[..., :, None, :] - b[..., None, :, :]
    return _p_norm(diff, p).astype(dtype)


@lowers("aten._pdist_forward.default")
def pdist_forward(x, p=2.0):
    n = x.shape[0]
    i, j = np.triu_indices(n, k=1)
    acc = _acc_dtype(x.dtype) or x.dtype
    xf = x.astype(acc)
    return _p_norm(xf[i] - xf[j], p).astype(x.dtype)
