"""Ops whose results only 64-bit types can hold (hash_tensor's uint64), run through the OpInfo sweep
with JAX_ENABLE_X64=1 in a fresh process (x64 must be set before JAX starts)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("samples", ["5", pytest.param("0", marks=pytest.mark.slow, id="every-sample")])
def test_hash_tensor_with_x64(samples):
    """make test runs the first 5 samples of each dtype (20 s); the slow tier every sample (100 s)."""
    env = dict(os.environ, JAX_ENABLE_X64="1", T2J_RUN_KNOWN_FAILURES="1", T2J_OPINFO_DTYPES="all", T2J_OPINFO_SAMPLES=samples)
    env.pop("T2J_OPINFO_REPORT", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/ops/test_opinfo.py", "-k", "hash_tensor"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-2000:]
