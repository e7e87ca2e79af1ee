"""Models quantized by torchao convert with their quantized weights: torch.export unwraps torchao's tensor
subclasses into their inner tensors (int8 values, scales, zero points), which become params of their own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax

tq = pytest.importorskip("torchao.quantization", reason="torchao is a test extra; this environment lacks it")


def _quantized(config, layers=(64, 96, 32)):
    torch.manual_seed(0)
    mods = []
    for fan_in, fan_out in zip(layers, layers[1:]):
        mods += [torch.nn.Linear(fan_in, fan_out), torch.nn.ReLU()]
    module = torch.nn.Sequential(*mods[:-1]).eval()
    tq.quantize_(module, config)
    return module


@pytest.mark.parametrize("make_config, scale_shape", [
    (lambda: tq.Int8WeightOnlyConfig(), (96, 1)),
    (lambda: tq.IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=tq.PerGroup(32)), (96, 2)),
], ids=["int8-weight-only", "int4-weight-only"])
def test_a_torchao_weight_only_model_keeps_its_int8_weights_and_matches_torch(make_config, scale_shape, tmp_path):
    module = _quantized(make_config())
    x = torch.randn(5, 64)
    model = torch2jax.convert(module, (x,))
    assert model.params["0.weight.qdata"].dtype == np.int8 and model.params["0.weight.qdata"].shape == (96, 64)
    assert model.params["0.weight.scale"].shape == scale_shape
    assert not any(name.endswith(".weight") for name in model.params), "no float copy of a quantized weight"
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(np.asarray(model(x.numpy())), expected, rtol=1e-5, atol=1e-5)
    torch2jax.save(model, tmp_path / "art")
    loaded = torch2jax.load(tmp_path / "art")
    assert loaded.params["2.weight.qdata"].dtype == np.int8
    np.testing.assert_allclose(np.asarray(loaded(x.numpy())), expected, rtol=1e-5, atol=1e-5)


def test_a_torchao_int8_dynamic_activation_model_multiplies_int8_by_int8():
    # The activation scale is max|x| / 127.5, and XLA:CPU divides by a scalar as a product with its reciprocal
    # (within 1 ulp of torch's quotient, docs/limitations.md); a row whose x / scale lands within that ulp of a
    # rounding boundary takes the neighbouring int8 step. These rows (seed 0) have none, so the int8 x int8
    # product itself is compared exactly.
    module = _quantized(tq.Int8DynamicActivationInt8WeightConfig(), layers=(64, 96))
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    model = torch2jax.convert(module, (x,))
    assert "aten._int_mm.default" in {node.op for node in model.graph.nodes}
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(np.asarray(model(x.numpy())), expected, rtol=1e-5, atol=1e-5)


def test_int_mm_accumulates_int8_products_in_int32():
    a = torch.randint(-128, 128, (17, 64), dtype=torch.int8)
    b = torch.randint(-128, 128, (64, 40), dtype=torch.int8)  # sums of 64 products reach past int16
    model = torch2jax.convert(_IntMM(), (a, b))
    out = np.asarray(model(a.numpy(), b.numpy()))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, torch._int_mm(a, b).numpy())


class _IntMM(torch.nn.Module):
    def forward(self, a, b):
        return torch._int_mm(a, b)
