"""A subcommand run where a package of the extra it needs is not installed says which extra to install, in one
paragraph with a non-zero exit, never a ModuleNotFoundError traceback. The packages are made missing as
scripts/without_torch.py makes torch missing: a meta-path finder that refuses them, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ..helpers import ROOT

CLI_WITHOUT = """
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing())
sys.argv = ["torch2jax", *{args!r}]
from torch2jax.cli.main import main
main()
"""


def cli_without(missing: set[str], *args: str) -> subprocess.CompletedProcess:
    """The command line run where importing any of `missing` fails as it does for a package not installed."""
    code = CLI_WITHOUT.format(missing=sorted(missing), args=list(args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


@pytest.mark.parametrize(
    "missing, args, extra",
    [
        ({"uvicorn"}, ("serve", "out/llm"), "serve"),
        ({"pydantic", "starlette"}, ("serve", "out/llm", "--port", "8001"), "serve"),
        ({"tokenizers"}, ("generate", "out/llm", "--prompt", "Hello"), "text"),
        ({"PIL"}, ("generate", "out/vlm", "--image", __file__, "--prompt", "What is in it?"), "vision"),
        ({"torch"}, ("convert", "sample_models/mlp.py:MLP", "--out", "out/never-written"), "convert"),
    ],
)
def test_a_missing_extra_is_named_in_one_paragraph(missing, args, extra):
    result = cli_without(missing, *args)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f"pip install 'torch2jax-aot[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert any(name in result.stderr for name in missing)
