"""The real `torch2jax` console script, run in a subprocess as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torch2jax.cli.main import main

from ..helpers import ROOT, cli


@pytest.fixture(scope="module")
def cnn_artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "cnn"
    result = cli("convert", "sample_models/cnn.py:make_model", "--out", str(out))
    assert result.returncode == 0, result.stderr
    for stage in ("[export]", "[decompose]", "[lower]", "[weights]", "[jax.export]", "[save]", "[verify]"):
        assert stage in result.stderr
    assert "second size (batch=3)" in result.stdout
    return out


def test_convert_inspect_run_verify(cnn_artifact, tmp_path):
    inspected = cli("inspect", str(cnn_artifact))
    assert inspected.returncode == 0 and "images: float32[batch, 3, 32, 32]" in inspected.stdout
    assert "features.1.running_mean" in inspected.stdout

    sys.path.insert(0, str(ROOT / "sample_models"))
    from cnn import make_model

    x = np.random.default_rng(0).standard_normal((5, 3, 32, 32)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    ran = cli("run", str(cnn_artifact), "--input", f"images={tmp_path / 'x.npy'}", "--out", str(tmp_path / "y.npz"))
    assert ran.returncode == 0, ran.stderr
    with torch.no_grad():
        want = make_model().eval()(torch.from_numpy(x)).numpy()
    got = np.load(tmp_path / "y.npz")["output"]
    assert np.abs(got - want).max() < 1e-4

    verified = cli("verify", str(cnn_artifact), "sample_models/cnn.py:make_model")
    assert verified.returncode == 0, verified.stderr
    assert "ok: max abs error" in verified.stdout


def test_convert_with_input_specs_and_weights(tmp_path):
    from torch2jax.capture.target import load_weights  # noqa: F401  (the CLI path under test)

    sys.path.insert(0, str(ROOT / "sample_models"))
    from mlp import MLP

    trained = MLP()
    torch.save(trained.state_dict(), tmp_path / "w.pt")
    out = tmp_path / "mlp"
    result = cli("convert", "sample_models/mlp.py:MLP", "--input", "x=float32[batch=3,16]", "--weights", str(tmp_path / "w.pt"),
                 "--out", str(out), "--platforms", "cpu")
    assert result.returncode == 0, result.stderr
    import torch2jax

    model = torch2jax.load(out)
    assert model.manifest["platforms"] == ["cpu"]
    x = torch.randn(6, 16)
    with torch.no_grad():
        want = trained(x).numpy()
    assert np.abs(np.asarray(model(x.numpy())) - want).max() < 1e-5


def test_existing_output_directory_is_refused(cnn_artifact):
    result = cli("convert", "sample_models/cnn.py:make_model", "--out", str(cnn_artifact))
    assert result.returncode == 2
    assert "already exists" in result.stderr and "--force" in result.stderr


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(source)
    return path


def test_error_cases_give_one_paragraph_and_nonzero_exit(tmp_path):
    cases = []
    cases.append((["convert", str(tmp_path / "missing.py") + ":M"], 1, "does not exist"))
    broken = _write(tmp_path, "broken.py", "import torch\nraise RuntimeError('user bug here')\n")
    cases.append((["convert", f"{broken}:M"], 1, "user bug here"))
    needs_args = _write(
        tmp_path, "needs_args.py",
        "import torch\nclass M(torch.nn.Module):\n    def __init__(self, width):\n        super().__init__()\n"
        "    def forward(self, x):\n        return x\n",
    )
    cases.append((["convert", f"{needs_args}:M"], 1, "needs constructor arguments (width)"))
    ok_model = _write(
        tmp_path, "ok_model.py",
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n",
    )
    cases.append((["convert", f"{ok_model}:M", "--input", "x=float32[2,,3]"], 2, "bad dim"))
    cases.append((["convert", f"{ok_model}:M"], 2, "no example inputs"))
    branchy = _write(
        tmp_path, "branchy.py",
        "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.from_numpy(x.numpy() + 1 if x.sum() > 0 else x.numpy() - 1)\n",
    )  # a branch on a value, then NumPy: not even the example's path can be traced
    cases.append((["convert", f"{branchy}:M", "--input", "x=float32[3]"], 1, "torch.cond"))
    fixed = _write(
        tmp_path, "fixed.py", "import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x.reshape(4, -1)\n"
    )
    cases.append((["convert", f"{fixed}:M", "--input", "x=float32[batch=4,3]"], 1, "Check the dynamic dims you declared"))
    custom = _write(
        tmp_path, "custom.py",
        "import torch\n@torch.library.custom_op('t2jcli::odd', mutates_args=())\ndef odd(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x.clone()\n@odd.register_fake\ndef _(x):\n    return torch.empty_like(x)\n"
        "@torch.library.custom_op('t2jcli::even', mutates_args=())\ndef even(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x.clone()\n@even.register_fake\ndef _(x):\n    return torch.empty_like(x)\n"
        "class M(torch.nn.Module):\n    def forward(self, x):\n        return torch.ops.t2jcli.even(torch.ops.t2jcli.odd(x))\n",
    )
    cases.append((["convert", f"{custom}:M", "--input", "x=float32[3]"], 1, "t2jcli.even.default"))
    # The first case through the installed console script; the others in-process (CliRunner), which runs
    # the same click command without paying a torch + jax import per case.
    first = cli(*cases[0][0], "--out", str(tmp_path / "never"))
    assert (first.returncode, cases[0][2] in first.stderr) == (cases[0][1], True), first.stderr
    for args, code, text in cases[1:]:
        result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "never")])
        assert isinstance(result.exception, SystemExit), (args, result.exception)
        assert result.exit_code == code, (args, result.exit_code, result.stderr)
        assert text in result.stderr, (args, result.stderr)
        assert "Traceback (most recent call last)" not in result.stderr.split("importing")[0], result.stderr
        assert not (tmp_path / "never").exists()


def test_custom_ops_listed_together_with_source(tmp_path):
    custom = _write(
        tmp_path, "custom2.py",
        "import torch\n@torch.library.custom_op('t2jcli2::odd', mutates_args=())\ndef odd(x: torch.Tensor) -> torch.Tensor:\n"
        "    return x.clone()\n@odd.register_fake\ndef _(x):\n    return torch.empty_like(x)\n"
        "class M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return torch.ops.t2jcli2.odd(x).sin().cos() + torch.ops.t2jcli2.odd(x)\n",
    )
    result = cli("convert", f"{custom}:M", "--input", "x=float32[3]", "--out", str(tmp_path / "o"))
    assert result.returncode == 1
    assert "t2jcli2.odd.default" in result.stderr and "custom2.py" in result.stderr
    assert "register_lowering" in result.stderr


def test_run_rejects_bad_inputs(cnn_artifact, tmp_path):
    np.save(tmp_path / "bad.npy", np.zeros((2, 3, 31, 32), np.float32))
    result = cli("run", str(cnn_artifact), "--input", f"images={tmp_path / 'bad.npy'}", "--out", str(tmp_path / "y.npz"))
    assert result.returncode == 2 and "axis 2 must be 32" in result.stderr
    result = cli("run", str(cnn_artifact), "--input", f"other={tmp_path / 'bad.npy'}", "--out", str(tmp_path / "y.npz"))
    assert result.returncode == 2 and "missing ['images']" in result.stderr
    result = cli("inspect", str(tmp_path))
    assert result.returncode == 1 and "no manifest.json" in result.stderr


def test_help_shows_examples():
    result = cli("convert", "--help")
    assert result.returncode == 0 and "torch2jax convert sample_models/tiny_gpt.py:TinyGPT" in result.stdout


def test_custom_op_sample_converts_with_lowerings_file(tmp_path):
    out = tmp_path / "softclip"
    plain = cli("convert", "sample_models/custom_op.py:SoftClipNet", "--out", str(out))
    assert plain.returncode == 1 and "samples.soft_clip.default" in plain.stderr
    assert "@torch2jax.register_lowering('samples::soft_clip')" in plain.stderr
    result = cli("convert", "sample_models/custom_op.py:SoftClipNet", "--lowerings", "sample_models/custom_op_lowerings.py",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "ok  second size" in result.stdout


def test_python_dash_m_torch2jax_is_the_cli():
    result = subprocess.run([sys.executable, "-m", "torch2jax", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Usage: torch2jax ")
    for command in ("convert", "inspect", "run", "verify", "bisect"):
        assert f"\n  {command} " in result.stdout
