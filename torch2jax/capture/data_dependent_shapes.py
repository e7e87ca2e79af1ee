"""Output sizes read from tensor values (a count of selected rows, an `.item()`): bounded, taken from the example,
or refused, before the FX graph is translated (fx.capture).

XLA compiles static or symbolic shapes only. `x[mask]` read only as masked_scatter's source is bounded by the mask's
size (MASKED_ROWS: a multimodal model's image features placed at their tokens); `x[mask]` whose count torch proved
static takes it from the shape (SELECTED_ROWS). Other sizes are taken from the example inputs where their defining
op can be checked at run time (example_path.py), recorded in `Graph.example_values` with the model's code, file and
line; whatever is left is refused, naming each op, its line and how to bound it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from ..errors import UnsupportedOpsError
from ..ir.graph import Graph, TensorMeta
from . import example_path
from .fx_nodes import op_name, user_frame


@dataclass
class Bounds:
    """What `bound` found in the FX graph, for `mark` to write on the portable graph."""

    masked_rows: dict[str, int]  # x[mask] nodes read only as masked_scatter's source -> the mask's size
    selected_rows: set[str]  # x[mask] nodes whose count is static or taken from the example
    taken: dict[str, dict[str, Any]]  # the values taken from the example inputs (example_path.checkable)
    from_example: bool  # whether the graph records the example's values (taken, or the export followed the example)


def bound(graph_module: torch.fx.GraphModule, example: Callable[[], dict[str, dict[str, Any]]] | None,
          followed_example: bool) -> Bounds:
    """The bounds of `graph_module`'s data-dependent sizes; raises UnsupportedOpsError naming those with none.
    `example()` gives the values torch left free on the example inputs; they are taken when the graph would otherwise
    be refused or when the export followed the example (`followed_example`)."""
    compacted = _masked_rows_into_scatter(graph_module)
    pending = _data_dependent_shapes(graph_module, allowed=set(compacted))
    taken: dict[str, dict[str, Any]] = {}
    if example is not None and (pending or followed_example):
        taken = example_path.checkable(graph_module, example(), excluded=set(compacted))
        pending = [(op, node, symbols) for op, node, symbols in pending if symbols is None or not symbols <= set(taken)]
    _refuse_data_dependent_shapes(pending)
    selected = _masked_rows_of_static_count(graph_module, set(taken))
    return Bounds(compacted, selected, taken, example is not None and bool(taken or followed_example))


def mark(graph: Graph, graph_module: torch.fx.GraphModule, bounds: Bounds) -> None:
    """Write `bounds` on `graph` (the portable graph of `graph_module`): the example's values with the model's code,
    file and line, MASKED_ROWS with the mask's row count, SELECTED_ROWS."""
    if bounds.from_example:
        sources = {node.name: node.source for node in graph.nodes if node.source}
        entries = {**bounds.taken, **example_path.conditions_left_free(graph_module, set(bounds.taken))}
        graph.example_values = {key: {**info, **example_path.where(sources.get(info["node"]))}  # code, file, line
                                for key, info in entries.items()}
    for node in graph.nodes:
        if node.name in bounds.masked_rows:
            node.op = MASKED_ROWS
            node.meta = TensorMeta(node.meta.dtype, [bounds.masked_rows[node.name], *node.meta.shape[1:]])
        if node.name in bounds.selected_rows:
            node.op = SELECTED_ROWS


# how to bound the ops whose output shape depends on the input values (XLA compiles static or symbolic shapes)
DATA_DEPENDENT_SHAPES: dict[str, str] = {
    "aten.nonzero.default": "use torch.nonzero_static(x, size=N, fill_value=-1) with a declared upper bound N "
                            "(lowered); for x[mask] reductions use torch.where(mask, x, 0) instead",
    "aten._unique2.default": "torch.unique has no bounded form in torch; compute on a fixed-size result "
                             "(e.g. sort + torch.where) or give the op a lowering with a static size",
    "aten.unique_dim.default": "as torch.unique: no bounded form; restructure with a fixed-size result",
    "aten.unique_consecutive.default": "as torch.unique: no bounded form; restructure with a fixed-size result",
    "aten.repeat_interleave.Tensor": "pass output_size=N (torch.repeat_interleave(x, repeats, dim, output_size=N)): the size "
                                     "is then static and the op converts",
    "aten.masked_select.default": "use torch.where(mask, x, fill) to keep the shape static",
    "aten.bincount.default": "its length is max(x) + 1: use torch.zeros(N).index_add_(0, x, weights) with a "
                             "declared length N",
}


# x[mask] feeding only masked_scatter as its source (a multimodal model's image or audio features placed at their
# tokens): lowered to the selected rows first, padded to the mask's size, which masked_scatter reads in order
MASKED_ROWS = "torch2jax.masked_rows.default"
_ASSERTS = {torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_tensor_metadata.default}


