"""Compute only the rows an output keeps: a slice of the last positions, pushed back up the graph.

A causal LM's prefill runs every layer over the whole prompt but keeps the last position's logits
(transformers' logits_to_keep: a slice of the final hidden states). Everything after the last layer's
attention is per position, so of the last layer only its keys and values (written to the cache) are
needed at every position; its queries, attention output, projections and MLP are needed at the kept
rows alone. XLA does not move a slice above a matrix product, so this pass does: each op whose every
reader needs only the kept rows along one axis is rewritten to compute only those rows, and a value
also read whole elsewhere is sliced where the rewritten ops read it. For an 8-layer model that is an
eighth of the prefill's matrix products (1/layers in general).

Only ops whose rows are independent along that axis are rewritten (elementwise ops, reductions and
softmax over other axes, transposes and reshapes that keep the axis, Linear layers, attention's
queries); anything else reads the rows it needs from a slice, so the values never change.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..ir.graph import Graph, Node, TensorMeta, iter_refs
from .graph_edit import value_metas, with_nodes_replaced

SLICE, SELECT, CAT, VIEWS = "aten.slice.Tensor", "aten.select.int", "aten.cat.default", (
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
LINEAR, SDPA, LAYER_NORM = ("torch2jax.linear.default", "aten.scaled_dot_product_attention.default",
                            "aten.native_layer_norm.default")
PERMUTE, UNSQUEEZE, GETITEM = "aten.permute.default", "aten.unsqueeze.default", "operator.getitem"
SPLITS = frozenset({"aten.split.Tensor", "aten.split_with_sizes.default"})
REDUCTIONS = frozenset({"aten.mean.dim", "aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default"})
SOFTMAXES = frozenset({"aten._softmax.default", "aten._log_softmax.default"})
ELEMENTWISE = frozenset({
    *(f"aten.{name}.default" for name in (
        "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "sigmoid", "tanh", "erf", "relu", "silu", "gelu",
        "sin", "cos", "clone", "alias", "_to_copy", "maximum", "minimum", "logical_not", "sign")),
    *(f"aten.{name}.Tensor" for name in ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge")),
    "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.where.self", "aten.clamp.default", "aten.div.Tensor_mode"})
COMPUTED_ONCE = "torch2jax.computed_once.default"  # [the op, *its args] (passes.computed_once)
IGNORED_READERS = frozenset({"aten._assert_tensor_metadata.default"})  # a no-op check of the dtype only
END = 1 << 62  # a slice's "to the end" (torch.export writes sys.maxsize)


def fold_linear_views(graph: Graph) -> Graph:
    """view(torch2jax.linear(view(x, [rows, k]), w[, b]), [*lead, n]) becomes torch2jax.linear(x, w[, b]) with the
    n-d x: the same product (its lowering flattens the rows itself), with the position axis kept in sight of
    keep_last_rows."""
    by_name = {node.name: node for node in graph.nodes}
    readers = _readers(graph, ignored=frozenset())  # a node is dropped only where nothing else reads it
    outputs = {ref for out in graph.outputs for ref in iter_refs(out.value)}  # (a training graph returns activations)
    metas = value_metas(graph)
    replaced, dropped = {}, set()
    for node in graph.nodes:
        linear = _single_ref(node.args[0]) if node.op in VIEWS and node.args else None
        linear = by_name.get(linear)
        if linear is None or linear.op != LINEAR or readers.get(linear.name) != [node.name] or linear.kwargs \
                or linear.name in outputs:
            continue
        flat = by_name.get(_single_ref(linear.args[0]))
        x = _single_ref(flat.args[0]) if flat is not None and flat.op in VIEWS else None
        shape, out, rows = _shape(metas.get(x)), _shape(node.meta), _shape(flat.meta) if flat is not None else None
        if shape is None or out is None or len(shape) < 3 or out[:-1] != shape[:-1]:
            continue
        if rows is None or len(rows) != 2 or rows[1] != shape[-1]:  # x's rows flattened, its features kept
            continue
        replaced[node.name] = Node(node.name, LINEAR, [{"ref": x}, *linear.args[1:]], {}, node.meta, node.source)
        dropped.add(linear.name)
        if readers.get(flat.name) == [linear.name] and flat.name not in outputs:
            dropped.add(flat.name)
    return with_nodes_replaced(graph, replaced, dropped)


def keep_last_rows(graph: Graph) -> Graph:
    """Slices of the last rows along an axis (x[:, -k:], the same k) pushed up through the ops that compute x row by
    row along that axis; see the module docstring."""
    metas = value_metas(graph)
    windows = {node.name: _window(node, metas) for node in graph.nodes}
    first = next((window for window in windows.values() if window is not None), None)
    if first is None:
        return graph
    return _Rows(graph, first, [node for node in graph.nodes if windows[node.name] == first]).rewrite()


def _window(node: Node, metas: dict) -> tuple | None:
    """(start, kept length, full length) of a slice of the last rows of a known length, else None."""
    if node.op != SLICE or len(node.args) < 4 or node.kwargs or (len(node.args) > 4 and node.args[4] != 1):
        return None
    dim, start, end = node.args[1:4]
    out, source = _shape(node.meta), _shape(metas.get(_single_ref(node.args[0])))
    if not (isinstance(start, int) and start < 0 and (end is None or (isinstance(end, int) and end >= END))):
        return None
    if out is None or source is None or not isinstance(dim, int):
        return None
    kept = out[dim % len(out)]
    if kept != -start or source[dim % len(out)] == kept:
        return None
    return start, kept, source[dim % len(out)]


class _Rows:
    """One window's rewrite. Nodes are visited from the outputs back: a node is rewritten to its kept rows when
    every reader was rewritten and asked for those rows along the same axis."""

    def __init__(self, graph: Graph, window: tuple, seeds: list[Node]):
        self.graph, (self.start, self.kept, self.full) = graph, window
        self.by_name = {node.name: node for node in graph.nodes}
        self.metas = value_metas(graph)
        self.readers = _readers(graph)
        self.outputs = {ref for out in graph.outputs for ref in iter_refs(out.value)}
        self.asked: dict[str, dict[str, int]] = {}  # value -> {reader: the axis it needs the kept rows of}
        self.new: dict[str, Node] = {}  # rewritten nodes, by name (they keep their names)
        self.reads: dict[str, dict[str, int]] = {}  # rewritten node -> {value: axis} it reads the kept rows of
        for seed in seeds:
            self.asked.setdefault(seed.args[0]["ref"], {})[seed.name] = seed.args[1] % len(seed.meta.shape)

    def rewrite(self) -> Graph:
        for node in reversed(self.graph.nodes):
            asked = self.asked.get(node.name, {})
            axes = set(asked.values())
            whole = [reader for reader in self.readers.get(node.name, []) if reader not in asked and not self._unread(reader)]
            if len(axes) == 1 and not whole and node.name not in self.outputs:
                self._try(node, axes.pop())
        for name, node in list(self.new.items()):  # a getitem of a node that was not rewritten reads it whole
            if node.op == GETITEM and _single_ref(node.args[0]) not in self.new:
                del self.new[name], self.reads[name]
        if not self.new:
            return self.graph
        # the values rewritten nodes read the kept rows of but which were not rewritten themselves: read from a slice
        cuts = {(value, axis) for reads in self.reads.values() for value, axis in reads.items() if value not in self.new}
        names = {cut: f"{cut[0]}__rows{cut[1]}" for cut in cuts}
        nodes = [self._cut(value, axis, names) for value, axis in sorted(cuts) if value not in self.by_name]
        for node in self.graph.nodes:
            node = self.new.get(node.name, node)
            if node.name in self.reads:
                swap = {value: names[(value, axis)] for value, axis in self.reads[node.name].items() if value not in self.new}
                node = dataclasses.replace(node, args=_renamed(node.args, swap), kwargs=_renamed(node.kwargs, swap))
            nodes.append(node)
            nodes.extend(self._cut(value, axis, names) for value, axis in sorted(cuts) if value == node.name)
        return dataclasses.replace(self.graph, nodes=nodes)

    def _unread(self, name: str) -> bool:
        """An output of several that nothing reads (a layer norm's saved mean): it reads the rewritten node harmlessly."""
        return self.by_name[name].op == GETITEM and not self.readers.get(name) and name not in self.outputs

    def _try(self, node: Node, axis: int) -> None:
        """Rewrite `node` to its kept rows along `axis` if a rule knows how (else its readers read a slice)."""
        meta = node.meta[0] if isinstance(node.meta, list) and node.meta else node.meta
        shape = _shape(meta)
        if shape is None or shape[axis] != self.full:
            return
        found = _rule(node, axis, shape, self)
        if found is None:
            return
        args, reads = found
        self.new[node.name] = Node(node.name, node.op, args, node.kwargs, _kept_meta(node.meta, axis, self.kept), node.source)
        self.reads[node.name] = reads
        for value, value_axis in reads.items():
            self.asked.setdefault(value, {})[node.name] = value_axis

    def _cut(self, value: str, axis: int, names: dict) -> Node:
        meta = _kept_meta(self.metas[value], axis, self.kept)
        return Node(names[(value, axis)], SLICE, [{"ref": value}, axis, self.start, END], {}, meta)


def _rule(node: Node, axis: int, shape: list, rows: _Rows) -> tuple[list, dict[str, int]] | None:
    """(args, {value: axis}) of `node` computing only the kept rows along its output `axis`, with the values it then
    reads only the kept rows of, each along its own axis. None where the op's rows are not independent there."""
    op, args, kwargs, rank = node.op, node.args, node.kwargs, len(shape)
    if op in ELEMENTWISE or (op == COMPUTED_ONCE and args and args[0] in ELEMENTWISE):
        reads = {}
        for value in dict.fromkeys(iter_refs([args, kwargs])):
            meta = rows.metas.get(value)
            if not isinstance(meta, TensorMeta):
                if meta is None or isinstance(meta, list):
                    return None
                continue  # a symbolic int
            aligned = axis - (rank - len(meta.shape))
            if aligned < 0 or meta.shape[aligned] == 1:
                continue  # broadcast along the axis: read whole
            if meta.shape[aligned] != rows.full:
                return None
            reads[value] = aligned
        return args, reads
    source = _single_ref(args[0]) if args else None
    operand = _shape(rows.metas.get(source))
    if operand is None:
        if op == CAT:
            return _cat_rule(args, kwargs, axis, rank, rows)
        if op == GETITEM:
            return _getitem_rule(args, axis, rows)
        return None
    if op == LINEAR:
        return (args, {source: axis}) if axis < rank - 1 and not kwargs else None
    if op == PERMUTE:
        return args, {source: [d % rank for d in args[1]][axis]}
    if op == UNSQUEEZE:
        at = args[1] % rank
        return args, {source: axis if axis < at else axis - 1}
    if op in VIEWS:
        return _view_rule(args, kwargs, axis, shape, operand, source, rows.kept)
    if op in SOFTMAXES:
        return (args, {source: axis}) if args[1] % rank != axis else None
    if op in REDUCTIONS:
        return _reduction_rule(args, kwargs, axis, operand, source)
    if op in (SLICE, SELECT):
        if len(args) < 2 or not isinstance(args[1], int) or kwargs:
            return None
        dim = args[1] % len(operand)
        inner = axis if op == SLICE or axis < dim else axis + 1
        return (args, {source: inner}) if inner != dim else None
    if op == LAYER_NORM:
        reads = _layer_norm_reads(node, axis, rows)
        return (args, reads) if reads is not None else None
    if op in SPLITS:
        dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
        return (args, {source: axis}) if isinstance(dim, int) and dim % len(operand) != axis else None
    if op == SDPA:
        return _attention_rule(args, kwargs, axis, rank, rows)
    return None


def _view_rule(args: list, kwargs: dict, axis: int, shape: list, operand: list, source: str, kept: int):
    """A reshape that keeps the axis whole (the same dims before it, 1s aside): its target takes the kept length."""
    if len(args) != 2 or not isinstance(args[1], list) or len(args[1]) != len(shape) or kwargs:
        return None
    before = [d for d in shape[:axis] if d != 1]
    for inner, size in enumerate(operand):
        if size == shape[axis] and [d for d in operand[:inner] if d != 1] == before:
            target = list(args[1])
            target[axis] = kept
            return [args[0], target], {source: inner}
    return None


def _reduction_rule(args: list, kwargs: dict, axis: int, operand: list, source: str):
    """A reduction over other axes (mean, sum, amax, amin, with or without keepdim)."""
    rank = len(operand)
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if not isinstance(dims, list) or not dims:
        return None
    dims = {d % rank for d in dims}
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    inner = axis if keepdim else [d for d in range(rank) if d not in dims][axis]
    return (args, {source: inner}) if inner not in dims else None


def _cat_rule(args: list, kwargs: dict, axis: int, rank: int, rows: _Rows):
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % rank
    parts = [_single_ref(part) for part in args[0]] if isinstance(args[0], list) else [None]
    if dim == axis or None in parts or any(len(_shape(rows.metas.get(p)) or ()) != rank for p in parts):
        return None
    if any(_shape(rows.metas[p])[axis] != rows.full for p in parts):
        return None
    return args, {part: axis for part in parts}


def _getitem_rule(args: list, axis: int, rows: _Rows):
    """One output of a node of several (a layer norm, a split): that node's rows along the same axis. Should that
    node not be rewritten after all, the getitem is restored and its readers read its slice (_Rows.rewrite)."""
    source = _single_ref(args[0])
    return (args, {source: axis}) if isinstance(rows.metas.get(source), list) else None


def _layer_norm_reads(node: Node, axis: int, rows: _Rows) -> dict | None:
    """A layer norm over the last dims, its input's rows along another axis."""
    source = _single_ref(node.args[0]) if node.args else None
    operand = _shape(rows.metas.get(source))
    if operand is None or len(node.args) < 2 or not isinstance(node.args[1], list):
        return None
    return {source: axis} if axis < len(operand) - len(node.args[1]) else None


def _attention_rule(args: list, kwargs: dict, axis: int, rank: int, rows: _Rows):
    """Attention's output rows are its queries' rows (the last axis but one); keys and values are read whole, and the
    mask's rows follow the queries' unless it broadcasts over them."""
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    given = dict(zip(names, args)) | kwargs
    if axis != rank - 2 or given.get("is_causal") or given.get("dropout_p", 0.0):
        return None
    query, mask = _single_ref(given.get("query")), given.get("attn_mask")
    whole = {_single_ref(given.get("key")), _single_ref(given.get("value"))}
    if query is None or query in whole:
        return None
    reads = {query: axis}
    mask = _single_ref(mask)
    if mask is not None:
        shape = _shape(rows.metas.get(mask))
        if shape is None or len(shape) < 2 or mask in whole or mask == query:
            return None
        if shape[-2] != 1:
            if shape[-2] != rows.full:
                return None
            reads[mask] = len(shape) - 2
    return args, reads


def _kept_meta(meta: Any, axis: int, kept: int) -> Any:
    if isinstance(meta, list):
        return [_kept_meta(m, axis, kept) for m in meta]
    if not isinstance(meta, TensorMeta):
        return meta
    shape = list(meta.shape)
    shape[axis] = kept
    return TensorMeta(meta.dtype, shape)


def _shape(meta: Any) -> list | None:
    return list(meta.shape) if isinstance(meta, TensorMeta) else None


def _single_ref(value: Any) -> str | None:
    return value.get("ref") if isinstance(value, dict) and set(value) == {"ref"} else None


def _readers(graph: Graph, ignored: frozenset = IGNORED_READERS) -> dict[str, list[str]]:
    """The nodes reading each value, each once (by default the no-op metadata checks left out: a value they check
    may be rewritten, not dropped)."""
    readers: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.op in ignored:
            continue
        for ref in dict.fromkeys(iter_refs([node.args, node.kwargs])):
            readers.setdefault(ref, []).append(node.name)
    return readers


def _renamed(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, dict) and set(value) == {"ref"}:
        return {"ref": names.get(value["ref"], value["ref"])}
    if isinstance(value, list):
        return [_renamed(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _renamed(v, names) for k, v in value.items()}
    return value
