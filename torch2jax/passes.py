"""Graph passes over the portable graph, run before the interpreter builds the JAX function.

A pass returns a new Graph computing the same values; it never changes the params pytree
(names, shapes, values), so users keep their own weights and grads flow to every param.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from .graph import PARAM_KINDS, Graph, Node

CONV = "aten.convolution.default"
BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"
CONV_BATCH_NORM = "torch2jax.conv_batch_norm.default"


def optimize(graph: Graph) -> Graph:
    """Every pass, in order."""
    return fold_conv_batch_norm(graph)


def _refs(value: Any, out: Counter) -> None:
    if isinstance(value, list):
        for v in value:
            _refs(v, out)
    elif isinstance(value, dict):
        if len(value) == 1 and "ref" in value:
            out[value["ref"]] += 1
        else:
            for v in value.values():
                _refs(v, out)


def _uses(graph: Graph) -> Counter:
    uses: Counter = Counter()
    for node in graph.nodes:
        _refs(node.args, uses)
        _refs(node.kwargs, uses)
    for out in graph.outputs:
        _refs(out.value, uses)
    return uses


def fold_conv_batch_norm(graph: Graph) -> Graph:
    """conv -> eval-mode batch norm becomes one conv whose weights are scaled by the norm, per call.

    The folded weights are computed inside the function from the params (a few ops on weights,
    not on activations), so fine-tuning any of the five params still gets the right gradients.
    Only a conv whose sole user is the norm, with the norm's statistics as params, is folded.
    """
    params = {i.name for i in graph.inputs if i.kind in PARAM_KINDS}
    uses = _uses(graph)
    by_name = {node.name: node for node in graph.nodes}
    fused: dict[str, Node] = {}  # batch-norm node name -> fused node
    dropped: set[str] = set()
    for node in graph.nodes:
        if node.op != BATCH_NORM or not node.args or not isinstance(node.args[0], dict):
            continue
        conv = by_name.get(node.args[0].get("ref"))
        if conv is None or conv.op != CONV or len(conv.args) != 9 or len(node.args) != 7 or node.kwargs or conv.kwargs:
            continue
        if uses[conv.name] != 1 or conv.args[6] is not False:  # another user needs the unnormalized conv
            continue
        stats = node.args[1:5]
        if not all(s is None or (isinstance(s, dict) and s.get("ref") in params) for s in stats):
            continue
        fused[node.name] = Node(node.name, CONV_BATCH_NORM, list(conv.args) + list(node.args[1:]), {}, node.meta, node.source)
        dropped.add(conv.name)
    if not fused:
        return graph
    nodes = [fused.get(n.name, n) for n in graph.nodes if n.name not in dropped]
    return dataclasses.replace(graph, nodes=nodes)
