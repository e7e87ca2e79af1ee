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

from ..helpers import ROOT


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

    monkeypatch.setattr(ocp.AsyncCheckpointer, "save", broken_save)  # what artifact.save writes params with
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


def test_processes_load_one_artifact_read_only_at_once(saved, converted):
    module, _, _ = converted("mlp")
    path = saved("mlp")
    before = {p: p.stat().st_mtime_ns for p in path.rglob("*")}
    path.chmod(0o555)  # read-only: loading must not write next to the artifact
    code = (
        "import sys, numpy as np, torch2jax\n"
        "m = torch2jax.load(sys.argv[1])\n"
        "x = np.random.default_rng(int(sys.argv[2])).standard_normal((int(sys.argv[2]), 16)).astype(np.float32)\n"
        "np.save(sys.argv[3], np.asarray(m(x)))\n"
    )
    try:
        procs = [
            subprocess.Popen([sys.executable, "-c", code, str(path), str(i + 1), str(path.parent / f"out{i}.npy")],
                             stderr=subprocess.PIPE, text=True)
            for i in range(4)
        ]
        errors = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        path.chmod(0o755)
    import torch

    for i, (proc, err) in enumerate(zip(procs, errors)):
        assert proc.returncode == 0, err
        x = np.random.default_rng(i + 1).standard_normal((i + 1, 16)).astype(np.float32)
        with torch.no_grad():
            want = module(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(np.load(path.parent / f"out{i}.npy"), want, rtol=1e-5, atol=1e-5)
    assert {p: p.stat().st_mtime_ns for p in path.rglob("*")} == before


def test_thousands_of_calls_keep_memory_flat_and_compile_once_per_shape(saved):
    # the CNN's inputs are ~50 KB a call on average: keeping any per-call buffer alive would add >100 MB
    model = torch2jax.load(saved("cnn"))
    rng = np.random.default_rng(1)
    sizes = [1, 2, 3, 5, 8]
    inputs = {b: rng.standard_normal((b, 3, 32, 32)).astype(np.float32) for b in sizes}

    def drive(calls: int) -> None:
        for i in range(calls):
            np.asarray(model(inputs[sizes[i % len(sizes)]]))

    drive(500)  # warm-up: every shape compiled, allocator pools filled
    rss_before = _resident_mb()
    drive(3000)
    growth_mb = _resident_mb() - rss_before
    assert growth_mb < 50, f"resident memory grew by {growth_mb:.0f} MB over 3000 calls: something leaks"
    assert model._jitted._cache_size() == len(sizes), "recompiled beyond one compile per input shape"


def _resident_mb() -> float:
    """Current resident set size (not the peak: earlier tests in this process may have set that)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
