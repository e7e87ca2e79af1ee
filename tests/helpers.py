"""Small test helpers: torch reference outputs and running Python without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def torch_out(module, *args, **kwargs):
    import torch

    with torch.no_grad():
        return module(*args, **kwargs)


def max_err(got, want) -> float:
    """Max abs difference between a JAX/numpy array and a torch tensor (or array)."""
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    return float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want.astype(np.float64))))


def run_without_torch(code: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where importing torch fails."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "without_torch.py"), "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
