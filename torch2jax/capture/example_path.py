"""Models whose shapes or branches depend on tensor values: converted along the example inputs' path, checked at run time.

torch.export stops where model code reads a tensor's value to decide a shape or a branch (`if mask.any():`, `x[mask]`,
an interpolation size summed from a pixel mask). XLA compiles static shapes only, so such a value cannot stay free in
the artifact. What a converter can do without changing the model's code:

- `following_example()`: export with torch's real-tensor propagation, so that a data-dependent guard takes the branch
  the example inputs take (torch records the guard as a runtime assertion in the graph);
- `example_values()`: run the captured graph once on the example inputs and read each value torch left free (an
  unbacked symbol: a count of selected rows, a `.item()`); the graph is then compiled with those values;
- at run time the artifact computes each of those values again and returns whether it is the example's (the
  interpreter's checks); a call whose inputs give another value is refused with an error naming the model's file,
  line and code (`where()`, recorded at conversion), rather than answering along a path the inputs do not take
  (runtime/model.py). A branch written with `torch.cond` instead converts both sides, and needs none of this.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ..errors import ExamplePathError
from .fake_params import is_fake


@contextlib.contextmanager
def following_example() -> Iterator[None]:
    """torch.export takes the example inputs' side of each data-dependent guard, and records it as a runtime assertion."""
    from torch._functorch import config  # not loaded by `import torch` alone

    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")  # logs each guard taken, as a warning
    level = shapes_log.level
    shapes_log.setLevel(logging.ERROR)
    try:
        with config.patch(fake_tensor_propagate_real_tensors=True):
            yield
    finally:
        shapes_log.setLevel(level)


def example_values(ep: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> dict[str, dict[str, Any]]:
    """{unbacked symbol: {"value": its value on the example inputs, "node": the node that defines it}} for the integer
    and boolean values torch could not know while tracing (float `.item()`s are left out: no shape depends on them).
    Empty when the graph has none (no graph run then)."""
    defining = {node.name: node.meta["unbacked_bindings"] for node in ep.graph.nodes
                if node.op == "call_function" and node.meta.get("unbacked_bindings")}
    if not defining or any(is_fake(t) or t.device.type == "meta" for t in (*ep.state_dict.values(), *ep.constants.values())
                           if isinstance(t, torch.Tensor)):
        return {}  # nothing to read, or no weights to run the graph with (streamed from a checkpoint when saved)
    found: dict[str, dict[str, Any]] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> Any:
            result = super().run_node(node)
            for symbol, path in defining.get(node.name, {}).items():
                value = pytree.key_get(result, path)
                if isinstance(value, (bool, int, torch.SymInt, torch.SymBool)) or (
                        isinstance(value, torch.Tensor) and not value.is_floating_point()):
                    found[str(symbol)] = {"value": int(value), "node": node.name}
            return result

    flat = ep._graph_module_flat_inputs(args, kwargs)
    with torch.no_grad():
        Recorder(ep.graph_module).run(*flat)
    return found


def checkable(graph_module: torch.fx.GraphModule, values: dict[str, dict[str, Any]], excluded: set[str] = frozenset(),
              ) -> dict[str, dict[str, Any]]:
    """The example values whose defining op a lowering checks at run time (interpreter.CHECKS_EXAMPLE_VALUES: a read
    with `.item()`, a count of selected or distinct elements, ...); `excluded` nodes are bounded otherwise."""
    from ..lowering.interpreter import CHECKS_EXAMPLE_VALUES

    checked = {node.name for node in graph_module.graph.nodes if node.op == "call_function" and (
        is_mask_selection(node)  # an aten op's registry key is its overload's name
        or (isinstance(node.target, torch._ops.OpOverload) and str(node.target) in CHECKS_EXAMPLE_VALUES))}
    return {symbol: info for symbol, info in values.items() if info["node"] in checked and info["node"] not in excluded}


def is_mask_selection(node: torch.fx.Node) -> bool:
    """`x[mask]`: aten.index with one bool mask over x's leading dims (lowered as torch2jax.selected_rows)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.index.Tensor:
        return False
    indices, value = node.args[1], node.meta.get("val")
    if len(indices) != 1 or not isinstance(indices[0], torch.fx.Node) or not isinstance(value, torch.Tensor):
        return False
    mask = indices[0].meta.get("val")
    return isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.ndim >= 1


def conditions_left_free(graph_module: torch.fx.GraphModule, taken: set[str]) -> dict[str, dict[str, Any]]:
    """torch's runtime assertions on values no example value fixes (a branch the example took on a float read with
    `.item()`): {assertion node: {"condition": text, "node": it}}, checked on every call."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    # values read with .item() are the real values at run time; a selection's count may be padded (MASKED_ROWS), so
    # an assertion on it would not hold there
    read = {str(symbol) for node in graph_module.graph.nodes if node.target is torch.ops.aten._local_scalar_dense.default
            for symbol in (node.meta.get("unbacked_bindings") or {})}
    found = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten._assert_scalar.default:
            continue
        condition = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        symbols = {str(s) for s in free_unbacked_symbols(condition)} if condition is not None else set()
        if symbols - taken and symbols <= taken | read:
            found.setdefault(str(condition.node.expr), {"condition": str(condition.node.expr), "node": node.name})
    return {info["node"]: info for info in found.values()}  # torch may assert one condition twice


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def where(source: str | None) -> dict[str, Any]:
    """{"at": the code line, "file": its file, "line": its number} from a node's source (the user's frame of torch's
    stack trace: `File "f.py", line 7, in forward` then the code), as far as it has them: an error that names the
    file and line lets the user find the branch, where the code line alone may occur many times."""
    if not source:
        return {"at": None}
    lines = [line.strip() for line in source.strip().splitlines() if line.strip()]
    frame = _FRAME.search(lines[0])
    if frame is None:
        return {"at": lines[-1]}
    code = lines[-1] if len(lines) > 1 else None  # no code line when the file cannot be read (exec'd source)
    return {"at": code, "file": frame["file"], "line": int(frame["line"])}


def describe(values: dict[str, dict[str, Any]]) -> str:
    """What a user is told when a conversion follows the example: the values taken from it, by the model's line."""
    by_line: dict[str, list] = {}
    for info in values.values():
        taken = info["value"] if "value" in info else f"`{info['condition']}`"
        by_line.setdefault(ExamplePathError.place(info) or f"node {info['node']}", []).append(taken)
    lines = [f"the model reads {len(values)} value(s) from its tensors to decide shapes or branches; the conversion "
             "takes each as the example inputs give it, and the converted model refuses inputs that give another:"]
    for where, taken in by_line.items():
        shown = ", ".join(str(v) for v in taken[:6]) + (f", ... ({len(taken)} values)" if len(taken) > 6 else "")
        lines.append(f"  - {shown} at {where}")
    return "\n".join(lines)
