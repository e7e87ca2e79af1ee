"""Upsampling by a whole factor as interleaved shifted slices (no gather) keeps torch's values and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
from torch import nn

import torch2jax

from ..helpers import as_jax, max_err

# --- upsampling by a whole factor, as interleaved slices ---

# (input spatial shape, interpolate kwargs, whether every spatial dim is a whole-factor upsample). The
# graph keeps nearest and bilinear 2-d whole; torch's decompositions take the other modes to aten.index.
UPSAMPLE = [
    ((6, 5), dict(scale_factor=2, mode="nearest"), True),
    ((6, 5), dict(size=(18, 10), mode="nearest"), True),
    ((6, 5), dict(scale_factor=2, mode="bilinear"), True),
    ((6, 5), dict(scale_factor=3, mode="bilinear"), True),
    ((6, 5), dict(size=(24, 20), mode="bilinear"), True),
    ((1, 5), dict(scale_factor=2, mode="bilinear"), True),
    ((6, 5), dict(scale_factor=2, mode="bilinear", align_corners=True), True),
    ((6, 5), dict(size=(9, 7), mode="bilinear"), False),
    ((6, 5), dict(scale_factor=1.5, mode="nearest"), False),
    ((6, 5), dict(size=(3, 10), mode="bilinear"), False),
]


class Interpolate(nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        return torch.nn.functional.interpolate(x, **self.kwargs)


@pytest.mark.parametrize("spatial, kwargs, sliced", UPSAMPLE, ids=[f"{s}-{k}" for s, k, _ in UPSAMPLE])
def test_upsample_matches_torch_and_whole_factors_need_no_gather(spatial, kwargs, sliced):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *spatial, requires_grad=True)
    module = Interpolate(**kwargs)
    want = module(x)
    jm = torch2jax.convert(module, (x.detach(),))
    got = jax.jit(jm.apply)(jm.params, as_jax(x))
    assert got.shape == tuple(want.shape)
    assert max_err(got, want) < 1e-6 * float(want.abs().max())
    grad = jax.grad(lambda xj: jnp.sum(jm.apply(jm.params, xj) ** 3))(as_jax(x))
    (want**3).sum().backward()
    assert max_err(grad, x.grad) < 1e-5 * float(x.grad.abs().max())
    hlo = jax.jit(jm.apply).lower(jm.params, as_jax(x)).as_text()
    if sliced:
        assert "gather" not in hlo, "a whole-factor upsample reads shifted slices, not a gather"
    else:
        assert "gather" in hlo, "other sizes keep the general (gather) form"
