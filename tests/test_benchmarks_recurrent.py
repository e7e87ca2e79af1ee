"""benchmarks/recurrent.py runs end to end at its smoke setting (tiny models, 2 new tokens): a worker process per
family, the report, its section written into a docs file beside the others'. Speed is never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.recurrent import BEGIN, END

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # ~20 s: two processes import torch and jax, convert and compile
def test_the_smoke_setting_measures_writes_its_section_and_keeps_the_others(tmp_path):
    out = tmp_path / "benchmarks.md"
    out.write_text("# Benchmarks\n\n<!-- eager:begin -->\neager\n<!-- eager:end -->\n")
    done = subprocess.run([sys.executable, "-m", "benchmarks.recurrent", "--setting", "smoke", "--only", "mamba2",
                           "--rounds", "1", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert "<!-- eager:begin -->\neager\n<!-- eager:end -->" in text
    section = text[text.index(BEGIN):text.index(END)]
    rows = [line for line in section.splitlines() if line.startswith("| mamba2 |")]
    assert len(rows) == 2, section  # the speed row and the flatness row, each measured (no "failed")
    assert "failed" not in section and "ms/token" in section
