"""bisect names the first node whose JAX output departs from torch."""

from __future__ import annotations

import jax.numpy as jnp
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
