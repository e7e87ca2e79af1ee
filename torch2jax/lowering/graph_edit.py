"""What every graph pass does to the portable graph: look up a value's meta, and rebuild the graph with
nodes replaced or dropped. Shared by passes.py and last_rows.py, so that a pass states only its rewrite."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..ir.graph import Graph, Node


def value_metas(graph: Graph) -> dict[str, Any]:
    """The meta of every value of `graph` (its inputs and its nodes), by name."""
    return {**{i.name: i.meta for i in graph.inputs}, **{n.name: n.meta for n in graph.nodes}}


def with_nodes_replaced(graph: Graph, replaced: dict[str, Node], dropped: set[str]) -> Graph:
    """`graph` with nodes replaced by name and the `dropped` ones left out (the same graph if none)."""
    if not replaced:
        return graph
    return dataclasses.replace(graph, nodes=[replaced.get(n.name, n) for n in graph.nodes if n.name not in dropped])
