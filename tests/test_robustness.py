"""Saving survives being killed; a failing Orbax save is an error; loaded models are thread-safe
and compile once per input shape."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import torch2jax

from .helpers import ROOT


def test_killed_save_leaves_nothing_load_accepts(tmp_path):
    out = tmp_path / "art"
    ready = tmp_path / "ready"
    code = f"""
import pathlib, time, torch, torch2jax
module = torch.nn.Linear(4, 2)
model = torch2jax.convert(module, (torch.randn(3, 4),))
def stall(tmp):
    pathlib.Path({str(ready)!r}).write_text(str(tmp))
    time.sleep(120)
torch2jax.save(model, {str(out)!r}, check=stall)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    try:
        deadline = time.time() + 300
        while not ready.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert ready.exists(), "the save never reached its final step"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not out.exists()
    with pytest.raises(torch2jax.ArtifactError):
        torch2jax.load(out)


def test_failing_orbax_save_is_an_error(converted, tmp_path, monkeypatch):
    import orbax.checkpoint as ocp

    def broken_save(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ocp.StandardCheckpointer, "save", broken_save)
    with pytest.raises(torch2jax.ArtifactError, match="disk full"):
        torch2jax.save(converted("mlp")[2], tmp_path / "art")
    assert list(tmp_path.iterdir()) == []


def test_threads_share_a_loaded_model_and_shapes_compile_once(saved, converted):
    module, _, _ = converted("mlp")
    model = torch2jax.load(saved("mlp"))
    rng = np.random.default_rng(0)
    batches = [int(b) for b in rng.integers(1, 9, size=400)]
    inputs = [rng.standard_normal((b, 16)).astype(np.float32) for b in batches]

    import torch

    with torch.no_grad():
        expected = [module(torch.from_numpy(x)).numpy() for x in inputs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda x: np.asarray(model(x)), inputs))
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert model._jitted._cache_size() == len(set(batches)), "recompiled beyond one compile per input shape"
