"""Ops without a lowering run in torch: the graph is split into JAX parts and torch calls between them.

torch's CapabilityBasedPartitioner groups the nodes whose ops have a lowering into submodules; each
becomes a `JaxGraph`, and the rest of the graph stays an FX GraphModule that torch runs, calling the
JAX parts in turn. One warning per op and source line says what runs in torch and where it was written.
"""

from __future__ import annotations

import warnings

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..capture.fx import _user_frame, op_name
from ..ops import lookup
from .jax_graph import JaxGraph

_WARNED: set[tuple[str, str | None]] = set()


def missing_lowerings(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The call nodes of `gm` whose op has no JAX lowering."""
    return [node for node in gm.graph.nodes if node.op == "call_function" and lookup(op_name(node.target)) is None]


def warn_in_torch(nodes: list[torch.fx.Node]) -> None:
    """Warn once per (op, user source line) that the op runs in torch; count every graph that does
    (torch._dynamo.utils.counters["torch2jax_in_torch"][op]), which tests read."""
    from torch._dynamo.utils import counters

    for node in nodes:
        op = op_name(node.target)
        counters["torch2jax_in_torch"][op] += 1
        source = _user_frame(node.meta.get("stack_trace"))
        if (op, source) in _WARNED:
            continue
        _WARNED.add((op, source))
        where = f"\n  at {' '.join(source.split())}" if source else ""
        warnings.warn(
            f"torch2jax: {op} has no JAX lowering, so torch runs it between JAX parts of the graph{where}\n"
            "  register one with @torch2jax.register_lowering to keep the whole graph in JAX",
            UserWarning,
            stacklevel=2,
        )


class _Lowered(OperatorSupportBase):
    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return node.op == "call_function" and lookup(op_name(node.target)) is not None


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
    """`gm` with every maximal group of lowered ops replaced by a call to one JaxGraph."""
    partitioner = CapabilityBasedPartitioner(gm, _Lowered(), allows_single_node_partition=True)
    fused = partitioner.partition_and_fuse()
    for name, child in list(fused.named_children()):
        if isinstance(child, torch.fx.GraphModule) and name.startswith("fused_"):
            setattr(fused, name, _JaxPart(child))
    return fused
