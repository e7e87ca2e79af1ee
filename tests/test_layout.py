"""The package layout's rules, checked on every module's imports (function-level ones included).

The torch-free folders (ir, ops, lowering, runtime, generate, serve, finetune) never import torch, not even inside a
function, and never reach into the torch side or the CLI. Within the torch-free side data flows one
way, ir <- ops <- lowering <- runtime <- generate <- serve: a folder imports only the ones before it (and
errors.py, which both halves share); finetune (LoRA, the training loss, PEFT adapters) builds on runtime, beside
generate, never on generate or serve (serve may import it: the server runs LoRA adapters beside the weights).
The torch side goes one way too: capture (generic torch.export
and capture) <- diagnose <- hf (everything that knows transformers) <- pipeline (a target to a checked
artifact); eager (the jax device, the dynamo backend) builds on capture alone. Nothing in the package
imports the CLI (cli/, installed as torch2jax.cli), which may import any of it. No module imports
another in a circle.
"""

from __future__ import annotations

import ast
import re
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
    "generate": {"ir", "ops", "lowering", "runtime", "generate"},
    "serve": {"ir", "ops", "lowering", "runtime", "generate", "finetune", "serve"},
    "finetune": {"ir", "ops", "lowering", "runtime", "finetune"},
}
TORCH_FREE_SIDE = set(TORCH_FREE)
# torch-side folder -> the torch2jax folders it may import (besides the torch-free side)
TORCH_SIDE = {
    "capture": {"capture"},
    "diagnose": {"capture", "diagnose"},
    "eager": {"capture", "eager"},
    "hf": {"capture", "diagnose", "hf"},
    "pipeline": {"capture", "diagnose", "hf", "pipeline"},
}
SHARED = {"errors"}
TOP_LEVEL = {"__init__.py", "__main__.py", "errors.py"}
CLI = PACKAGE.parent / "cli"


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
        elif parts[0] == "cli" or parts[:2] == ["torch2jax", "cli"]:
            found.append(f"{where} imports the CLI ({imported})")
        elif parts[0] == "torch2jax" and len(parts) > 1 and parts[1] not in allowed | SHARED:
            found.append(f"{where} imports {imported}: allowed here are {sorted(allowed | SHARED)}")
        if found and found[-1].startswith(where + " "):
            flagged_lines.add(line)
    return found


def torch_free_modules() -> list[Path]:
    return [path for folder in TORCH_FREE for path in sorted((PACKAGE / folder).rglob("*.py"))]


def torch_side_modules() -> list[Path]:
    return [path for folder in TORCH_SIDE for path in sorted((PACKAGE / folder).rglob("*.py"))]


def torch_side_violations(source: str, path: Path, allowed: set[str]) -> list[str]:
    """`violations` for a torch-side module: torch is fine, the package's folders as `allowed` says."""
    return [v for v in violations(source, path, allowed | TORCH_FREE_SIDE) if "this module must work without torch" not in v]


