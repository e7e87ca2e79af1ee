"""Average pooling on integer inputs, which torch accepts (its OpInfo samples are floating only): the
window sum divided as torch's integer division does, truncating toward zero; local_response_norm of an
integer input gives float32 as torch's does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax

POOLS = {1: torch.nn.AvgPool1d, 2: torch.nn.AvgPool2d, 3: torch.nn.AvgPool3d}
CONFIGS = [  # kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    (3, 2, 1, False, True, None),
    (3, 2, 1, True, False, None),
    (2, 2, 0, False, True, None),
    (3, 1, 1, True, True, None),
    (3, 2, 1, False, True, 4),
]


CASES = [(n, config) for n in POOLS for config in CONFIGS if n > 1 or config[-1] is None]  # AvgPool1d: no divisor_override


@pytest.mark.parametrize("n, config", CASES, ids=str)
def test_avg_pool_of_integers_matches_torch(n, config):
    kernel, stride, padding, ceil_mode, count_include_pad, divisor = config
    extra = {} if divisor is None else {"divisor_override": divisor}
    module = POOLS[n](kernel, stride, padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad, **extra)
    torch.manual_seed(n)
    x = torch.randint(-50, 50, (2, 3) + (7,) * n)  # negative sums: truncation toward zero, not floor
    model = torch2jax.convert(module, (x,))
    got = np.asarray(model(x.numpy().astype(np.int32)))
    want = module(x).numpy()
    assert np.issubdtype(got.dtype, np.integer)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape", [(2, 4, 5), (2, 4, 5, 5), (2, 4, 3, 3, 3)])
def test_local_response_norm_of_integers_matches_torch(shape):
    module = torch.nn.LocalResponseNorm(3)
    x = torch.randint(-50, 50, shape)
    got = np.asarray(torch2jax.convert(module, (x,))(x.numpy().astype(np.int32)))
    want = module(x).numpy()
    assert got.dtype == want.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
