"""Real architectures end to end: convert, save, load (the torch-free loader), compare with torch eager
at the example size and at a second size of every symbolic dim, from one artifact."""

from __future__ import annotations

import pytest
import torch

import torch2jax
from torch2jax.converter import cast
from torch2jax.verify import verify

from .zoo import LARGE_MODELS, MODELS

# bfloat16 end to end: convert(..., dtype="bfloat16") against the torch module cast to bfloat16,
# within verify's bfloat16 tolerances. Two in the default tier, the rest in the slow one.
BF16_FAST = ["llama", "vit"]
BF16_SLOW = ["bert", "gpt2", "resnet"]


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
        second = [run for run in report.runs if run.label.startswith("second size")]
        assert second and not second[0].skipped, "the second size did not run"


def _check_bfloat16(case):
    module = case.module.eval()
    model = torch2jax.convert(module, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes, dtype="bfloat16")
    reference, args, kwargs = cast(module, case.args, case.kwargs, "bfloat16")
    assert all(str(p.dtype) == "bfloat16" for p in model.params.values() if str(p.dtype).startswith(("float", "bfloat")))
    report = verify(reference, model, args, kwargs)
    print(f"\n{report.summary()}")
    assert report.passed, report.summary()


@pytest.mark.parametrize("name", BF16_FAST)
def test_model_bfloat16_matches_torch(name):
    torch.manual_seed(0)
    _check_bfloat16(MODELS[name]())


@pytest.mark.slow
@pytest.mark.parametrize("name", BF16_SLOW)
def test_model_bfloat16_matches_torch_slow(name):
    torch.manual_seed(0)
    _check_bfloat16(MODELS[name]())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LARGE_MODELS))
def test_large_model_matches_torch(name, tmp_path):
    """Benchmark-sized configs: convert, save, load and compare, as test_model_matches_torch does."""
    torch.manual_seed(0)
    case = LARGE_MODELS[name]()
    module = case.module.eval()
    model = torch2jax.convert(module, case.args, case.kwargs, dynamic_shapes=case.dynamic_shapes)
    torch2jax.save(model, tmp_path / name, platforms=("cpu",))
    report = verify(module, torch2jax.load(tmp_path / name), case.args, case.kwargs)
    print(f"\n{name}:\n{report.summary()}")
    assert report.passed, report.summary()


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="at these sizes bfloat16 round-off (torch's and ours differ in where they round) "
                   "exceeds verify's bfloat16 tolerance: vit_large max abs 0.047, llama_large 0.012; the same before the "
                   "performance rewrites")
@pytest.mark.parametrize("name", ["llama_large", "vit_large", "resnet_large"])
def test_large_model_bfloat16_matches_torch(name):
    torch.manual_seed(0)
    _check_bfloat16(LARGE_MODELS[name]())
