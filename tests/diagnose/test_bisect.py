"""bisect names the first node whose JAX output departs from torch."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
import torch

from torch2jax.diagnose.bisect import bisect
from torch2jax.ops import registry


class Chain(torch.nn.Module):
    def forward(self, x):
        y = torch.sin(x) * 2
        z = torch.tanh(y)  # the lowering under test is broken on purpose below
        return torch.exp(z) + 1


def test_bisect_finds_no_divergence_on_a_correct_model():
    divergence, checked = bisect(Chain(), (torch.randn(3, 4),))
    assert divergence is None and checked >= 4


def test_bisect_names_the_broken_node():
    original = registry._REGISTRY["aten.tanh.default"]
    registry._REGISTRY["aten.tanh.default"] = registry.Lowering("aten.tanh.default", lambda x: jnp.tanh(x) * 1.01, False, "test")
    try:
        divergence, _ = bisect(Chain(), (torch.randn(3, 4),))
    finally:
        registry._REGISTRY["aten.tanh.default"] = original
    assert divergence is not None
    assert divergence.op == "aten.tanh.default" and divergence.shape == [3, 4]
    assert "test_bisect.py" in divergence.source and "torch.tanh(y)" in divergence.source
    assert "aten.tanh.default" in str(divergence)


class Router(torch.nn.Module):
    """A router whose gate is zero: every expert scores the same, as in a model fresh from its init."""

    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(8, 4, bias=False)
        torch.nn.init.zeros_(self.gate.weight)

    def forward(self, x):
        scores = torch.sigmoid(self.gate(x))
        return torch.topk(scores, 2, dim=-1).indices


def test_bisect_says_when_the_divergence_is_an_order_of_ties():
    """torch's top-k among equal scores picks by its kernel's algorithm, JAX the lowest indices: bisect says so."""
    x = torch.randn(3, 8)
    divergence, _ = bisect(Router(), (x,))
    if torch.equal(Router()(x), torch.tensor([[0, 1]] * 3)):
        pytest.skip("this torch's top-k picks the lowest indices among ties, as JAX does: no divergence to explain")
    assert divergence is not None and divergence.ties and "equal values" in str(divergence)


def test_bisect_does_not_blame_ties_when_there_are_none():
    router = Router()
    torch.nn.init.normal_(router.gate.weight)
    original = registry._REGISTRY["aten.sigmoid.default"]
    registry._REGISTRY["aten.sigmoid.default"] = registry.Lowering("aten.sigmoid.default", lambda x: -jnp.tanh(x), False, "test")
    try:
        divergence, _ = bisect(router, (torch.randn(3, 8),))
    finally:
        registry._REGISTRY["aten.sigmoid.default"] = original
    assert divergence is not None and divergence.op == "aten.sigmoid.default" and not divergence.ties
