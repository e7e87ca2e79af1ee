"""The documentation's code runs: every ```python block of a page, in order, in one fresh process."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from .helpers import ROOT

PAGES = ["docs/finetune.md"]


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


# the fine-tuning page trains, saves and reloads for ~45 s: with the slow tests (make test-slow); tests/finetune checks each
# of its calls on its own in the default run
@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_page_code_runs(page, tmp_path):
    blocks = python_blocks((ROOT / page).read_text())
    assert blocks, f"{page} has no python code"
    script = tmp_path / "page.py"
    script.write_text("\n\n".join(blocks))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
