"""unique, unique_dim and unique_consecutive on inputs with repeats.

The OpInfo samples that reach these lowerings are all empty: torch.export refuses the others,
whose output size depends on the values. The lowerings compute the general result for the size the
node records, so they are checked here on real repeats, with that size taken from torch eager.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torch2jax.ir.graph import Node, TensorMeta
from torch2jax.lowering.interpreter import LoweringContext
from torch2jax.ops import lookup


def _run(op: str, x: torch.Tensor, *args):
    """The lowering of `op`, given the output metadata torch eager's results have."""
    expected = getattr(torch.ops.aten, op.split(".")[1]).default(x, *args)
    metas = [TensorMeta(str(t.dtype).removeprefix("torch."), list(t.shape)) for t in expected]
    ctx = LoweringContext(Node("u", op, [], {}, metas), {}, None, 0)
    lowering = lookup(op)
    got = lowering.fn(ctx, x.numpy(), *args)
    return expected, got


def _assert_same(expected, got):
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(np.asarray(have), want.numpy())


def _with_repeats(shape, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.randint(0, 3, shape).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
@pytest.mark.parametrize("inverse,counts", [(False, False), (True, True), (False, True)])
def test_unique_flat(dtype, inverse, counts):
    _assert_same(*_run("aten._unique2.default", _with_repeats((4, 5), dtype), True, inverse, counts))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unique_dim(dim):
    x = _with_repeats((6, 2, 3))
    x[3] = x[0]  # repeated rows along dim 0 for certain
    _assert_same(*_run("aten.unique_dim.default", x, dim, True, True, True))


@pytest.mark.parametrize("dim", [None, 0, 1])
def test_unique_consecutive(dim):
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 5.0], [0.0, 5.0], [1.0, 2.0], [1.0, 1.0]])
    _assert_same(*_run("aten.unique_consecutive.default", x, True, True, dim))
