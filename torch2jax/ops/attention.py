"""scaled_dot_product_attention, kept whole (not decomposed) so XLA sees one attention op."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..registry import lowers


@lowers("aten.scaled_dot_product_attention.default")
def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise NotImplementedError("attention dropout in train mode is not supported yet; call module.eval()")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        repeat = q.shape[-3] // k.shape[-3]
        k = jnp.repeat(k, repeat, axis=-3)
        v = jnp.repeat(v, repeat, axis=-3)
    acc = jnp.float32 if q.dtype in (jnp.bfloat16, jnp.float16) else q.dtype
    scores = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=acc) * scale
    if is_causal:
        lq, lk = q.shape[-2], k.shape[-2]
        causal = jnp.tril(jnp.ones((lq, lk), dtype=bool))
        scores = jnp.where(causal, scores, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + attn_mask.astype(scores.dtype)
    weights = jax.nn.softmax(scores, axis=-1)
    # torch's safe softmax: a row with every key masked out attends to nothing (zeros, not NaN)
    weights = jnp.where(jnp.all(scores == -jnp.inf, axis=-1, keepdims=True), 0, weights)
    return jnp.einsum("...qk,...kd->...qd", weights.astype(v.dtype), v, preferred_element_type=acc).astype(q.dtype)
