"""Small test helpers: torch reference outputs, running Python without torch, the real console script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("torch2jax"))


def torch_out(module, *args, **kwargs):
    import torch

    with torch.no_grad():
        return module(*args, **kwargs)


def hlo_computations(hlo: str) -> list[str]:
    """The computations of a compiled module's HLO text (fused ones and the entry), each as its own text."""
    return re.split(r"\n(?=%|ENTRY)", hlo)


def as_jax(t):
    """A torch tensor's values as a jax array (a copy)."""
    import jax.numpy as jnp

    return jnp.asarray(t.detach().numpy())


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


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run the installed `torch2jax` console script as a user would."""
    return subprocess.run([CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def cli_convert_int4(source: Path, out: Path, stage: str, *limits: str) -> dict:
    """`torch2jax convert hf:SOURCE --quantize int4 --group-size 32` (verified; `limits` default to a cache of 96 and
    a batch of 2): checks that the `stage` progress line was shown and that verification ran with the int4 weights
    dequantized and matched every greedy token; returns the manifest's quantization section."""
    limits = limits or ("--max-cache-len", "96", "--max-batch", "2")
    result = cli("convert", f"hf:{source}", *limits, "--quantize", "int4", "--group-size", "32", "--platforms", "cpu",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"[quantize] {stage} to int4" in result.stderr
    assert "its int4 weights dequantized" in result.stdout and "row 1: 16 of 16 greedy tokens equal" in result.stdout
    quantized = json.loads((out / "manifest.json").read_text())["params"]["quantization"]
    assert quantized["scheme"] == "int4" and quantized["group_size"] == 32
    return quantized


def cli_convert_streamed(source: Path, out: Path) -> str:
    """`torch2jax convert hf:SOURCE` of a 2-layer model, its weights streamed (the default) and verified on a 1-layer
    slice: checks that it streamed, verified a slice and matched every greedy token; returns what it printed."""
    result = cli("convert", f"hf:{source}", "--max-cache-len", "32", "--max-batch", "2", "--verify-layers", "1",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "weights streamed from the safetensors files" in result.stdout
    assert "verified a slice against transformers: the first 1 of 2 layers" in result.stdout
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate" in result.stdout
    return result.stdout
