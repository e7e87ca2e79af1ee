"""The OpInfo harness's own judgement: what it lets through when torch itself is inexact."""

from __future__ import annotations

import numpy as np
import torch

from .opinfo_harness import CallFn, Prepared, _OpModule, as_accurate_as_torch
from .random_check import _zero_fraction


def _prepared(fn, *inputs) -> Prepared:
    return Prepared(CallFn(fn), inputs, fn(*inputs))


def test_cancellation_lets_through_only_results_as_close_to_float64_as_torchs():
    x = torch.tensor([[1e8, 1.0, -1e8, 3.0]], dtype=torch.float32)  # float32 sums lose the 1.0
    prepared = _prepared(lambda t: t.sum(-1), x)
    assert float(prepared.expected) != 4.0, "torch's float32 sum is inexact here"
    assert as_accurate_as_torch(prepared, np.array([4.0], np.float32)), "the exact sum"
    assert as_accurate_as_torch(prepared, prepared.expected.numpy()), "torch's own sum"
    assert not as_accurate_as_torch(prepared, np.array([40.0], np.float32)), "off by far more than torch"


def test_well_conditioned_results_get_no_slack():
    x = torch.linspace(1, 2, 16, dtype=torch.float32)
    prepared = _prepared(torch.exp, x)
    ours = prepared.expected.numpy() * np.float32(1 + 1e-4)  # 100x float32's tolerance
    assert not as_accurate_as_torch(prepared, ours)
    bf = x.to(torch.bfloat16)
    prepared = _prepared(torch.exp, bf)
    wrong = (prepared.expected.float() * 1.1).to(torch.bfloat16)
    assert not as_accurate_as_torch(prepared, wrong.float().numpy().astype(np.float32))


def test_factory_ops_are_judged_against_their_float64_result():
    """linspace in bfloat16: torch's kernel steps in bfloat16, so some points round one bfloat16 step
    away from the exact value; a result rounded from float32 is closer and passes, a wrong one does not."""
    module = _OpModule(torch.linspace, ((-2.0, 1.0, 50), {"dtype": torch.bfloat16}))
    prepared = Prepared(module, (), module())
    exact = torch.linspace(-2.0, 1.0, 50, dtype=torch.float64)
    rounded = exact.to(torch.bfloat16)
    assert not torch.equal(rounded, prepared.expected), "torch's bfloat16 linspace is not correctly rounded"
    assert as_accurate_as_torch(prepared, rounded.float().numpy())
    assert not as_accurate_as_torch(prepared, (rounded.float() + 0.05).numpy())


def test_random_zero_fraction_counts_flushed_subnormals_as_zero_and_nothing_else():
    tiny = float(np.finfo(np.float32).tiny)
    torch_draw = np.array([0.5, 1e-43, 0.0, 0.5])  # torch keeps a subnormal weight
    xla_draw = np.array([0.5, 0.0, 0.0, 0.5])  # XLA on CPU flushes it
    assert _zero_fraction(torch_draw, tiny) == _zero_fraction(xla_draw, tiny) == 0.5
    assert _zero_fraction(np.array([0.5, 2 * tiny, 0.0, 0.5]), tiny) == 0.25, "a normal number is not zero"
    assert _zero_fraction(np.array([1.0, 0.0, 3.0, 0.0]), 0.0) == 0.5, "integers: exact zeros"
