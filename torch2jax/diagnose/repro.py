"""Minimal standalone reproductions of a conversion that fails in one op.

When a single node stops a conversion (no lowering, or its lowering raises), `write_repro` writes
a short Python script that calls just that op, with inputs of the same shapes and dtypes and the
same non-tensor arguments, converts it with torch2jax and compares with torch. A developer can run
it, fix or register the lowering, and run it again. Nothing here imports torch: the script does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..ir import symbolic
from ..ir.graph import Graph, Node, TensorMeta

_FLOAT_KINDS = ("float", "bfloat", "half", "double", "complex")


def default_dir() -> Path:
    return Path(tempfile.gettempdir()) / "torch2jax-repro"


def failing_node(graph: Graph, ops: list[str]) -> Node | None:
    """The one node to reproduce when a failure involves exactly one op (its first use)."""
    if len(ops) != 1:
        return None
    return next((n for n in graph.all_nodes() if n.op == ops[0]), None)


def symbol_sizes(graph: Graph, shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Each symbolic dim's example size, read off the user inputs' shapes."""
    sizes: dict[str, int] = {}
    for inp, shape in zip(graph.user_inputs, shapes):
        for dim, size in zip(inp.meta.shape if inp.meta else [], shape):
            if symbolic.is_symbol(dim):
                sizes.setdefault(dim, int(size))
    return sizes


def write_repro(
    graph: Graph, node: Node, sizes: dict[str, int], reason: str, directory: Path | None = None, model_file: str | None = None
) -> Path:
    """Write a script reproducing `node` alone; `sizes` gives each symbolic dim a concrete value.

    `model_file` is run first when the op is not an ATen op (a custom op the model file defines).
    """
    directory = Path(directory) if directory is not None else default_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / _file_name(node)
    path.write_text(repro_source(graph, node, sizes, reason, model_file))
    return path


def repro_source(graph: Graph, node: Node, sizes: dict[str, int], reason: str, model_file: str | None = None) -> str:
    metas = _metas(graph)
    tensors: list[tuple[str, TensorMeta]] = []
    names: dict[str, str] = {}

    def render(value: Any) -> str:
        if isinstance(value, list):
            return "[" + ", ".join(render(v) for v in value) + "]"
        if isinstance(value, dict) and len(value) == 1:
            (key, item), = value.items()
            if key == "ref":
                meta = metas.get(item)
                if isinstance(meta, dict) and "sym" in meta:  # a symbolic int: its example value
                    return str(_concrete(meta["sym"], sizes))
                if item not in names:
                    names[item] = f"t{len(tensors)}"
                    tensors.append((names[item], meta if isinstance(meta, TensorMeta) else TensorMeta("float32", [])))
                return names[item]
            if key == "dtype":
                return f"torch.{item}"
            if key == "float":
                return f"float({item!r})"
            if key == "device":
                return f"torch.device({item!r})"
            if key in ("layout", "memory_format"):
                return f"torch.{item}"
        return repr(value)

    call_args = [render(a) for a in node.args] + [f"{k}={render(v)}" for k, v in node.kwargs.items()]
    namespace, name, overload = (node.op.split(".") + ["default"])[:3]
    make_inputs = [_input_source(tensor, meta, sizes) for tensor, meta in tensors]
    where = f"\nIn the model: {node.source.strip().splitlines()[-1].strip()}" if node.source else ""
    first_line = reason.strip().splitlines()[0] if reason.strip() else "conversion failed"
    setup = ""
    if namespace != "aten" and model_file:
        setup = (
            f"import runpy\n\n# the model file defines {namespace}::{name}: run it so that torch knows the op\n"
            f"runpy.run_path({model_file!r})\n"
        )
    return f'''"""torch2jax reproduction: {node.op} (node {node.name}).

{first_line}{where}
Input values are random; shapes, dtypes and the other arguments are the model's.
Run: python {_file_name(node)}
"""

import torch

import torch2jax
from torch2jax.diagnose.verify import check, verify
{setup}

class Repro(torch.nn.Module):
    def forward(self{"".join(", " + t for t, _ in tensors)}):
        return torch.ops.{namespace}.{name}.{overload}({", ".join(call_args)})


def inputs():
    g = torch.Generator().manual_seed(0)
    return ({"".join(i + ", " for i in make_inputs)})


if __name__ == "__main__":
    module, args = Repro().eval(), inputs()
    model = torch2jax.convert(module, args)
    report = verify(module, model, args, {{}})
    print(report.summary())
    check(report)
    print("ok: {node.op} converts and matches torch")
'''


def _file_name(node: Node) -> str:
    return f"repro_{node.op.replace('.', '_').replace(':', '_')}.py"


def _input_source(name: str, meta: TensorMeta, sizes: dict[str, int]) -> str:
    shape = [_concrete(d, sizes) for d in meta.shape]
    dtype = f"torch.{meta.dtype}"
    if meta.dtype == "bool":
        return f"torch.randint(0, 2, {shape}, generator=g).bool()"
    if meta.dtype.startswith(_FLOAT_KINDS):
        return f"torch.randn({shape}, generator=g).to({dtype})"
    return f"torch.randint(0, 4, {shape}, generator=g).to({dtype})"  # small: index-like values stay in range


def _concrete(dim: int | str, sizes: dict[str, int]) -> int:
    if isinstance(dim, int):
        return dim
    try:
        return int(symbolic.evaluate(dim, sizes))
    except Exception:  # an unknown symbol: any small size will do for a reproduction
        return 2


def _metas(graph: Graph) -> dict[str, Any]:
    metas: dict[str, Any] = {i.name: i.meta for i in graph.inputs}
    for node in graph.all_nodes():
        metas[node.name] = node.meta
    return metas

