"""Pools run channels-last, or as strided slices where windows tile the input or are dilated, keep
torch's values and gradients (ties included)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch2jax
from torch2jax.ops.pooling import avg_pool2d, max_pool2d_with_indices, max_pool3d_with_indices

from ..helpers import as_jax, max_err

# --- pooling, run channels-last -------------------------------------------------------------------


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", [(3, 2, 1, False), (2, 2, 0, True), (3, 2, 0, True)])
def test_pooling_channels_last_matches_torch(kernel, stride, padding, ceil_mode):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 11, 13)
    values, indices = max_pool2d_with_indices(as_jax(x), [kernel] * 2, [stride] * 2, [padding] * 2, [1, 1], ceil_mode)
    want_values, want_indices = torch.nn.functional.max_pool2d(x, kernel, stride, padding, 1, ceil_mode, return_indices=True)
    assert max_err(values, want_values) == 0
    np.testing.assert_array_equal(np.asarray(indices), want_indices.numpy())
    for include in (True, False):
        got = avg_pool2d(as_jax(x), [kernel] * 2, [stride] * 2, [padding] * 2, ceil_mode, include)
        want = torch.nn.functional.avg_pool2d(x, kernel, stride, padding, ceil_mode, include)
        assert max_err(got, want) < 1e-6


class Pools(nn.Module):
    def __init__(self, kernel, stride, ceil_mode=False):
        super().__init__()
        self.args = dict(kernel_size=kernel, stride=stride, ceil_mode=ceil_mode)

    def forward(self, x):
        return torch.nn.functional.max_pool2d(x, **self.args), torch.nn.functional.avg_pool2d(x, **self.args)


TILED_POOLS = [  # (spatial, kernel, stride, ceil_mode, tiles exactly)
    ((8, 6), 2, 2, False, True),
    ((9, 6), 3, 3, True, True),
    ((8, 12), (2, 4), (2, 4), False, True),
    ((9, 6), 2, 2, False, False),  # a row left over
    ((9, 7), 2, 2, True, False),  # ceil_mode's partial windows
    ((8, 8), 3, 2, False, False),  # overlapping windows
]


@pytest.mark.parametrize("spatial, kernel, stride, ceil_mode, tiles", TILED_POOLS)
def test_pools_over_exact_tiles_are_strided_slices(spatial, kernel, stride, ceil_mode, tiles):
    torch.manual_seed(0)
    x = torch.randn(2, 3, *spatial).mul(2).round().requires_grad_()  # ties: the gradient goes where torch's does
    module = Pools(kernel, stride, ceil_mode)
    want = module(x)
    jm = torch2jax.convert(module, (x.detach(),))
    got = jax.jit(jm.apply)(jm.params, as_jax(x))
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape)
        assert max_err(g, w) < 1e-6
    grad = jax.grad(lambda xj: sum(jnp.sum(y**3 + y) for y in jm.apply(jm.params, xj)))(as_jax(x))
    sum((y**3 + y).sum() for y in want).backward()
    assert max_err(grad, x.grad) < 1e-5 * float(x.grad.abs().max())
    hlo = jax.jit(jm.apply).lower(jm.params, as_jax(x)).as_text()
    windows = hlo.count("reduce_window")
    if tiles:
        assert windows == 0, "windows that tile the input exactly are strided slices, not reduce_window"
    else:
        assert windows > 0


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", [(2, 2, 0, False), (3, 1, 1, False), (3, 2, 1, True)])
def test_dilated_max_pool_matches_torch_with_gradients(kernel, stride, padding, ceil_mode):
    # JAX has no gradient for a dilated max reduce_window: these windows are strided slices
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 10).mul(2).round().requires_grad_()  # with ties
    x.data[0, 0, 0, 0] = float("nan")
    want = torch.nn.functional.max_pool2d(x, kernel, stride, padding, dilation=2, ceil_mode=ceil_mode)
    values, _ = max_pool2d_with_indices(as_jax(x), [kernel] * 2, [stride] * 2, [padding] * 2, [2, 2], ceil_mode)
    np.testing.assert_array_equal(np.asarray(values), want.detach().numpy())  # NaN where torch has it
    pooled = lambda xj: max_pool2d_with_indices(xj, [kernel] * 2, [stride] * 2, [padding] * 2, [2, 2], ceil_mode)[0]  # noqa: E731
    grad = jax.grad(lambda xj: jnp.sum(jnp.nan_to_num(pooled(xj)) ** 3 + pooled(xj)))(as_jax(x))
    (torch.nan_to_num(want) ** 3 + want).sum().backward()
    np.testing.assert_allclose(np.asarray(grad), x.grad.numpy(), rtol=1e-5)


MAX_POOLS_CPU = [  # (spatial, kernel, stride, padding, ceil_mode)
    ((12, 10), 3, 2, 1, False),  # a ResNet's stem pool: overlapping, padded
    ((8, 6), 2, 2, 0, False),  # tiles exactly
    ((9, 7), 3, 2, 0, True),  # ceil_mode's partial windows
    ((9, 8), (3, 2), (1, 2), (1, 0), False),
    ((6, 5, 7), 3, 2, 1, False),
]


@pytest.mark.parametrize("spatial, kernel, stride, padding, ceil_mode", MAX_POOLS_CPU)
def test_max_pool_on_cpu_is_channels_last_slices(spatial, kernel, stride, padding, ceil_mode):
    """No reduce_window on CPU; ties and NaNs pick (in values and gradients) the elements torch's kernel picks."""
    n = len(spatial)
    pool = {2: torch.nn.functional.max_pool2d, 3: torch.nn.functional.max_pool3d}[n]
    lowering = {2: max_pool2d_with_indices, 3: max_pool3d_with_indices}[n]
    args = [v if isinstance(v, tuple) else (v,) * n for v in (kernel, stride, padding)]
    torch.manual_seed(0)
    x = torch.randn(2, 3, *spatial).mul(2).round()  # ties
    x[0, 0, (1,) * n] = x[1, 2, (2,) * n] = x[1, 2, (3,) * n] = float("nan")
    x.requires_grad_()
    want = pool(x, *args, ceil_mode=ceil_mode)

    def pooled(xj):
        return lowering(xj, *args, (1,) * n, ceil_mode)[0]

    compiled = jax.jit(pooled).lower(as_jax(x)).compile()
    assert "reduce-window" not in compiled.as_text(), "max pools on CPU are strided slices, not reduce_window"
    np.testing.assert_array_equal(np.asarray(compiled(as_jax(x))), want.detach().numpy())
    grad = jax.jit(jax.grad(lambda xj: jnp.sum(jnp.nan_to_num(pooled(xj)) ** 3 + pooled(xj))))(as_jax(x))
    (torch.nan_to_num(want) ** 3 + want).sum().backward()
    np.testing.assert_allclose(np.asarray(grad), x.grad.numpy(), rtol=1e-5)


def test_a_pool_over_symbolic_spatial_sizes_says_what_to_do(tmp_path):
    """Saving exports with the symbolic sizes; the windows' padding cannot be decided there."""
    from torch2jax.errors import LoweringError

    dims = {"input": {2: {"name": "h", "min": 8, "max": 64}, 3: {"name": "w", "min": 8, "max": 64}}}
    model = torch2jax.convert(nn.MaxPool2d(3, 2, 1), (torch.randn(2, 4, 17, 20),), dynamic_shapes=dims)
    with pytest.raises(LoweringError, match="symbolic spatial size .* export with static spatial sizes"):
        torch2jax.save(model, tmp_path / "pool")
    assert not (tmp_path / "pool").exists()
