"""Find the first node where the JAX translation departs from torch (convert half).

Both sides run the same decomposed graph on the same inputs: torch node by node with an FX
interpreter, JAX through torch2jax's interpreter. Node names are shared, so the first node whose
output differs beyond tolerance is the culprit: its op, shapes, error and the user's source line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx
import torch.utils._pytree as pytree

from ..capture.converter import StageTimer, trace
from ..capture.torch_arrays import to_jax, to_numpy
from ..ir.graph import Node, TensorMeta
from ..lowering import interpreter
from .verify import TOLERANCES


@dataclass
class Divergence:
    node: str
    op: str
    dtype: str
    shape: list
    max_abs: float
    inputs: list[str]
    source: str | None
    checked: int
    ties: bool = False  # an order among equal values, which torch leaves unspecified (ORDER_OPS)

    def __str__(self) -> str:
        where = f"\n  at {self.source}" if self.source else ""
        ties = ("\n  its input holds equal values where the order is decided: torch leaves the order of ties "
                "unspecified (its kernels pick one by algorithm), so JAX picks another without either being wrong; "
                "with trained weights ties are rare") if self.ties else ""
        return (
            f"first divergent node: {self.node} = {self.op}({', '.join(self.inputs)}) -> {self.dtype}{self.shape}, "
            f"max abs error {self.max_abs:.3g} (after {self.checked} matching nodes){where}{ties}"
        )


def bisect(module: torch.nn.Module, args: tuple, kwargs: dict | None = None) -> tuple[Divergence | None, int]:
    """(the first divergent node or None, how many nodes were compared)."""
    kwargs = kwargs or {}
    captured, ep = trace(module, tuple(args), kwargs, None, StageTimer())  # as convert captures it
    graph = captured.graph
    placeholders = _placeholder_values(ep, args, kwargs)

    expected = _torch_node_outputs(ep.graph_module, placeholders)
    jax_values: dict[str, Any] = {}
    run = interpreter.build(graph, observe=lambda node, value: jax_values.__setitem__(node.name, value))
    params = {name: to_jax(t) for name, t in captured.tensors.items()}
    user = [to_jax(v) if isinstance(v, torch.Tensor) else v for v in pytree.tree_flatten((tuple(args), kwargs))[0]]
    run(params, user, None)

    checked = 0
    for node in graph.nodes:
        if node.name not in expected or node.name not in jax_values:
            continue
        error = _node_error(node, expected[node.name], jax_values[node.name])
        if error is None:
            continue
        checked += 1
        if error > 0:
            meta = node.meta if isinstance(node.meta, TensorMeta) else None
            return Divergence(
                node.name, node.op, meta.dtype if meta else "?", meta.shape if meta else [], error,
                [_describe_arg(a, expected) for a in node.args], node.source, checked - 1,
                ties=_order_of_ties(node, {n.name: n for n in graph.nodes}, expected),
            ), checked
    return None, checked


# ops whose indices are an order that torch leaves unspecified among equal values (a stable sort's is specified)
ORDER_OPS = {"aten.topk.default", "aten.sort.default"}


def _order_of_ties(node: Node, nodes: dict[str, Node], expected: dict[str, Any]) -> bool:
    """Whether `node` (or the tuple it takes an item of) orders values of which torch's input holds equal ones
    among those that decide the result: for top-k the first k + 1, for a sort the whole dim."""
    if node.op == "operator.getitem" and isinstance(node.args[0], dict) and node.args[0].get("ref") in nodes:
        node = nodes[node.args[0]["ref"]]
    if node.op not in ORDER_OPS or not node.args or not isinstance(node.args[0], dict):
        return False
    values = expected.get(node.args[0].get("ref"))
    if not isinstance(values, torch.Tensor) or values.dim() == 0:
        return False
    args = [*node.args, *[None] * 4]
    if node.op == "aten.topk.default":
        k, dim, largest = args[1], node.kwargs.get("dim", args[2]), node.kwargs.get("largest", args[3])
    else:
        k, dim, largest = None, node.kwargs.get("dim", args[1]), node.kwargs.get("descending", args[2])
    dim = -1 if dim is None else dim
    largest = True if largest is None else bool(largest)
    ordered = values.detach().float().sort(dim=dim, descending=largest).values
    deciding = ordered.narrow(dim, 0, min(k + 1, ordered.shape[dim])) if isinstance(k, int) else ordered
    if deciding.shape[dim] < 2:
        return False
    return bool((deciding.narrow(dim, 1, deciding.shape[dim] - 1) == deciding.narrow(dim, 0, deciding.shape[dim] - 1)).any())


def _placeholder_values(ep, args: tuple, kwargs: dict) -> list:
    user = iter(pytree.tree_flatten((tuple(args), kwargs))[0])
    values = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind.name == "USER_INPUT":
            values.append(next(user))
        elif spec.target in ep.state_dict:
            values.append(ep.state_dict[spec.target])
        else:
            values.append(ep.constants.get(spec.target))
    return values


def _torch_node_outputs(gm: torch.fx.GraphModule, placeholders: list) -> dict[str, Any]:
    outputs: dict[str, Any] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            outputs[n.name] = result
            return result

    with torch.no_grad():
        Recorder(gm).run(*placeholders)
    return outputs


def _node_error(node: Node, want: Any, got: Any) -> float | None:
    """None when not comparable; 0 when within tolerance; else the max abs error."""
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        errors = [_node_error(node, w, g) for w, g in zip(want, got)]
        errors = [e for e in errors if e is not None]
        return max(errors) if errors else None
    if not isinstance(want, torch.Tensor) or not hasattr(got, "shape"):
        return None
    w = to_numpy(want).astype(np.float64) if want.dtype != torch.bool else to_numpy(want).astype(np.float64)
    g = np.asarray(got).astype(np.float64)
    if w.shape != g.shape:
        return float("inf")
    if w.size == 0:
        return 0.0
    rtol, atol = TOLERANCES.get(str(want.dtype).removeprefix("torch."), (0.0, 0.0))
    same_nan = np.array_equal(np.isnan(w), np.isnan(g))
    finite = np.isfinite(w) & np.isfinite(g)
    diff = np.abs(w - g)[finite]
    ok = same_nan and np.array_equal(np.isinf(w), np.isinf(g)) and bool((diff <= atol + rtol * np.abs(w[finite])).all())
    return 0.0 if ok else float(diff.max() if diff.size else np.inf)


def _describe_arg(arg: Any, values: dict) -> str:
    if isinstance(arg, dict) and "ref" in arg:
        value = values.get(arg["ref"])
        if isinstance(value, torch.Tensor):
            return f"{arg['ref']}: {str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
        return arg["ref"]
    return repr(arg)
