"""Costly elementwise values that a consumer broadcasts (RoPE's cos/sin, RMSNorm's rsqrt) are computed once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from torch import nn

import torch2jax
from torch2jax.lowering import passes
from torch2jax.ops import registry

from ..helpers import max_err

# --- expensive elementwise values that a consumer broadcasts: computed once ---


class RotaryTables(nn.Module):
    """cos/sin of a (seq, dim) angle table broadcast into per-head products, as in Llama's RoPE, and
    a per-position bias looked up in a table (T5's relative bias); tanh of the input itself is only
    used at its own size."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 100 ** (torch.arange(0, dim, 2) / dim))
        self.bias = nn.Embedding(16, dim)

    def forward(self, q, positions):
        angles = positions[:, None].float() * self.inv_freq[None]
        angles = torch.cat([angles, angles], -1)
        cos, sin = angles.cos() * 0.5, angles.sin()
        half = q.shape[-1] // 2
        rotated = torch.cat([-q[..., half:], q[..., :half]], -1)
        return q * cos[None, None] + rotated * sin[None, None] + q.tanh() + self.bias(positions)[None, None]


def test_broadcast_costly_ops_are_computed_once(tmp_path):
    torch.manual_seed(0)
    module = RotaryTables()
    q, positions = torch.randn(2, 3, 5, 8), torch.arange(5)
    dims = {"q": {0: "batch", 2: "seq"}, "positions": {0: "seq"}}
    model = torch2jax.convert(module, (q, positions), dynamic_shapes=dims)
    wrapped = [node.args[0] for node in passes.optimize(model.graph).nodes if node.op == passes.COMPUTED_ONCE]
    assert sorted(wrapped) == ["aten.cos.default", "aten.embedding.default", "aten.sin.default"], "tanh(q) is not"
    with torch.no_grad():
        want = module(q, positions)
    assert max_err(model(q.numpy(), positions.numpy()), want) < 1e-5
    hlo = jax.jit(model.apply).lower(model.params, q.numpy(), positions.numpy()).compile().as_text()
    cos_shapes = {line.split(" = ")[1].split("{")[0] for line in hlo.splitlines() if " cosine(" in line}
    assert cos_shapes and all(shape.count(",") < 3 for shape in cos_shapes), f"cos of the table, not per product: {cos_shapes}"
    grad = jax.grad(lambda x: jnp.sum(model(x, positions.numpy()) ** 2))(jnp.asarray(q.numpy()))
    q_ = q.clone().requires_grad_()
    (module(q_, positions) ** 2).sum().backward()
    assert max_err(grad, q_.grad) < 1e-4
    param_grads = jax.grad(lambda p: jnp.sum(model.apply(p, q.numpy(), positions.numpy()) ** 2))(model.params)
    assert max_err(param_grads["bias.weight"], module.bias.weight.grad) < 1e-4, "the table's grads pass the conditional"
    batched_positions = torch.stack([positions, positions.flip(0)])  # vmap batches the conditional's predicate
    got = jax.vmap(lambda p: model.apply(model.params, q.numpy(), p))(batched_positions.numpy())
    with torch.no_grad():
        assert max_err(got, torch.stack([module(q, p) for p in batched_positions])) < 1e-5
    torch2jax.save(model, tmp_path / "rope")
    loaded = torch2jax.load(tmp_path / "rope")
    q2, p2 = torch.randn(3, 3, 7, 8), torch.arange(7)
    with torch.no_grad():
        assert max_err(loaded(q2.numpy(), p2.numpy()), module(q2, p2)) < 1e-5


def test_computed_once_leaves_a_replacement_lowering_that_needs_context(monkeypatch):

    with_context = registry.Lowering("aten.cos.default", lambda ctx, x: jnp.cos(x), True, "test")
    monkeypatch.setitem(registry._REGISTRY, "aten.cos.default", with_context)
    torch.manual_seed(0)
    module = RotaryTables()
    q, positions = torch.randn(2, 3, 5, 8), torch.arange(5)
    model = torch2jax.convert(module, (q, positions))
    wrapped = [node.args[0] for node in passes.optimize(model.graph).nodes if node.op == passes.COMPUTED_ONCE]
    assert "aten.cos.default" not in wrapped and "aten.sin.default" in wrapped
    with torch.no_grad():
        assert max_err(model(q.numpy(), positions.numpy()), module(q, positions)) < 1e-5