def _masked_rows_into_scatter(graph_module: torch.fx.GraphModule) -> dict[str, int]:
    """The `x[mask]` nodes (a bool mask over x's leading dims, its size static) whose result is read only as the
    source of masked_scatter, by runtime checks, or by sym_size for runtime checks: {node name: the mask's size}.

    The row count is data-dependent, but masked_scatter consumes the source's elements in order and only as many as
    its own mask selects, so the selected rows padded to the mask's size give the same result, at a static shape."""
    found = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.index.Tensor:
            continue
        indices = node.args[1]
        if len(indices) != 1 or not isinstance(indices[0], torch.fx.Node):
            continue
        mask = indices[0].meta.get("val")
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or not all(isinstance(d, int) for d in mask.shape):
            continue
        if all(_reads_as_scatter_source(user, node) for user in node.users):
            found[node.name] = math.prod(mask.shape)
    return found


# x[mask] whose row count torch proved static (the model checked it against another tensor's size)
SELECTED_ROWS = "torch2jax.selected_rows.default"


def _masked_rows_of_static_count(graph_module: torch.fx.GraphModule, taken: set[str] = frozenset()) -> set[str]:
    """The `x[mask]` nodes (one bool mask over x's leading dims) whose output shape is static, or whose count was taken
    from the example: JAX cannot size a boolean selection from the values, so these take the count from the shape
    (ops/indexing.selected_rows, which checks a count taken from the example)."""
    return {node.name for node in graph_module.graph.nodes if example_path.is_mask_selection(node)
            and all(_known_size(d, taken) for d in (*node.args[1][0].meta["val"].shape, *node.meta["val"].shape))}


def _known_size(size: Any, taken: set[str] = frozenset()) -> bool:
    """An int, a symbol torch has since proved equal to one (a count checked against a static size), or one taken from
    the example (example_path.py)."""
    if isinstance(size, int):
        return True
    node = getattr(size, "node", None)
    if node is None:
        return False
    expr = node.shape_env.replace(node.expr)
    return expr.is_number or {str(s) for s in expr.free_symbols} <= taken


def _reads_as_scatter_source(user: torch.fx.Node, rows: torch.fx.Node) -> bool:
    if user.target is torch.ops.aten.masked_scatter.default:
        return user.args[2] is rows and rows not in user.args[:2]
    if user.target in _ASSERTS:
        return True
    if user.target is torch.ops.aten.sym_size.int:  # the row count, compared in runtime checks only
        return all(all(check.target in _ASSERTS for check in compare.users) for compare in user.users)
    return False


def _data_dependent_shapes(graph_module: torch.fx.GraphModule, allowed: set[str] = frozenset(),
                           ) -> list[tuple[str, torch.fx.Node, set[str] | None]]:
    """(op, node, its unbacked symbols) for every node whose output size torch could only express with an unbacked
    symbol (a size read from tensor values); the symbols are None inside a control-flow body, where no value taken from
    the example reaches. `allowed` nodes are given a bound by the converter."""
    found = []
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op != "call_function" or (node.name in allowed and module is graph_module):
                continue
            symbols = _unbacked_of(node)
            if symbols:
                found.append((op_name(node.target), node, symbols if module is graph_module else None))
    return found


def _unbacked_of(node: torch.fx.Node) -> set[str]:
    """The unbacked symbols (sizes read from tensor values) in a node's output shapes."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    values = node.meta.get("val")
    values = values if isinstance(values, (list, tuple)) else [values]
    return {str(s) for v in values if isinstance(v, torch.Tensor) for s in free_unbacked_symbols(v.shape)}


def _refuse_data_dependent_shapes(found: list[tuple[str, torch.fx.Node, set[str] | None]]) -> None:
    """XLA compiles static (or symbolic) shapes only: name every op whose output size depends on tensor values and
    that no bound or example value covers, and how to bound it."""
    if not found:
        return
    first: dict[str, Any] = {}
    for op, node, _symbols in found:
        first.setdefault(op, node)
    generic = ("a size or bound read from tensor values (.item(), .tolist(), a tensor of split points): pass it as "
               "a Python int, or keep the shape fixed and mask with torch.where")
    lines = [f"{len(first)} op(s) in this model make tensors whose shape depends on the input values:"]
    for op, node in first.items():
        lines.append(f"  - {op} (node {node.name})")
        lines.append(f"      its output shape depends on the input values, which XLA cannot compile: "
                     f"{DATA_DEPENDENT_SHAPES.get(op, generic)}")
        source = user_frame(node.meta.get("stack_trace"))
        if source:
            lines.append("      at " + "\n         ".join(source.strip().splitlines()))
    raise UnsupportedOpsError("\n".join(lines), list(first))
