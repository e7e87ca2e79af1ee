"""The package layout's rules, checked on every module's imports.

The torch-free folders (ir, ops, lowering, runtime, serve) never import torch, not even inside a
function, and never reach into the torch side (capture, diagnose) or the CLI. Within the
torch-free side data flows one way, ir <- ops <- lowering <- runtime <- serve: a folder imports only the
ones before it (and errors.py, which both halves share).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torch2jax"

# torch-free folder -> the torch2jax folders it may import
TORCH_FREE = {
    "ir": {"ir"},
    "ops": {"ir", "ops"},
    "lowering": {"ir", "ops", "lowering"},
    "runtime": {"ir", "ops", "lowering", "runtime"},
    "serve": {"ir", "ops", "lowering", "runtime", "serve"},
}
SHARED = {"errors"}
TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool, top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every import; `from a import b` yields both a and a.b (b may be a module)."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def violations(source: str, path: Path, allowed: set[str], top_level_only: bool = False) -> list[str]:
    """What in `source` (the text of `path`) breaks the rule for a module that may import `allowed` folders."""
    found, flagged_lines = [], set()
    for line, imported in imports(source, module_name(path), path.name == "__init__.py", top_level_only):
        if line in flagged_lines:
            continue  # one message per import statement
        parts = imported.split(".")
        where = f"{path.relative_to(PACKAGE.parent)}:{line}"
        if parts[0] == "torch":
            found.append(f"{where} imports {imported}: this module must work without torch")
        elif parts[0] == "cli":
            found.append(f"{where} imports the CLI ({imported})")
        elif parts[0] == "torch2jax" and len(parts) > 1 and parts[1] not in allowed | SHARED:
            found.append(f"{where} imports {imported}: allowed here are {sorted(allowed | SHARED)}")
        if found and found[-1].startswith(where + " "):
            flagged_lines.add(line)
    return found


def torch_free_modules() -> list[Path]:
    return [path for folder in TORCH_FREE for path in sorted((PACKAGE / folder).rglob("*.py"))]


@pytest.mark.parametrize("path", torch_free_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_torch_free_module_imports_no_torch_and_only_earlier_stages(path):
    folder = path.relative_to(PACKAGE).parts[0]
    assert not violations(path.read_text(), path, TORCH_FREE[folder])


def test_package_root_imports_only_the_torch_free_side_at_import_time():
    """`import torch2jax` stays torch-free; `convert` imports the torch side inside the function, when called."""
    for name in ("__init__.py", "errors.py"):
        path = PACKAGE / name
        assert not violations(path.read_text(), path, set(TORCH_FREE), top_level_only=True)


def test_no_module_left_at_the_top_level():
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_LEVEL


@pytest.mark.parametrize(
    "added, message",
    [
        ("def f():\n    import torch\n", "imports torch:"),
        ("from torch.utils import _pytree\n", "imports torch.utils"),
        ("from ..capture import exporter\n", "imports torch2jax.capture"),
        ("from .. import diagnose\n", "imports torch2jax.diagnose"),
        ("from ..diagnose.verify import check\n", "imports torch2jax.diagnose.verify"),
        ("import cli.main\n", "imports the CLI"),
    ],
)
def test_the_rule_fails_when_runtime_artifact_imports_the_torch_side(added, message):
    path = PACKAGE / "runtime" / "artifact.py"
    broken = path.read_text() + "\n" + added
    assert any(message in v for v in violations(broken, path, TORCH_FREE["runtime"])), added


def test_the_rule_fails_when_a_stage_imports_a_later_one():
    path = PACKAGE / "ir" / "graph.py"
    broken = path.read_text() + "\nfrom ..lowering import interpreter\n"
    assert violations(broken, path, TORCH_FREE["ir"]) == [
        f"torch2jax/ir/graph.py:{len(broken.splitlines())} imports torch2jax.lowering: allowed here are ['errors', 'ir']"
    ]


def test_every_torch_free_module_imports_with_torch_blocked():
    """The same rule at run time: a module importing torch through a string (importlib) is caught here."""
    names = sorted(module_name(path) for path in torch_free_modules())
    code = (
        "import importlib, sys\n"
        "sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "import torch2jax.ops as ops; ops.load_builtin_lowerings()\n"
        "print(len(ops.registered()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip()) > 400


def test_the_eager_package_imports_nothing_until_used():
    """`torch2jax.eager` (torch side) sits beside the compile backend: importing it loads no torch and no device module."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import torch2jax.eager as te\n"
        "assert not [m for m in sys.modules if m.startswith('torch2jax.eager.')], 'imported a device module'\n"
        "print(sorted(te.__all__))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "enable" in result.stdout
