"""Fused losses that reach the interpreter whole: torch's `F.linear_cross_entropy` custom ops.

`torch_nn::_linear_cross_entropy_batch_chunked[_no_reduction]` compute `cross_entropy(input @ W.T + b,
target, weight, ignore_index, reduction)` a batch chunk at a time. We follow their arithmetic
(torch/nn/modules/linear_cross_entropy.py) where it shows in the result: bfloat16/float16 inputs
compute logits and per-row terms in the accumulation dtype, and a reduced loss is accumulated
chunk by chunk in its output dtype (bfloat16 rounds after every chunk).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from ..errors import LoweringError
from .registry import lowers


def _dtypes(dtype, acc_dtype, acc_policy):
    """torch's (row-weight and denominator dtype, logits dtype) for this input dtype and policy."""
    dtype, acc_dtype = jnp.dtype(dtype), jnp.dtype(acc_dtype)
    if dtype == acc_dtype:
        return dtype, dtype
    if not (dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)) and acc_dtype == jnp.float32):
        raise LoweringError(f"linear_cross_entropy supports float32 acc_dtype with float16/bfloat16 inputs, got {acc_dtype} and {dtype}")
    # float16 under the memory-saving policies keeps its logits in float16; everything else upcasts
    keeps_half = dtype == jnp.float16 and acc_policy in ("balanced", "compact")
    return acc_dtype, dtype if keeps_half else acc_dtype


def _row_terms(x, linear_weight, target, linear_bias, ignore_index, acc, logits_dtype):
    """Per row: the target's shifted logit, log of the softmax denominator, the ignore mask, the gather target."""
    logits = jnp.matmul(
        x.astype(logits_dtype), linear_weight.astype(logits_dtype).T, preferred_element_type=acc
    ).astype(logits_dtype)
    if linear_bias is not None:
        logits = logits + linear_bias.astype(logits_dtype)
    shifted = logits - jnp.max(logits, axis=1, keepdims=True)
    num_classes = linear_weight.shape[0]
    mask = target == ignore_index
    if ignore_index < 0 or ignore_index >= num_classes:  # torch reads class 0 for ignored rows
        target = jnp.where(mask, 0, target)
    picked = jnp.take_along_axis(shifted, target[:, None].astype(jnp.int32), axis=1)[:, 0].astype(acc)
    log_denom = jnp.log(jnp.sum(jnp.exp(shifted), axis=1, dtype=acc))  # the denominator is always in acc
    return picked, log_denom, mask, target


def _row_weights(weight, target, mask, dtype):
    """W[target] (1 without class weights), 0 on ignored rows."""
    if weight is None:
        return (~mask).astype(dtype)
    return jnp.where(mask, jnp.zeros((), dtype), jnp.take(weight, target, axis=0).astype(dtype))


def _chunk_sums(values, chunk):
    """Sum of `values` over each batch chunk of `chunk` rows: (num_chunks,)."""
    n = values.shape[0]
    pad = -n % chunk
    return jnp.pad(values, (0, pad)).reshape(-1, chunk).sum(axis=1)


def _reduced_loss(x, linear_weight, target, linear_bias, weight, reduction, ignore_index, chunk, acc_policy, acc_dtype):
    dtype, logits_dtype = _dtypes(x.dtype, acc_dtype, acc_policy)
    out_dtype = dtype if x.dtype == jnp.float16 else x.dtype
    picked, log_denom, mask, target = _row_terms(x, linear_weight, target, linear_bias, ignore_index, dtype, logits_dtype)
    w = _row_weights(weight, target, mask, dtype)
    if reduction == "mean":
        d = jnp.sum(w)
        w = w / jnp.where(d == 0, jnp.asarray(jnp.nan, dtype), -d)
    else:
        w = -w
    n = x.shape[0]
    if n == 0:
        return jnp.asarray(jnp.nan if reduction == "mean" else 0, out_dtype)
    gains = _chunk_sums(w * picked, chunk)
    losses = _chunk_sums(w * log_denom, chunk)

    def step(total, parts):  # output += <w, picked>; output -= <w, log denom>, each rounded to out_dtype
        gain, loss = parts
        total = (total.astype(dtype) + gain).astype(out_dtype)
        total = (total.astype(dtype) - loss).astype(out_dtype)
        return total, None

    total, _ = lax.scan(step, jnp.zeros((), out_dtype), (gains, losses))
    return total


def _grads(x, linear_weight, target, linear_bias, weight, reduction, ignore_index, chunk, acc_policy, acc_dtype, flags):
    """The gradients the op precomputes in forward (d loss / d input, linear_weight, linear_bias)."""
    compute_input, compute_weight, compute_bias = flags
    empty = (jnp.zeros((0, 0), x.dtype), jnp.zeros((0, 0), x.dtype), jnp.zeros((0,), x.dtype))
    if not any(flags):
        return empty
    dtype = _dtypes(x.dtype, acc_dtype, acc_policy)[0]

    def loss(xx, ww, bb):
        out = _reduced_loss(xx, ww, target, bb, weight, reduction, ignore_index, chunk, acc_policy, acc_dtype)
        return out.astype(dtype)

    primals = (x.astype(dtype), linear_weight.astype(dtype), None if linear_bias is None else linear_bias.astype(dtype))
    _, vjp = jax.vjp(loss, *primals)
    gx, gw, gb = vjp(jnp.ones((), dtype))
    if gb is None:
        gb = jnp.zeros(linear_weight.shape[:-1], dtype)
    return (
        gx.astype(x.dtype) if compute_input else empty[0],
        gw.astype(x.dtype) if compute_weight else empty[1],
        gb.astype(x.dtype) if compute_bias else empty[2],
    )


@lowers("torch_nn._linear_cross_entropy_batch_chunked.default")
def linear_cross_entropy_chunked(
    x, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing, batch_chunk_size,
    acc_policy, acc_dtype, allow_retain_graph, compute_input_grad, compute_linear_weight_grad,
    compute_linear_bias_grad,
):
    """(loss, grad_input, grad_linear_weight, grad_linear_bias); grads are (0, ...) when not asked for."""
    if label_smoothing > 0:
        raise LoweringError("linear_cross_entropy does not support label smoothing (torch's kernel rejects it too)")
    if reduction not in ("mean", "sum"):
        raise LoweringError(f"linear_cross_entropy does not support reduction={reduction!r}")
    args = (x, linear_weight, target, linear_bias, weight, reduction, ignore_index, batch_chunk_size, acc_policy, acc_dtype)
    flags = (compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad)
    return (_reduced_loss(*args), *_grads(*args, flags))


@lowers("torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default")
def linear_cross_entropy_chunked_no_reduction(
    x, linear_weight, target, linear_bias, weight, ignore_index, batch_chunk_size, acc_policy, acc_dtype
):
    """Per-row loss W[t] * (log sum exp - shifted logit[t]), 0 on ignored rows, rounded once to the input dtype."""
    dtype, logits_dtype = _dtypes(x.dtype, acc_dtype, acc_policy)
    picked, log_denom, mask, target = _row_terms(x, linear_weight, target, linear_bias, ignore_index, dtype, logits_dtype)
    return ((log_denom - picked) * _row_weights(weight, target, mask, dtype)).astype(x.dtype)