@pytest.mark.parametrize("path", torch_free_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_torch_free_module_imports_no_torch_and_only_earlier_stages(path):
    folder = path.relative_to(PACKAGE).parts[0]
    assert not violations(path.read_text(), path, TORCH_FREE[folder])


@pytest.mark.parametrize("path", torch_side_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_torch_side_module_imports_only_earlier_folders(path):
    folder = path.relative_to(PACKAGE).parts[0]
    assert not torch_side_violations(path.read_text(), path, TORCH_SIDE[folder])


def test_every_folder_has_a_rule_and_is_installed():
    """A new room needs its rule here, and every package (a room's subfolders too) its entry in pyproject.toml's
    package list: setuptools installs only the packages named there."""
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(TORCH_FREE) | set(TORCH_SIDE)
    packages = set(re.findall(r'"(torch2jax(?:\.\w+)*)"', (PACKAGE.parent / "pyproject.toml").read_text()))
    subpackages = {module_name(init) for init in PACKAGE.glob("*/**/__init__.py")}
    assert packages == {"torch2jax", "torch2jax.cli"} | subpackages


def import_graph(paths: list[Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports (function-level imports included); `from . import x` is an edge to
    the module x, not to the package."""
    modules = {module_name(path): path for path in paths}
    graph = {}
    for name, path in modules.items():
        found = set()
        for _, imported in imports(path.read_text(), name, path.name == "__init__.py"):
            if imported in modules and imported != name:
                found.add(imported)
        graph[name] = found
    for name, edges in graph.items():  # `from pkg import sub`: both pkg and pkg.sub were yielded; keep the module
        graph[name] = {e for e in edges if not any(other.startswith(e + ".") for other in edges)}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph` (strongly connected groups of more than one module), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_in_the_package():
    assert circles(import_graph(sorted(PACKAGE.rglob("*.py")))) == []


def test_the_circle_check_finds_one():
    graph = import_graph(sorted(PACKAGE.rglob("*.py")))
    graph["torch2jax.capture.converter"].add("torch2jax.hf.convert")  # capture reaching back into the hf room
    assert any({"torch2jax.capture.converter", "torch2jax.hf.convert"} <= set(group) for group in circles(graph))


@pytest.mark.parametrize(
    "folder, added, message",
    [
        ("capture", "from ..hf import convert\n", "imports torch2jax.hf"),
        ("capture", "from ..pipeline import convert_target\n", "imports torch2jax.pipeline"),
        ("diagnose", "from ..hf.verify import check_generation\n", "imports torch2jax.hf"),
        ("hf", "from ..pipeline.targets import resolve_target\n", "imports torch2jax.pipeline"),
        ("hf", "from ..eager import enable\n", "imports torch2jax.eager"),
        ("eager", "from ..hf.directory import model_dir\n", "imports torch2jax.hf"),
        ("pipeline", "from torch2jax.cli.main import main\n", "imports the CLI"),
    ],
)
def test_the_torch_side_rule_fails_when_a_folder_imports_a_later_one(folder, added, message):
    path = next((PACKAGE / folder).glob("*.py"))
    broken = path.read_text() + "\n" + added
    assert any(message in v for v in torch_side_violations(broken, path, TORCH_SIDE[folder])), added


def test_the_cli_imports_only_the_library_and_itself():
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("cli"):
                pytest.fail(f"{path.name}:{node.lineno} imports {node.module}: inside the CLI use relative imports "
                            "(it installs as torch2jax.cli)")


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
        ("import torch2jax.cli.main\n", "imports the CLI"),
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


@pytest.mark.parametrize(
    "module, added, message",
    [
        ("generate/loop.py", "from ..serve.engine import BatchEngine\n", "imports torch2jax.serve.engine"),
        ("generate/generator.py", "def f():\n    from ..serve import api\n", "imports torch2jax.serve"),
        ("runtime/artifact.py", "from ..generate.generator import Generator\n", "imports torch2jax.generate.generator"),
        ("finetune/lora.py", "from ..generate.loop import TokenLoop\n", "imports torch2jax.generate.loop"),
        ("finetune/peft_format.py", "def f():\n    import torch\n", "imports torch:"),
    ],
)
def test_the_rule_fails_when_a_torch_free_room_reaches_past_its_rule(module, added, message):
    """generate/ is below serve/ (the server calls generation, never the reverse) and above runtime/ (the artifact
    reader knows no generator class); finetune/ builds on runtime/ alone and never imports torch."""
    path = PACKAGE / module
    folder = path.relative_to(PACKAGE).parts[0]
    broken = path.read_text() + "\n" + added
    assert any(message in v for v in violations(broken, path, TORCH_FREE[folder])), added


def test_the_server_may_call_generation():
    path = PACKAGE / "serve" / "engine.py"
    assert not violations(path.read_text() + "\nfrom ..generate.loop import decode_block\n", path, TORCH_FREE["serve"])


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
