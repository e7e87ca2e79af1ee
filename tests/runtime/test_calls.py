"""Calling a model: every input check still runs on the fast path (once per input signature), and a
missing, extra or misspelled input is named with the model's signature."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import torch2jax

from ..helpers import max_err, torch_out


class Masked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 4)

    def forward(self, x, mask, *, scale=None):
        y = self.proj(x * mask.to(x.dtype))
        return y if scale is None else y * scale


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    """(module, in-memory model, loaded model) for forward(x, mask) with a symbolic batch."""
    torch.manual_seed(0)
    module = Masked().eval()
    x, mask = torch.randn(3, 16), torch.rand(3, 16) > 0.5
    model = torch2jax.convert(module, (x, mask), dynamic_shapes={"x": {0: "batch"}, "mask": {0: "batch"}})
    out = tmp_path_factory.mktemp("calls") / "masked"
    torch2jax.save(model, out)
    return module, model, torch2jax.load(out)


def inputs(batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, 16), dtype=np.float32), rng.random((batch, 16)) > 0.5


@pytest.mark.parametrize("which", ["converted", "loaded"])
def test_missing_and_unexpected_inputs_are_named(two_inputs, which):
    model = two_inputs[1] if which == "converted" else two_inputs[2]
    x, mask = inputs(2)
    signature = r"the model takes \(x: float32\[batch, 16\], mask: bool\[batch, 16\]\)"
    with pytest.raises(torch2jax.SignatureError, match=r"missing input 'mask' \(bool\[batch, 16\]\): " + signature):
        model(x)
    with pytest.raises(torch2jax.SignatureError, match=r"missing input 'x' \(float32\[batch, 16\]\); 'mask'"):
        model()
    with pytest.raises(torch2jax.SignatureError, match=r"unexpected input: 3 positional inputs given, " + signature):
        model(x, mask, mask)
    with pytest.raises(torch2jax.SignatureError, match=r"unexpected keyword input 'scale': " + signature):
        model(x, mask, scale=np.float32(2))


def test_a_missing_keyword_input_is_named():
    module = Masked().eval()
    x, mask = torch.randn(2, 16), torch.ones(2, 16, dtype=torch.bool)
    model = torch2jax.convert(module, (x, mask), {"scale": torch.tensor(2.0)})
    with pytest.raises(torch2jax.SignatureError, match=r"missing keyword input 'scale' \(float32\[\]\)"):
        model(x.numpy(), mask.numpy())
    with pytest.raises(torch2jax.SignatureError, match=r"unexpected keyword input 'scal'"):
        model(x.numpy(), mask.numpy(), scal=np.float32(2))
    assert max_err(model(x.numpy(), mask.numpy(), scale=np.float32(2)), torch_out(module, x, mask, scale=torch.tensor(2.0))) < 1e-5


@pytest.mark.parametrize("which", ["converted", "loaded"])
def test_checks_still_run_after_a_thousand_good_calls(two_inputs, which):
    module, converted, loaded = two_inputs
    model = converted if which == "converted" else loaded
    x, mask = inputs(5)
    good = [jax.device_put(x), jax.device_put(mask)]
    for _ in range(1000):
        got = model(*good)
    assert max_err(got, torch_out(module, torch.from_numpy(x), torch.from_numpy(mask))) < 1e-5
    with pytest.raises(torch2jax.SignatureError, match=r"input 'x' expects dtype float32, got int32"):
        model(x.astype(np.int32), mask)
    with pytest.raises(torch2jax.SignatureError, match=r"input 'mask' expects bool\[batch, 16\], got shape \[5, 15\]"):
        model(x, mask[:, :15])
    with pytest.raises(torch2jax.SignatureError, match=r"input 'mask' axis 0 is dim 'batch' = 4, but input 'x' gave batch = 5"):
        model(x, mask[:4])
    with pytest.raises(torch2jax.SignatureError, match=r"input 'x' must be an array \(float32\[batch, 16\]\), got str"):
        model("x", mask)
    with pytest.raises(torch2jax.SignatureError, match=r"input 'mask' must be an array \(bool\[batch, 16\]\), got dict"):
        model(x, {"mask": mask})
    assert max_err(model(*good), got) == 0.0  # a refused call leaves the model as it was


def test_each_input_signature_compiles_once(two_inputs):
    _, model, _ = two_inputs
    fresh = torch2jax.Model(model._run, model.params, model.graph)
    for batch in (1, 2, 1, 2, 7, 7):
        fresh(*inputs(batch))
    assert fresh._jitted._cache_size() == 3


class Unsorted(torch.nn.Module):
    def forward(self, x):
        return {"zeta": x + 1, "alpha": {"y": x * 2, "b": x - 1}, "mid": (x, x * 3)}


def _converted_and_loaded(module: torch.nn.Module, x: torch.Tensor, out) -> tuple:
    """The model `convert` gives, and the same model saved to `out` and loaded: each output check runs on both."""
    model = torch2jax.convert(module, (x,))
    return model, torch2jax.load(torch2jax.save(model, out))


def test_outputs_keep_the_modules_key_order(tmp_path):
    x = torch.randn(2, 3)
    for m in _converted_and_loaded(Unsorted(), x, tmp_path / "unsorted"):
        out = m(x.numpy())
        assert list(out) == ["zeta", "alpha", "mid"] and list(out["alpha"]) == ["y", "b"]
        assert max_err(out["alpha"]["b"], x - 1) < 1e-6 and max_err(out["mid"][1], x * 3) < 1e-6


class WithSizes(torch.nn.Module):
    """Returns python ints beside a tensor, as MaskFormer-Swin returns its stages' spatial sizes."""

    def forward(self, x):
        return {"y": x * 2, "sizes": (x.shape[-1], x.shape[-1] // 2)}


def test_python_values_a_model_returns_stay_python_values(tmp_path):
    x = torch.randn(2, 8)
    for m in _converted_and_loaded(WithSizes(), x, tmp_path / "sizes"):
        out = m(x.numpy())
        assert out["sizes"] == (8, 4) and all(type(v) is int for v in out["sizes"])
        assert max_err(out["y"], x * 2) == 0



class LateField(torch.nn.Module):
    """Returns a transformers ModelOutput whose field set last comes first in its class: it flattens in the
    order set, is rebuilt in field order (as an image encoder's output is, e.g. AyaVision's)."""

    def forward(self, x):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        out = BaseModelOutputWithPooling(last_hidden_state=x + 1, hidden_states=(None, x * 2))
        out.pooler_output = x.sum(-1)
        return out


def test_model_outputs_set_out_of_field_order_keep_their_leaves():
    pytest.importorskip("transformers", reason="ModelOutput comes from transformers")
    x = torch.randn(2, 3)
    want = LateField()(x)
    out = torch2jax.convert(LateField(), (x,))(x.numpy())
    assert list(out) == list(want) == ["last_hidden_state", "hidden_states", "pooler_output"]
    assert out["hidden_states"][0] is None and max_err(out["hidden_states"][1], want["hidden_states"][1]) < 1e-6
    assert max_err(out["pooler_output"], want["pooler_output"]) < 1e-6
