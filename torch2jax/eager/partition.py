"""What JAX cannot run stays in torch: the graph is split into JAX parts and torch calls between them.

Two kinds of node stay in torch: an op with no lowering, and one whose output shape depends on tensor
values (`nonzero`, `masked_select`, `.item()` feeding a size: an unbacked symbol in torch's fake
value), which XLA cannot compile. torch's CapabilityBasedPartitioner groups the other nodes into
submodules; each becomes a `JaxGraph`, and the rest of the graph stays an FX GraphModule that torch
runs, calling the JAX parts in turn. One warning per op and source line says what runs in torch, where
it was written and why; `torch._dynamo.utils.counters` counts them per graph compiled.
"""

from __future__ import annotations

import warnings

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..capture.fx_nodes import op_name
from ..capture.fx_nodes import user_frame as _user_frame
from ..ops import lookup
from .jax_graph import JaxGraph

_WARNED: set[tuple[str, str | None]] = set()
NO_LOWERING = "torch2jax_in_torch"  # counters[NO_LOWERING][op]: ops without a lowering, run in torch
VALUE_SHAPED = "torch2jax_value_shaped"  # counters[VALUE_SHAPED][op]: output shape read from values, run in torch


def torch_only(node: torch.fx.Node) -> str | None:
    """Why `node` must run in torch (a counters key above), or None when JAX can run it."""
    if node.op != "call_function":
        return None
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    symbolic = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
    if any(isinstance(v, symbolic) and free_unbacked_symbols(v) for v in values):
        return VALUE_SHAPED  # first: with or without a lowering, XLA could not compile it
    if lookup(op_name(node.target)) is None:
        return NO_LOWERING
    return None


def torch_only_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [node for node in gm.graph.nodes if torch_only(node)]


def warn_in_torch(nodes: list[torch.fx.Node]) -> None:
    """Count every node that runs in torch; warn once per (op, user source line)."""
    from torch._dynamo.utils import counters

    for node in nodes:
        op, reason = op_name(node.target), torch_only(node)
        counters[reason][op] += 1
        source = _user_frame(node.meta.get("stack_trace"))
        if (op, source) in _WARNED:
            continue
        _WARNED.add((op, source))
        where = f"\n  at {' '.join(source.split())}" if source else ""
        if reason == NO_LOWERING:
            why = "has no JAX lowering"
            fix = "register one with @torch2jax.register_lowering to keep the whole graph in JAX"
        else:
            why = "makes a tensor whose shape depends on tensor values, which XLA cannot compile"
            fix = "a bounded form (torch.nonzero_static, torch.where with a fixed shape) keeps the graph in JAX"
        warnings.warn(f"torch2jax: {op} {why}, so torch runs it between JAX parts of the graph{where}\n  {fix}",
                      UserWarning, stacklevel=2)


class _JaxRunnable(OperatorSupportBase):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and torch_only(node) is None


class _JaxPart(torch.nn.Module):
    """A fused submodule, run as a JaxGraph; returns what the submodule returned (a value or a tuple)."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__()
        self.graph_function = JaxGraph(gm)
        output = next(node for node in gm.graph.nodes if node.op == "output")
        self.returns_tuple = isinstance(output.args[0], (tuple, list))

    def forward(self, *values):
        results = self.graph_function(values)
        return tuple(results) if self.returns_tuple else results[0]


def partitioned(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm` with every maximal group of JAX-runnable nodes replaced by a call to one JaxGraph."""
    partitioner = CapabilityBasedPartitioner(gm, _JaxRunnable(), allows_single_node_partition=True)
    fused = partitioner.partition_and_fuse()
    for name, child in list(fused.named_children()):
        if isinstance(child, torch.fx.GraphModule) and name.startswith("fused_"):
            setattr(fused, name, _JaxPart(child))
    return fused
