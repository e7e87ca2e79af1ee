"""A static walk of the calls one function makes inside the package: which modules a reader enters, in what order.

    python scripts/call_walk.py torch2jax.hf.convert:convert_hf [--root DIR] [--expand PREFIX ...] [--tree]

Each function of the package is expanded once, depth first, in source order; a call is resolved through the
calling module's imports (`from .x import f`, `import m` then `m.f`), its own functions, `self.method` within a
class, and a class (its `__init__`). What it prints is what docs/architecture.md's walks are checked with:
- `files`: the distinct modules entered;
- `entries`: each call from one module into another;
- `re-entries`: entries into a module the walk had already entered and left, from elsewhere (the ideal is none: a
  reader meets each room once, in pipeline order);
- `call-backs`: entries into a module that is still on the call chain (a stage reaching back into its caller's room).
`--expand torch2jax.hf` expands only the functions of modules under that prefix (a room walked on its own):
a call out of it counts as one entry into the callee's module, which is not walked further.
Dynamic dispatch (a function passed as a value, getattr) is not followed: the walk is a lower bound.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Module:
    name: str
    path: Path
    functions: dict[str, ast.AST] = field(default_factory=dict)  # qualname -> def
    imports: dict[str, str] = field(default_factory=dict)  # local name -> absolute dotted target


def module_path(root: Path, name: str) -> Path | None:
    base = root / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    if name.startswith("torch2jax.cli"):  # installed as torch2jax.cli, kept at the top as cli/
        return module_path(root, "cli" + name[len("torch2jax.cli"):])
    return None


_cache: dict[str, Module | None] = {}


def load(root: Path, name: str) -> Module | None:
    if name in _cache:
        return _cache[name]
    path = module_path(root, name)
    if path is None:
        _cache[name] = None
        return None
    tree = ast.parse(path.read_text())
    module = Module(name, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                module.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                module.imports[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            module.functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            module.functions[node.name] = node
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    module.functions[f"{node.name}.{item.name}"] = item
    _cache[name] = module
    return module


def resolve(root: Path, dotted: str) -> tuple[Module, str] | None:
    """(module, qualname) for an absolute dotted name inside the package, trying each split point."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = load(root, ".".join(parts[:cut]))
        if module is None:
            continue
        qual = ".".join(parts[cut:])
        if qual in module.functions:
            return module, qual
        if qual in module.imports and module.imports[qual] != dotted:  # re-exported
            return resolve(root, module.imports[qual])
        return None
    return None


def callees(root: Path, module: Module, qual: str) -> list[tuple[Module, str]]:
    node = module.functions[qual]
    cls = qual.split(".")[0] if "." in qual else (qual if isinstance(node, ast.ClassDef) else None)
    if isinstance(node, ast.ClassDef):
        return [(module, f"{qual}.__init__")] if f"{qual}.__init__" in module.functions else []
    found = []
    calls = sorted((n for n in ast.walk(node) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for call in calls:
        target = None
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in module.functions:
                target = (module, func.id)
            elif func.id in module.imports:
                target = resolve(root, module.imports[func.id])
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner in ("self", "cls") and cls and f"{cls}.{func.attr}" in module.functions:
                target = (module, f"{cls}.{func.attr}")
            elif owner in module.imports:
                target = resolve(root, f"{module.imports[owner]}.{func.attr}")
            elif owner in module.functions and f"{owner}.{func.attr}" in module.functions:
                target = (module, f"{owner}.{func.attr}")
        if target is not None:
            if isinstance(target[0].functions.get(target[1]), ast.ClassDef):
                init = f"{target[1]}.__init__"
                target = (target[0], init) if init in target[0].functions else None
            if target is not None and target not in found:
                found.append(target)
    return found


def walk(root: Path, start: str, show_tree: bool = False, expand: tuple[str, ...] = ("torch2jax",)) -> dict:
    name, _, qual = start.partition(":")
    module = load(root, name)
    if module is None or qual not in module.functions:
        raise SystemExit(f"{start}: no such function under {root}")
    seen: set[tuple[str, str]] = set()
    entered: dict[str, int] = {}  # module -> calls into it from another module
    stack: list[str] = [module.name]  # the modules of the call chain the walk is in
    counts = {"entries": 0, "reentries": 0, "callbacks": 0}
    lines: list[str] = []

    def visit(mod: Module, q: str, depth: int) -> None:
        seen.add((mod.name, q))
        if show_tree:
            lines.append(f"{'  ' * depth}{mod.name}.{q}")
        if depth and not mod.name.startswith(expand):
            return
        for callee, cq in callees(root, mod, q):
            if (callee.name, cq) in seen:
                continue
            moved = callee.name != mod.name
            if moved:
                counts["entries"] += 1
                if callee.name in stack:
                    counts["callbacks"] += 1  # a stage reaching back into one of its callers' modules
                elif entered.get(callee.name):
                    counts["reentries"] += 1  # a module met again after the walk had moved on from it
                entered[callee.name] = entered.get(callee.name, 0) + 1
                stack.append(callee.name)
            visit(callee, cq, depth + 1)
            if moved:
                stack.pop()

    visit(module, qual, 0)
    files = [module.name] + [m for m in entered if m != module.name]
    return {"files": files, "entered": entered, **counts, "tree": lines}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("start", nargs="+", help="module:function, e.g. torch2jax.hf.convert:convert_hf")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    parser.add_argument("--expand", nargs="+", default=["torch2jax"], help="walk into modules under these prefixes only")
    parser.add_argument("--tree", action="store_true", help="print every function the walk expands")
    args = parser.parse_args(argv)
    for start in args.start:
        result = walk(args.root.resolve(), start, args.tree, tuple(args.expand))
        print("\n".join(result["tree"]))
        multiple = {m: n for m, n in result["entered"].items() if n > 1}
        print(f"{start}: {len(result['files'])} files, {result['entries']} entries, {result['reentries']} re-entries "
              f"(a module met again), {result['callbacks']} call-backs (into a caller's module)")
        if multiple:
            print("  entered more than once: " + ", ".join(f"{m} x{n}" for m, n in sorted(multiple.items(), key=lambda i: -i[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
