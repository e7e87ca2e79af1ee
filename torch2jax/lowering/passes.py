"""Graph passes over the portable graph, run before the interpreter builds the JAX function.

A pass returns a new Graph computing the same values; it never changes the params pytree
(names, shapes, values), so users keep their own weights and grads flow to every param.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from ..ir import dtypes
from ..ir.graph import PARAM_KINDS, Graph, Node, iter_refs
from ..ops import lookup
from .graph_edit import value_metas, with_nodes_replaced
from .last_rows import fold_linear_views, keep_last_rows

CONV = "aten.convolution.default"
BATCH_NORM = "aten._native_batch_norm_legit_no_training.default"
CONV_BATCH_NORM = "torch2jax.conv_batch_norm.default"
BMM, MATMUL, EXPAND, VIEWS = "aten.bmm.default", "aten.matmul.default", "aten.expand.default", (
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
INDEX, EXPERT_BMM = "aten.index.Tensor", "torch2jax.expert_bmm.default"
# Up to this many experts, computing every expert for every row beats gathering each row's expert
# weights (XLA CPU, 1024x256 experts, 128 rows: gather + bmm 113 ms; dense 11 ms at 4 experts,
# 32 ms at 16, 87 ms at 32; at 64 experts of 512x256 dense is 2.1x slower).
DENSE_EXPERTS_MAX = 16
COMPUTED_ONCE = "torch2jax.computed_once.default"
# Ops that cost several times a multiply-add per element (transcendentals, gathers): XLA fuses them
# into each consumer, and a consumer that broadcasts the result recomputes them per element it writes.
COSTLY = frozenset({
    *(f"aten.{name}.default" for name in (
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan",
        "asin", "acos", "atan", "sinh", "cosh", "tanh", "erf", "erfc", "sigmoid", "embedding")),
    "aten.index.Tensor"})
# Ops XLA fuses along with their input without changing which elements are read: followed when
# looking for the consumer that broadcasts an expensive value.
_CARRIES = frozenset({*VIEWS, "aten.unsqueeze.default", "aten.squeeze.dims", "aten.squeeze.dim",
                      "aten.permute.default", "aten.slice.Tensor", "aten.select.int", "aten._to_copy.default",
                      "aten.clone.default", "aten.alias.default", "aten.neg.default"})
PERMUTE, MM, ADDMM = "aten.permute.default", "aten.mm.default", "aten.addmm.default"
LINEAR = "torch2jax.linear.default"
DYNAMIC_INT8_WEIGHT, DYNAMIC_INT8_LINEAR = "torch2jax.dynamic_int8_weight.default", "torch2jax.dynamic_int8_linear.default"
DEQUANTIZE_INT8, DEQUANTIZE_INT4 = "torch2jax.dequantize_int8.default", "torch2jax.dequantize_int4.default"
DEQUANTIZE_INT4_HALVES = "torch2jax.dequantize_int4_halves.default"
# a quantized weight's op (runtime/quantize.py) -> the op of a Linear reading it, made from the stored form (ops/quantized.py)
_QUANTIZED_LINEAR = {DYNAMIC_INT8_WEIGHT: DYNAMIC_INT8_LINEAR, DEQUANTIZE_INT8: "torch2jax.int8_linear.default",
                     DEQUANTIZE_INT4: "torch2jax.int4_linear.default",
                     DEQUANTIZE_INT4_HALVES: "torch2jax.int4_halves_linear.default",
                     # weights a checkpoint stores quantized (runtime/quantize.adopt_stored)
                     "torch2jax.dequantize_blocks.default": "torch2jax.blocks_linear.default",
                     "torch2jax.dequantize_packed_int.default": "torch2jax.packed_int_linear.default",
                     "torch2jax.dequantize_packed_int_permuted.default": "torch2jax.packed_int_permuted_linear.default"}
_BINARY = frozenset({"aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.where.self",
                     "aten.maximum.default", "aten.minimum.default"})


def optimize(graph: Graph) -> Graph:
    """Every pass, in order. A pass that rewrites ops whose lowering the user replaced
    (`register_lowering(..., replace=True)`, `--lowerings`) is skipped: it would bypass that lowering."""
    for rewrite, reads in _PASSES:
        if all(_built_in(op) for op in reads):
            graph = rewrite(graph)
    return graph


def _built_in(op: str) -> bool:
    lowering = lookup(op)
    return lowering is not None and lowering.module.startswith("torch2jax.ops.")


def _refs(value: Any, out: Counter) -> None:
    out.update(iter_refs(value))


def _uses(graph: Graph) -> Counter:
    uses: Counter = Counter()
    for node in graph.nodes:
        _refs(node.args, uses)
        _refs(node.kwargs, uses)
    for out in graph.outputs:
        _refs(out.value, uses)
    return uses


def drop_dead_nodes(graph: Graph) -> Graph:
    """`graph` without the nodes no output (user outputs, buffer writes, effect tokens) depends on. XLA drops them
    anyway; dropping them here matters where a pass reads which params the graph uses (an encoder-decoder's encode
    runs the decoder once to fill its cross-attention cache and keeps only that)."""
    by_name = {node.name: node for node in graph.nodes}
    live: set[str] = set()
    stack = [ref for out in graph.outputs for ref in iter_refs(out.value)]
    while stack:
        name = stack.pop()
        if name in live or name not in by_name:
            continue
        live.add(name)
        stack.extend(_node_refs(by_name[name]))
    if len(live) == len(graph.nodes):
        return graph
    return dataclasses.replace(graph, nodes=[node for node in graph.nodes if node.name in live])


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
    return with_nodes_replaced(graph, fused, dropped)


def shared_matmul_operand(graph: Graph) -> Graph:
    """bmm(x, expand(w)) with a 2-d w broadcast over the batch becomes matmul(x, w).

    torch decomposes a 3-d @ 2-d matmul (an RNN's input projection over the whole sequence) into
    expanding the 2-d side to a batch of copies and a bmm; XLA then materializes the copies (8 MB
    per LSTM layer and direction for 32 steps). matmul(x, w) is one GEMM over all rows instead.
    """
    return _rewrite_bmms(graph, _matmul_of_broadcast)


def _rewrite_bmms(graph: Graph, rewrite) -> Graph:
    """Each bmm that `rewrite(node, by_name, metas)` turns into (new node, the nodes feeding only it,
    nearest first) is replaced; those feeding nodes are dropped up to the first one read elsewhere."""
    def one_chain(node: Node, by_name: dict, metas: dict) -> tuple[Node, list[list[str]]] | None:
        if len(node.args) != 2 or node.kwargs or (found := rewrite(node, by_name, metas)) is None:
            return None
        return found[0], [found[1]]

    return _rewrite_nodes(graph, BMM, one_chain)


def _rewrite_nodes(graph: Graph, op: str, rewrite) -> Graph:
    """Each `op` node that `rewrite(node, by_name, metas)` turns into (new node, chains of the nodes feeding it, each
    nearest first) is replaced; each chain's nodes are dropped up to the first one read elsewhere."""
    by_name = {node.name: node for node in graph.nodes}
    metas = value_metas(graph)
    uses = _uses(graph)
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    for node in graph.nodes:
        found = rewrite(node, by_name, metas) if node.op == op else None
        if found is None:
            continue
        replaced[node.name], chains = found
        for chain in chains:
            for name in chain:
                if uses[name] != 1:
                    break
                dropped.add(name)
    return with_nodes_replaced(graph, replaced, dropped)


def _matmul_of_broadcast(node: Node, by_name: dict, metas: dict) -> tuple[Node, list[str]] | None:
    chain = _broadcast_2d(node.args[1], by_name, metas)
    if chain is None:
        return None
    source, between = chain  # the view, then the expand
    return Node(node.name, MATMUL, [node.args[0], {"ref": source}], {}, node.meta, node.source), between


def _broadcast_2d(arg: Any, by_name: dict, metas: dict) -> tuple[str, list[str]] | None:
    """(w, [the view and expand nodes]) when `arg` is (a view of) a 2-d w expanded along a new leading dim."""
    between = []
    node = by_name.get(arg.get("ref")) if isinstance(arg, dict) else None
    if node is not None and node.op in VIEWS:
        between.append(node.name)
        node = by_name.get(node.args[0].get("ref")) if isinstance(node.args[0], dict) else None
    if node is None or node.op != EXPAND or not isinstance(node.args[0], dict):
        return None
    between.append(node.name)
    source, sizes = node.args[0].get("ref"), node.args[1]
    meta = metas.get(source)
    if source is None or not hasattr(meta, "shape") or len(meta.shape) != 2 or len(sizes) != 3:
        return None
    if any(size not in (-1, dim) for size, dim in zip(sizes[1:], meta.shape)):
        return None
    return source, between


SDPA, UNSQUEEZE, CLONE = "aten.scaled_dot_product_attention.default", "aten.unsqueeze.default", "aten.clone.default"


def grouped_attention(graph: Graph) -> Graph:
    """Attention over key/value heads repeated for each group of query heads (grouped-query attention
    written as transformers' repeat_kv: view(clone(expand(unsqueeze(k, 2)))) per layer) reads k and v
    as they are, with enable_gqa.

    XLA materializes the repeated copies: a decode step over a 512-slot cache with 2 key/value heads
    for 8 query heads writes 4x the cache's bytes per layer before attending. The grouped einsum of
    the attention lowering reads each key/value head once for its group of query heads.
    """
    return _rewrite_nodes(graph, SDPA, _grouped)


def _grouped(node: Node, by_name: dict, metas: dict) -> tuple[Node, list[list[str]]] | None:
    if not 3 <= len(node.args) <= 7 or node.kwargs.get("enable_gqa"):
        return None
    found = [_repeated_heads(node.args[i], by_name, metas) for i in (1, 2)]
    if None in found or found[0][2] != found[1][2]:
        return None
    args = list(node.args)
    args[1], args[2] = ({"ref": source} for source, _, _ in found)
    grouped = Node(node.name, SDPA, args, {**node.kwargs, "enable_gqa": True}, node.meta, node.source)
    return grouped, [chain for _, chain, _ in found]


def _repeated_heads(arg: Any, by_name: dict, metas: dict) -> tuple[str, list[str], int] | None:
    """(x, [view, clone, expand, unsqueeze], groups) when `arg` is x [B, H, L, D] with each head repeated
    `groups` times in place: view(clone(expand(unsqueeze(x, 2), [B, H, groups, L, D])), [B, H*groups, L, D])."""
    chain: list[str] = []
    node = by_name.get(arg.get("ref")) if isinstance(arg, dict) else None
    for op in (VIEWS, (CLONE,), (EXPAND,), (UNSQUEEZE,)):
        if node is None or node.op not in op or not node.args or not isinstance(node.args[0], dict):
            return None
        chain.append(node.name)
        if op == (UNSQUEEZE,):
            break
        node = by_name.get(node.args[0].get("ref"))
    view, _, expand, unsqueeze = (by_name[name] for name in chain)
    source = unsqueeze.args[0]["ref"]
    shapes = [getattr(metas.get(name), "shape", None) for name in (source, expand.name, view.name)]
    if any(shape is None for shape in shapes) or len(shapes[0]) != 4 or unsqueeze.args[1:] not in ([2], [-3]):
        return None
    (b, h, length, d), expanded, out = shapes
    groups = expanded[2] if len(expanded) == 5 else None
    if not isinstance(groups, int) or list(expanded) != [b, h, groups, length, d]:
        return None
    if not isinstance(h, int) or list(out) != [b, h * groups, length, d]:
        return None
    return source, chain, groups


def expert_matmul(graph: Graph) -> Graph:
    """bmm(w[ids], x) or bmm(x, w[ids]), with a 3-d stack of a few experts' weights `w`, becomes one
    expert_bmm node, lowered as every expert times every row and then each row's pick.

    A mixture-of-experts layer written for export (transformers' batched_mm experts) gathers each
    token's expert matrix, rows x N x K bytes, before a batch of matrix-vector products: XLA CPU
    spends ~3 ns per gathered element. With few experts, the dense products are one GEMM instead.
    """
    return _rewrite_bmms(graph, _dense_experts)


def _dense_experts(node: Node, by_name: dict, metas: dict) -> tuple[Node, list[str]] | None:
    if not _is_floating(node.meta):
        return None
    for side in (0, 1):
        gathered = _expert_gather(node.args[side], by_name, metas)
        if gathered is not None:
            weights, ids = gathered
            args = [weights, ids, node.args[1 - side], side == 0]
            return Node(node.name, EXPERT_BMM, args, {}, node.meta, node.source), [node.args[side]["ref"]]
    return None


def _is_floating(meta: Any) -> bool:
    return hasattr(meta, "dtype") and dtypes.is_floating(dtypes.numpy_dtype(meta.dtype))


def _expert_gather(arg: Any, by_name: dict, metas: dict) -> tuple[dict, dict] | None:
    """(w, ids) refs when `arg` is index(w, [ids]): a 3-d w with at most DENSE_EXPERTS_MAX rows, 1-d ids."""
    node = by_name.get(arg.get("ref")) if isinstance(arg, dict) else None
    if node is None or node.op != INDEX or len(node.args) != 2 or node.kwargs:
        return None
    weights, indices = node.args
    if not isinstance(weights, dict) or not isinstance(indices, list) or len(indices) != 1 or not isinstance(indices[0], dict):
        return None
    w_meta, ids_meta = metas.get(weights.get("ref")), metas.get(indices[0].get("ref"))
    if not hasattr(w_meta, "shape") or not hasattr(ids_meta, "shape") or len(w_meta.shape) != 3 or len(ids_meta.shape) != 1:
        return None
    experts = w_meta.shape[0]
    if not isinstance(experts, int) or experts > DENSE_EXPERTS_MAX or not dtypes.is_integer(dtypes.numpy_dtype(ids_meta.dtype)):
        return None
    return weights, indices[0]


def computed_once(graph: Graph) -> Graph:
    """A costly op whose result some consumer broadcasts is computed once, on its own.

    Llama's rotary tables are cos and sin of a (1, seq, head_dim) array, multiplied into q and k of
    every layer (batch x heads times larger): XLA CPU fused cos/sin into each of those products and
    recomputed them per element, 10x the cost of the products themselves (4.7 vs 0.47 ms for four
    8x4x64x64 products). T5's relative position bias, a gather from a (buckets, heads) table, was
    likewise gathered again for every batch element inside each layer's softmax. The op is wrapped
    in a node whose lowering keeps it out of the consumers (ops/fusion_barrier.py).
    """
    consumers = _consumers(graph)
    metas = value_metas(graph)
    replaced = {}
    for node in graph.nodes:
        lowering = lookup(node.op)  # a user's replacement lowering may ask for context: left as is
        if node.op in COSTLY and lowering is not None and not lowering.ctx and _broadcast_later(node.name, consumers, metas):
            replaced[node.name] = Node(node.name, COMPUTED_ONCE, [node.op, *node.args], node.kwargs, node.meta, node.source)
    return with_nodes_replaced(graph, replaced, set())


def _consumers(graph: Graph) -> dict[str, list[Node]]:
    """The nodes that read each value, each listed once per value."""
    consumers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for ref in _node_refs(node):
            consumers.setdefault(ref, []).append(node)
    return consumers


def _node_refs(node: Node) -> list[str]:
    refs: Counter = Counter()
    _refs(node.args, refs)
    _refs(node.kwargs, refs)
    return list(refs)


def _broadcast_later(name: str, consumers: dict, metas: dict, depth: int = 6) -> bool:
    """Whether the value `name`, through ops that carry it element for element, meets an expand or a
    binary op whose output has more elements than it (a size-1 or missing dim made larger)."""
    if depth == 0:
        return False
    for user in consumers.get(name, []):
        if user.op == EXPAND:
            return True
        if user.op in _BINARY and _broadcasts(metas.get(name), user.meta):
            return True
        if (user.op in _CARRIES or user.op in _BINARY) and _broadcast_later(user.name, consumers, metas, depth - 1):
            return True
    return False


def _broadcasts(operand: Any, result: Any) -> bool:
    if not hasattr(operand, "shape") or not hasattr(result, "shape"):
        return False
    small, large = list(operand.shape), list(result.shape)
    if len(small) < len(large):
        return True
    return any(a == 1 and b != 1 for a, b in zip(reversed(small), reversed(large)))


def linear_products(graph: Graph) -> Graph:
    """mm(x, permute(w, [1, 0])) and addmm(bias, x, permute(w, [1, 0])), which is how torch.export
    writes nn.Linear (and an unrolled RNN its w_hh at every step), become torch2jax.linear(x, w[, bias]); so does
    matmul(x, permute(w)) with an n-d x (a Linear on a slice of a symbolic batch, after shared_matmul_operand: a
    causal LM's head on the last position), which XLA would otherwise transpose and copy w for on every call.
    Its lowering sees w itself, not a transposed value, and orders the operands for the platform
    (ops/linalg.linear). A transpose left with no reader is dropped.
    """
    by_name = {node.name: node for node in graph.nodes}
    metas = value_metas(graph)
    uses = _uses(graph)
    replaced: dict[str, Node] = {}
    rewritten: Counter = Counter()
    for node in graph.nodes:
        rhs = {MM: 1, ADDMM: 2, MATMUL: 1}.get(node.op)
        if rhs is None or len(node.args) != rhs + 1 or not _default_scales(node.kwargs):
            continue
        x = node.args[0].get("ref") if isinstance(node.args[0], dict) else None
        if node.op == MATMUL and len(getattr(metas.get(x), "shape", ())) < 2:
            continue  # a vector @ w.T is not a Linear's product
        source = by_name.get(node.args[rhs]["ref"]) if isinstance(node.args[rhs], dict) else None
        if source is None or not _is_transpose_2d(source):
            continue
        bias = [node.args[0]] if node.op == ADDMM else []
        replaced[node.name] = Node(node.name, LINEAR, [node.args[rhs - 1], source.args[0], *bias], {}, node.meta, node.source)
        rewritten[source.name] += 1
    dropped = {name for name, count in rewritten.items() if count == uses[name]}
    return with_nodes_replaced(graph, replaced, dropped)


def _default_scales(kwargs: dict) -> bool:
    return set(kwargs) <= {"beta", "alpha"} and all(value == 1 for value in kwargs.values())


def _is_transpose_2d(node: Node) -> bool:
    return (node.op == PERMUTE and len(node.args) == 2 and isinstance(node.args[0], dict) and "ref" in node.args[0]
            and [d % 2 for d in node.args[1]] == [1, 0] and len(getattr(node.meta, "shape", ())) == 2)


def quantized_products(graph: Graph) -> Graph:
    """torch2jax.linear(x, w[, bias]) and matmul(x, permute(w)) of a quantized weight w (dynamic_int8_weight,
    dequantize_int8 or dequantize_int4(_halves) of the stored params: runtime/quantize.py) become one op over the stored
    form (ops/quantized.py): dynamic_int8_linear(x, q, scale[, bias]) makes the product in int8; int8_linear(x, q,
    scale, dtype[, bias]) and int4(_halves)_linear(x, packed, scale, group_size, dtype[, bias]) dequantize the weight
    where the product needs it. A weight or transpose node left with no reader is dropped."""
    by_name = {node.name: node for node in graph.nodes}
    uses = _uses(graph)
    replaced: dict[str, Node] = {}
    rewritten: Counter = Counter()
    for node in graph.nodes:
        if node.op not in (LINEAR, MATMUL) or len(node.args) < 2 or not isinstance(node.args[1], dict):
            continue
        weight = transpose = by_name.get(node.args[1].get("ref"))
        if node.op == MATMUL:  # x @ permute(w) with x of any rank: a Linear on a batch of sequences (the LM head)
            if transpose is None or len(node.args) != 2 or not _is_transpose_2d(transpose):
                continue
            weight = by_name.get(transpose.args[0]["ref"])
        if weight is None or weight.op not in _QUANTIZED_LINEAR:
            continue
        if node.op == MATMUL:
            rewritten[transpose.name] += 1
        stored = weight.args[:2] if weight.op == DYNAMIC_INT8_WEIGHT else weight.args
        replaced[node.name] = Node(node.name, _QUANTIZED_LINEAR[weight.op], [node.args[0], *stored, *node.args[2:]], {},
                                   node.meta, node.source)
        rewritten[weight.name] += 1
    dropped = {name for name, count in rewritten.items() if count == uses[name]}
    return with_nodes_replaced(graph, replaced, dropped)


# Each pass with the ops it replaces by nodes of its own (computed_once wraps the registered lowering itself).
_PASSES = [
    (fold_conv_batch_norm, (CONV, BATCH_NORM)),
    (shared_matmul_operand, (BMM, EXPAND, *VIEWS)),
    (expert_matmul, (BMM, INDEX, EXPAND, *VIEWS)),
    (computed_once, ()),
    (linear_products, (MM, ADDMM, MATMUL, PERMUTE)),
    (fold_linear_views, (LINEAR, *VIEWS)),
    (keep_last_rows, ("aten.slice.Tensor", SDPA, LINEAR)),
    (grouped_attention, (SDPA, CLONE, EXPAND, UNSQUEEZE, *VIEWS)),
    (quantized_products, (LINEAR, MATMUL, PERMUTE, *_QUANTIZED_LINEAR)),
]
