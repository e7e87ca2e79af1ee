"""What a CI step gets when something is wrong: the --report file and the one-op reproduction script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import ROOT, cli

BROKEN_ADDMM = """
import torch2jax

@torch2jax.register_lowering("aten.addmm.default", replace=True)
def addmm(bias, a, b, beta=1, alpha=1):
    raise ValueError("deliberately broken for the test")
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_convert_report_lists_stages_ops_errors_and_environment(tmp_path):
    report = tmp_path / "report.md"
    result = cli("convert", "sample_models/mlp.py:MLP", "--out", str(tmp_path / "mlp"), "--report", str(report), "-q")
    assert result.returncode == 0, result.stderr
    text = report.read_text()
    assert "- result: **ok**" in text
    for stage in ("| export |", "| decompose |", "| lower |", "| jax.export |", "| save |", "| verify |"):
        assert stage in text, stage
    for run in ("| example inputs |", "| random inputs |", "| second size (batch="):
        assert run in text, run
    assert "`aten.addmm.default`" in text and "ops kept whole" in text
    assert "jax 0." in text and "torch 2." in text


def test_verify_report_records_a_mismatch(tmp_path):
    out = tmp_path / "mlp"
    assert cli("convert", "sample_models/mlp.py:MLP", "--out", str(out), "--no-verify", "-q").returncode == 0
    report = tmp_path / "verify.md"
    # another seed builds the torch module with other random weights: the artifact no longer matches it
    result = cli("verify", str(out), "sample_models/mlp.py:MLP", "--seed", "1", "--report", str(report))
    assert result.returncode == 3, result.stderr
    text = report.read_text()
    assert "- result: **numerics differ**" in text and "**NO**" in text and "## Error" in text


@pytest.mark.slow  # three processes (~80 s); a reproduction of a failing lowering is written and run below
def test_unsupported_custom_op_writes_a_runnable_reproduction(tmp_path):
    result = cli("convert", "sample_models/custom_op.py:SoftClipNet", "--out", str(tmp_path / "o"), "--repro-dir", str(tmp_path))
    assert result.returncode == 1
    script = tmp_path / "repro_samples_soft_clip_default.py"
    assert f"A standalone reproduction of this op: {script}" in result.stderr
    assert not (tmp_path / "o").exists()
    # alone, the script fails the same way ...
    alone = _python(str(script))
    assert alone.returncode != 0 and "samples.soft_clip.default" in alone.stderr
    # ... and passes once the lowering is registered
    fixed = _python("-c", f"import runpy; runpy.run_path('sample_models/custom_op_lowerings.py'); "
                          f"runpy.run_path({str(script)!r}, run_name='__main__')")
    assert fixed.returncode == 0, fixed.stderr
    assert "ok: samples.soft_clip.default converts and matches torch" in fixed.stdout


def test_failing_lowering_writes_a_reproduction_of_that_op(tmp_path):
    broken = tmp_path / "broken_lowerings.py"
    broken.write_text(BROKEN_ADDMM)
    result = cli("convert", "sample_models/mlp.py:MLP", "--out", str(tmp_path / "o"), "--lowerings", str(broken),
                 "--repro-dir", str(tmp_path), "-q")
    assert result.returncode == 1
    assert "lowering aten.addmm.default failed" in result.stderr and "deliberately broken" in result.stderr
    script = tmp_path / "repro_aten_addmm_default.py"
    source = script.read_text()
    assert "torch.ops.aten.addmm.default(t0, t1, t2)" in source
    # with the real lowering the reproduction converts and matches torch
    ran = _python(str(script))
    assert ran.returncode == 0, ran.stderr
    assert "ok: aten.addmm.default converts and matches torch" in ran.stdout
    assert Path(script).parent == tmp_path
