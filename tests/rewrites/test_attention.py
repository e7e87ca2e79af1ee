"""Attention lowered whole: safe softmax on fully masked rows, causal alignment and scale, GQA."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

from torch2jax.ops.attention import scaled_dot_product_attention

from ..helpers import as_jax, max_err

# --- attention ---


def _sdpa_both(q, k, v, **kw):
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    jkw = {key: as_jax(val) if isinstance(val, torch.Tensor) else val for key, val in kw.items()}
    return scaled_dot_product_attention(None, as_jax(q), as_jax(k), as_jax(v), **jkw), want


def test_attention_fully_masked_rows_give_zeros():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    mask = torch.rand(2, 1, 5, 6) > 0.3
    mask[0, 0, 2] = False  # one query sees no key
    got, want = _sdpa_both(q, k, v, attn_mask=mask)
    assert max_err(got, want) < 1e-5
    assert float(jnp.abs(got[0, :, 2]).max()) == 0
    float_mask = torch.zeros(2, 1, 5, 6).masked_fill(~mask, float("-inf"))
    got, want = _sdpa_both(q, k, v, attn_mask=float_mask)
    assert max_err(got, want) < 1e-5 and not bool(jnp.isnan(got).any())


@pytest.mark.parametrize("lq, lk", [(4, 7), (7, 4), (5, 5)])
def test_attention_causal_top_left_and_scale(lq, lk):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 2, lq, 8), torch.randn(2, 2, lk, 8), torch.randn(2, 2, lk, 8)
    got, want = _sdpa_both(q, k, v, is_causal=True, scale=0.3)
    assert max_err(got, want) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_attention_gqa_matches_torch(causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    mask = None if causal else torch.randn(2, 1, 5, 5)
    got, want = _sdpa_both(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    assert got.shape == (2, 8, 5, 16)
    assert max_err(got, want) < 1e-5
    grads = jax.grad(lambda q_, k_: jnp.sum(scaled_dot_product_attention(None, q_, k_, as_jax(v), is_causal=causal, enable_gqa=True)),
                     argnums=(0, 1))(as_jax(q), as_jax(k))
    assert grads[0].shape == q.shape and grads[1].shape == k.shape and all(bool(jnp.isfinite(g).all()) for g in grads)
