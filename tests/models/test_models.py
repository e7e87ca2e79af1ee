"""Real architectures end to end: convert, save, load (the torch-free loader), compare with torch eager
at the example size and at a second size of every symbolic dim, from one artifact."""

from __future__ import annotations

import pytest
import torch

import torch2jax
from torch2jax.verify import verify

from .zoo import MODELS


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_torch(name, tmp_path):
    torch.manual_seed(0)
    case = MODELS[name]()
    module = case.module.eval()
    model = torch2jax.convert(module, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes)
    torch2jax.save(model, tmp_path / name, platforms=("cpu",))
    loaded = torch2jax.load(tmp_path / name)
    report = verify(module, loaded, case.args, case.kwargs)
    print(f"\n{name}:\n{report.summary()}")
    assert report.passed, report.summary()
    if case.dynamic_shapes:
        assert len(report.runs) == 2 and not report.runs[1].skipped, "the second size did not run"
