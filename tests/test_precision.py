"""float64 when the user enables x64, and no float64 anywhere otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

from .helpers import ROOT

X64_SCRIPT = """
import jax, numpy as np, torch, torch2jax
assert jax.config.jax_enable_x64
torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)).double().eval()
x = torch.randn(5, 6, dtype=torch.float64)
model = torch2jax.convert(module, (x,), dynamic_shapes={"input": {0: "batch"}})
assert {str(v.dtype) for v in model.params.values()} == {"float64"}
x2 = torch.randn(7, 6, dtype=torch.float64)
got = np.asarray(model(x2.numpy()))
with torch.no_grad():
    want = module(x2).numpy()
assert got.dtype == np.float64, got.dtype
err = np.abs(got - want).max()
assert err < 1e-12, err
torch2jax.save(model, "{out}")
loaded = torch2jax.load("{out}")
assert np.abs(np.asarray(loaded(x2.numpy())) - want).max() < 1e-12
print("x64 ok", err)
"""


def test_float64_model_under_x64_matches_torch_float64(tmp_path):
    env = {**os.environ, "JAX_ENABLE_X64": "1"}
    script = X64_SCRIPT.replace("{out}", str(tmp_path / "f64"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "x64 ok" in result.stdout


@pytest.mark.parametrize("name", ["mlp", "cnn", "tiny_gpt"])
def test_no_float64_in_the_compiled_float32_model(converted, name):
    assert not jax.config.jax_enable_x64
    _, args, model = converted(name)
    hlo = jax.jit(model.apply).lower(model.params, *[a.numpy() for a in args]).as_text()
    assert "f64" not in hlo and "xf64" not in hlo
