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


# --- grouped-query attention written with repeated heads ---


class RepeatedHeads(torch.nn.Module):
    """Attention over 2 key/value heads for 8 query heads, the key/value heads repeated as transformers'
    repeat_kv does (each head 4 times in place), next to the same heads tiled (head h reads h % 2), which
    is another attention and must stay as it is."""

    def forward(self, q, k, v):
        def repeated(x):
            b, h, length, d = x.shape
            return x[:, :, None].expand(b, h, 4, length, d).reshape(b, h * 4, length, d)

        grouped = torch.nn.functional.scaled_dot_product_attention(q, repeated(k), repeated(v), is_causal=True, scale=0.2)
        tiled = torch.nn.functional.scaled_dot_product_attention(q, k.repeat(1, 4, 1, 1), v.repeat(1, 4, 1, 1))
        return grouped, tiled


def test_repeated_key_value_heads_attend_grouped():
    import torch2jax
    from torch2jax.lowering import passes

    torch.manual_seed(0)
    module = RepeatedHeads()
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    model = torch2jax.convert(module, (q, k, v), dynamic_shapes={"q": {2: "n"}, "k": {2: "n"}, "v": {2: "n"}})
    attention = [node for node in passes.optimize(model.graph).nodes if node.op == passes.SDPA]
    assert [node.kwargs.get("enable_gqa", False) for node in attention] == [True, False]
    assert [arg["ref"] for arg in attention[0].args[1:3]] == ["k", "v"], "k and v are read as they are"
    clones = [sum(node.op == passes.CLONE for node in graph.nodes) for graph in (model.graph, passes.optimize(model.graph))]
    assert clones[1] == clones[0] - 2, "the repeated copies of k and v are gone"
    for length in (5, 9):
        q, k, v = torch.randn(2, 8, length, 16), torch.randn(2, 2, length, 16), torch.randn(2, 2, length, 16)
        for got, want in zip(model(q.numpy(), k.numpy(), v.numpy()), module(q, k, v)):
            assert max_err(got, want) < 1e-5
    k.requires_grad_(True)
    (module(q, k, v)[0] ** 2).sum().backward()
    grads = jax.grad(lambda p, k_: jnp.sum(model.apply(p, q.numpy(), k_, v.numpy())[0] ** 2), argnums=1)(
        model.params, as_jax(k.detach()))
    assert max_err(grads, k.grad) < 1e-4
