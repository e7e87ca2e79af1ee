"""`python -m torch2jax` from a checkout on PYTHONPATH, with no install mapping cli/ onto torch2jax.cli."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from ..helpers import ROOT

# The test interpreter has the package installed in editable mode: its import hook would find torch2jax.cli.
# Dropping that hook leaves exactly what a bare checkout on PYTHONPATH gives.
BARE_CHECKOUT = textwrap.dedent(f"""
    import runpy, sys
    sys.meta_path[:] = [finder for finder in sys.meta_path if "editable" not in repr(finder)]
    sys.path.insert(0, {str(ROOT)!r})
    sys.argv = ["torch2jax", *sys.argv[1:]]
    runpy.run_module("torch2jax", run_name="__main__")
""")


def run_from_checkout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BARE_CHECKOUT, *args], capture_output=True, text=True, timeout=300,
                          cwd="/")


def test_python_m_torch2jax_runs_from_a_bare_checkout():
    result = run_from_checkout("--help")
    assert result.returncode == 0, result.stderr
    for command in ("convert", "inspect", "run", "verify", "generate", "serve"):
        assert command in result.stdout


def test_the_checkout_command_line_is_the_checkout_s_cli_folder(tmp_path):
    probe = BARE_CHECKOUT.replace('runpy.run_module("torch2jax", run_name="__main__")',
                                  "import torch2jax.__main__ as entry; entry._command_line_from_checkout(); "
                                  "import torch2jax.cli.main as m; print(m.__file__)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ROOT / "cli" / "main.py")
