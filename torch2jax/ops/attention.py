"""scaled_dot_product_attention, kept whole (not decomposed) so XLA sees one attention op."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from ..ir.graph import Node
from .random import dropout, random_when
from .registry import lowers

_SDPA = "aten.scaled_dot_product_attention.default"


def _has_dropout(node: Node) -> bool:
    """dropout_p is the 5th argument; a non-literal (symbolic) value counts as drawing."""
    p = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
    return not isinstance(p, (int, float)) or p != 0


random_when(_SDPA, _has_dropout)
_CPU_FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def _flash_has_dropout(node: Node) -> bool:
    p = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
    return not isinstance(p, (int, float)) or p != 0


random_when(_CPU_FLASH, _flash_has_dropout)


@lowers(_SDPA, ctx=True)
def scaled_dot_product_attention(
    ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch's math attention: softmax(q k^T * scale + mask) v, in float32 for low precision.

    A row whose every key is masked out (-inf) attends to nothing and gives zeros, as torch's safe
    softmax does. With enable_gqa, each group of q heads shares a k/v head: a group's queries become
    the rows of one product with its k/v head instead of copying k and v per group. dropout_p > 0
    (training) drops attention weights with the node's key and rescales the rest, as torch does.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    groups = q.shape[-3] // k.shape[-3] if enable_gqa and k.shape[-3] != q.shape[-3] else 1
    acc = jnp.float32 if q.dtype in (jnp.bfloat16, jnp.float16) else q.dtype
    lq, lk = q.shape[-2], k.shape[-2]
    if groups > 1:  # (..., Hq, L, D) -> (..., Hkv, G*L, D): a group's queries are rows of one product per k/v head
        q = q.reshape(q.shape[:-3] + (k.shape[-3], groups * lq, q.shape[-1]))
    scores = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=acc) * scale
    if groups > 1:
        scores = scores.reshape(scores.shape[:-3] + (-1, lq, lk))
    if is_causal:
        causal = jnp.tril(jnp.ones((lq, lk), dtype=bool))  # top-left aligned, as torch's
        scores = jnp.where(causal, scores, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + attn_mask.astype(scores.dtype)
    weights = _safe_softmax(scores)
    if dropout_p:
        weights, _ = dropout(ctx, weights, dropout_p)
    if groups > 1:
        weights = weights.reshape(weights.shape[:-3] + (k.shape[-3], groups * lq, lk))
    out = jnp.einsum("...qk,...kd->...qd", weights.astype(v.dtype), v, preferred_element_type=acc)
    if groups > 1:
        out = out.reshape(out.shape[:-3] + (-1, lq, out.shape[-1]))
    return out.astype(q.dtype)


@lowers(_CPU_FLASH, ctx=True)
def flash_attention_for_cpu(ctx, q, k, v, dropout_p=0.0, is_causal=False, attn_mask=None, scale=None):
    """The op torch's CPU SDPA dispatches to where autograd needs it (torch.compile's training graphs):
    (output, logsumexp of the scaled, masked scores per query, float32). The backward
    (ops/backward.py) recomputes from q, k, v and reads neither."""
    out = scaled_dot_product_attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...qd,...kd->...qk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones(scores.shape[-2:], dtype=bool)), scores, -jnp.inf)
    if attn_mask is not None:
        scores = jnp.where(attn_mask, scores, -jnp.inf) if attn_mask.dtype == jnp.bool_ else scores + attn_mask
    return out, jax.nn.logsumexp(scores, axis=-1)


def _safe_softmax(scores):
    """Softmax over the last axis; a row that is all -inf gives zeros (torch's _safe_softmax).

    The row max, which softmax needs anyway, is -inf exactly when every entry is -inf (a NaN makes
    the max NaN and the row NaN, as in torch), so no second reduction over the scores is needed.
    """
    top = lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
    unnormalized = jnp.exp(scores - top)
    weights = unnormalized / jnp.sum(unnormalized, axis=-1, keepdims=True)
    return jnp.where(top == -jnp.inf, 0, weights)
