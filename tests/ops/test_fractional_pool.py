"""Fractional max pooling with its random samples given: the lowering must equal torch exactly.

The OpInfo sweep can only check properties (torch draws the window offsets inside the op); here the
draws are an input, so values and indices are compared bit for bit, ties and NaNs included.
"""

from __future__ import annotations

import pytest
import torch

from torch2jax.capture.torch_arrays import to_numpy

from .opinfo_harness import CallFn, Prepared, compare, convert_sample

CASES = [
    # n, input shape, kernel, output size
    (2, (2, 3, 9, 9), (2, 2), (3, 3)),
    (2, (3, 8, 11), (3, 2), (4, 5)),
    (2, (1, 2, 7, 7), (3, 3), (1, 1)),
    (3, (2, 2, 6, 7, 8), (2, 2, 2), (3, 3, 4)),
    (3, (2, 6, 6, 6), (3, 2, 2), (2, 3, 1)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n,shape,kernel,out", CASES, ids=[str(c[1]) for c in CASES])
def test_fractional_max_pool_matches_torch(n, shape, kernel, out, dtype):
    torch.manual_seed(0)
    x = torch.randn(shape).to(dtype)
    x[..., 1] = x[..., 2]  # ties: the first maximum wins
    x.view(-1)[5] = float("nan")  # NaN wins
    batch, channels = (shape[0], shape[1]) if len(shape) == n + 2 else (1, shape[0])
    samples = torch.rand(batch, channels, n).to(dtype)
    op = torch.ops.aten.fractional_max_pool2d if n == 2 else torch.ops.aten.fractional_max_pool3d
    module = CallFn(lambda x, u: op(x, kernel, out, u))
    with torch.no_grad():
        expected = module(x, samples)
    model = convert_sample(Prepared(module, (x, samples), expected))
    got = model(to_numpy(x), to_numpy(samples))
    compare(expected, got, "output")
