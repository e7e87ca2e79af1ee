"""LoRA as a side path of the graph: each matrix product of a targeted weight gets `y + scale * (x @ A.T) @ B.T` beside it.

Merging a LoRA delta into a weight (W + scale * B @ A) needs a float weight that every row shares. A side path does
not: the base product stays as converted (a float Linear, or an int8 / int4 product over the stored quantized form,
ops/quantized.py), so adapters train on a quantized base (QLoRA), and with stacked adapters each row of a batch can
use its own (multi-adapter serving). The pass adds, per targeted module, param inputs `{module}.lora_A` [r, in] and
`{module}.lora_B` [out, r] ([n, r, in] / [n, out, r] stacked per row, with a user input `adapter_ids` int32 [batch]),
and one `torch2jax.lora.default` node (ops/lora.py) after each product that reads the module's weight.

The products it recognizes, as converted graphs write them (raw, or after passes.optimize):

    torch2jax.linear(x, W[, b])                            nn.Linear, optimized
    mm / addmm / matmul(x, permute(W, [1, 0]))             nn.Linear, raw
    mm / addmm(x, W)                                       transformers' Conv1D (GPT-2): W stored [in, out]
    torch2jax.int8_linear / int4_halves_linear / int4_linear / dynamic_int8_linear(x, stored W, ...)   quantized
    dequantize_*(stored W) read as W in any of the above  quantized, raw

A targeted weight read any other way (an embedding, a tied head, a broadcast bmm) is an error naming the weight and
the op: a skipped module would silently train or serve something else than the adapter says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from ..errors import Torch2JaxError
from ..ir.graph import PARAM_KINDS, Graph, GraphInput, Node, TensorMeta
from .graph_edit import value_metas

LORA, RECOMPUTED = "torch2jax.lora.default", "torch2jax.recomputed.default"
ADAPTER_IDS = "adapter_ids"
PERMUTE, MM, ADDMM, MATMUL = "aten.permute.default", "aten.mm.default", "aten.addmm.default", "aten.matmul.default"
LINEAR = "torch2jax.linear.default"
# products over a weight's stored quantized form (passes.quantized_products): the stored values are argument 1
QUANTIZED_LINEARS = frozenset({"torch2jax.int8_linear.default", "torch2jax.int4_halves_linear.default",
                               "torch2jax.int4_linear.default", "torch2jax.dynamic_int8_linear.default"})
# a quantized weight made whole again (runtime/quantize.py): the node stands for the weight, its argument 0 is stored
DEQUANTIZE = frozenset({"torch2jax.dequantize_int8.default", "torch2jax.dequantize_int4_halves.default",
                        "torch2jax.dequantize_int4.default", "torch2jax.dynamic_int8_weight.default"})
_RHS = {MM: 1, ADDMM: 2, MATMUL: 1}  # a product's weight operand; x is the one before it


class LoraPathError(Torch2JaxError, ValueError):
    """A LoRA target the side path cannot reach: no such weight in the graph, or a weight read by no supported product."""


class LoraTarget(NamedTuple):
    """One adapted module: its rank, the scale of its update (alpha / rank, or 1.0 where the adapters carry it), and
    whether its weight is stored [in, out] (transformers' Conv1D; PEFT's fan_in_fan_out), which the graph must agree with."""

    rank: int
    scale: float
    fan_in_fan_out: bool = False


class Site(NamedTuple):
    """A product that reads a targeted weight: its node, the ref of its input rows x, and its in / out sizes."""

    node: str
    x: Any
    fan_in: int
    fan_out: int
    stored_in_out: bool  # the weight is read as stored [in, out] (no transpose): a Conv1D


def product_sites(graph: Graph, modules: list[str] | set[str]) -> dict[str, list[Site]]:
    """The products reading each module's weight (`{module}.weight`, by state_dict name). LoraPathError for a module
    whose weight is not in the graph, or is read by anything but a product of the module docstring's forms."""
    weights = _weight_values(graph, modules)
    missing = sorted(set(modules) - set(weights))
    if missing:
        raise LoraPathError(f"LoRA targets {missing} have no `.weight` parameter in this graph (its inputs hold "
                            f"{_some_weights(graph)}); check the module names")
    readers = _readers(graph)
    metas = value_metas(graph)
    sites: dict[str, list[Site]] = {}
    for module, values in weights.items():
        found = []
        stack = list(values)
        while stack:
            value = stack.pop()
            for node, position in readers.get(value, []):
                site = _site(node, position, metas)
                if site is not None:
                    found.append(site)
                elif node.op in DEQUANTIZE and position == 0:
                    stack.append(node.name)  # the node is the weight itself
                elif node.op == PERMUTE and position == 0 and _transposes(node):
                    found += [_transposed_site(module, node, user, where, metas) for user, where in readers.get(node.name, [])]
                else:
                    raise LoraPathError(_unsupported(module, node, position))
        if not found:
            raise LoraPathError(f"LoRA target {module}: its weight is read by no matrix product in this graph")
        sites[module] = found
    return sites


def with_lora_paths(graph: Graph, targets: Mapping[str, LoraTarget | tuple], per_row: int | None = None) -> Graph:
    """`graph` with a LoRA side path after every product of each target's weight (see the module docstring).

    targets: {module name (state_dict name less `.weight`): LoraTarget(rank, scale, fan_in_fan_out)}.
    per_row: None for one adapter shared by every row; n for n stacked adapters ([n, r, in] / [n, out, r] params) and a
    new keyword input `adapter_ids` int32 [batch]: row b of a product's input uses adapter adapter_ids[b] (-1: none),
    the rows of a flattened [batch * seq, in] product mapped to batch rows by position (batch is the graph's first
    input's leading dim)."""
    targets = {module: LoraTarget(*target) for module, target in targets.items()}
    if per_row is not None and (not isinstance(per_row, int) or isinstance(per_row, bool) or per_row < 1):
        raise LoraPathError(f"per_row must be None or a number of adapters >= 1, got {per_row!r}")
    names = {i.name for i in graph.inputs} | {n.name for n in graph.nodes}
    sites = product_sites(graph, list(targets))
    inputs = list(graph.inputs)
    ids_ref = _add_adapter_ids(graph, inputs, names) if per_row is not None else None
    graph_spec = _with_ids_spec(graph.in_spec) if per_row is not None else graph.in_spec
    added: dict[str, list[list]] = {}  # product node -> the arguments of each side path after it (less the base)
    renamed: dict[str, str] = {}
    for module, target in targets.items():
        found = sites[module]
        _check_layout(module, target, found)
        fan_in, fan_out = found[0].fan_in, found[0].fan_out
        lead = [per_row] if per_row is not None else []
        a = _new_name(f"p_{module.replace('.', '_')}_lora_A", names)
        b = _new_name(f"p_{module.replace('.', '_')}_lora_B", names)
        inputs += [GraphInput(a, "parameter", TensorMeta("float32", [*lead, target.rank, fan_in]), f"{module}.lora_A"),
                   GraphInput(b, "parameter", TensorMeta("float32", [*lead, fan_out, target.rank]), f"{module}.lora_B")]
        for site in found:
            if site.fan_in != fan_in or site.fan_out != fan_out:
                raise LoraPathError(f"LoRA target {module}: its products disagree on the weight's size "
                                    f"({site.fan_in} -> {site.fan_out} at {site.node}, {fan_in} -> {fan_out} elsewhere)")
            renamed.setdefault(site.node, _new_name(f"{site.node}__lora_base", names))
            side = [site.x, {"ref": a}, {"ref": b}, float(target.scale)] + ([{"ref": ids_ref}] if ids_ref else [])
            added.setdefault(site.node, []).append(side)
    nodes = []
    for node in graph.nodes:
        if node.name not in added:
            nodes.append(node)
            continue
        # the product under a new name, then its side path under the product's name, so every reader reads the sum
        nodes.append(dataclasses.replace(node, name=renamed[node.name]))
        previous, paths = renamed[node.name], added[node.name]  # one path per product in every graph met so far
        for i, side in enumerate(paths):
            name = node.name if i == len(paths) - 1 else _new_name(f"{node.name}__lora{i}", names)
            nodes.append(Node(name, LORA, [{"ref": previous}, *side], {}, node.meta, node.source))
            previous = name
    return dataclasses.replace(graph, inputs=inputs, nodes=nodes, in_spec=graph_spec)


def recompute_quantized_products(graph: Graph) -> Graph:
    """Every product over a quantized weight's stored form wrapped in `torch2jax.recomputed` (ops/lora.py): its
    dequantized weight remade in the backward pass, not kept from the forward one. For training adapters on a quantized
    base, where autodiff would otherwise hold a float copy of every quantized weight (the base's size in float) from
    the forward pass to the backward one. No change to the values."""
    nodes = [Node(n.name, RECOMPUTED, [n.op, *n.args], {}, n.meta, n.source) if n.op in QUANTIZED_LINEARS and not n.kwargs
             else n for n in graph.nodes]
    return dataclasses.replace(graph, nodes=nodes)


def _weight_values(graph: Graph, modules: list[str] | set[str]) -> dict[str, list[str]]:
    """{module: the names of the param inputs that hold its weight} (a quantized weight's stored values included)."""
    wanted = {f"{m}.weight": m for m in modules}
    found: dict[str, list[str]] = {}
    for inp in graph.inputs:
        target = graph.aliases.get(inp.target, inp.target) if inp.target else None
        if inp.kind in PARAM_KINDS and target in wanted:
            found.setdefault(wanted[target], []).append(inp.name)
    return found


def _some_weights(graph: Graph) -> str:
    weights = [i.target for i in graph.inputs if i.kind in PARAM_KINDS and (i.target or "").endswith(".weight")]
    return ", ".join(weights[:4]) + (", ..." if len(weights) > 4 else "") if weights else "no `.weight` at all"


def _readers(graph: Graph) -> dict[str, list[tuple[Node, int]]]:
    """{value: [(node, argument position)]} for every node argument that refers to a value (nested refs as -1)."""
    readers: dict[str, list[tuple[Node, int]]] = {}
    for node in graph.nodes:
        for position, arg in enumerate(node.args):
            if isinstance(arg, dict) and set(arg) == {"ref"}:
                readers.setdefault(arg["ref"], []).append((node, position))
            else:
                for ref in _nested_refs(arg):
                    readers.setdefault(ref, []).append((node, -1))
        for value in node.kwargs.values():
            for ref in _nested_refs(value):
                readers.setdefault(ref, []).append((node, -1))
    for out in graph.outputs:
        for ref in _nested_refs(out.value):
            readers.setdefault(ref, []).append((Node("<graph output>", "output", [], {}, None), -1))
    return readers


def _nested_refs(value: Any):
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            yield value["ref"]
        else:
            for item in value.values():
                yield from _nested_refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _nested_refs(item)


def _transposes(node: Node) -> bool:
    return len(node.args) == 2 and isinstance(node.args[1], list) and [d % 2 for d in node.args[1]] == [1, 0]


def _site(node: Node, position: int, metas: dict) -> Site | None:
    """The product `node` is when it reads the weight itself at `position`: Linear forms [out, in], Conv1D [in, out]."""
    if node.op == LINEAR or node.op in QUANTIZED_LINEARS:
        if position == 1 and not node.kwargs:
            return _make_site(node, node.args[0], metas, stored_in_out=False)
    elif node.op in (MM, ADDMM) and position == _RHS[node.op] and _default_scales(node):
        return _make_site(node, node.args[position - 1], metas, stored_in_out=True)
    return None


def _transposed_site(module: str, transpose: Node, node: Node, position: int, metas: dict) -> Site:
    if node.op in _RHS and position == _RHS[node.op] and _default_scales(node):
        site = _make_site(node, node.args[position - 1], metas, stored_in_out=False)
        if site is not None:
            return site
    raise LoraPathError(_unsupported(module, node, position, f" (the weight transposed by {transpose.name})"))


def _default_scales(node: Node) -> bool:
    return set(node.kwargs) <= {"beta", "alpha"} and all(v == 1 for v in node.kwargs.values())


def _make_site(node: Node, x: Any, metas: dict, stored_in_out: bool) -> Site | None:
    shape = getattr(metas.get(x.get("ref")) if isinstance(x, dict) else None, "shape", None)
    out = getattr(node.meta, "shape", None)
    if not shape or not out or not isinstance(shape[-1], int) or not isinstance(out[-1], int):
        return None
    return Site(node.name, x, shape[-1], out[-1], stored_in_out)


def _unsupported(module: str, node: Node, position: int, via: str = "") -> str:
    where = f" (argument {position})" if position >= 0 else ""
    source = f", at {node.source.strip().splitlines()[-1].strip()}" if node.source else ""
    return (f"LoRA target {module}: its weight {module}.weight is read by {node.op} (node {node.name}){where}{via}"
            f"{source}, which is not a matrix product the LoRA side path supports (a Linear's mm / addmm / matmul of the "
            "transposed weight, torch2jax.linear, a Conv1D's addmm, or a quantized Linear); drop the module from the "
            "targets (a tied or embedding weight cannot be adapted this way)")


def _check_layout(module: str, target: LoraTarget, sites: list[Site]) -> None:
    """The adapter's fan_in_fan_out must say what the graph does with the weight: PEFT reads the flag, so an adapter
    trained with the other one would mean another update on a square weight."""
    for site in sites:
        if site.stored_in_out != target.fan_in_fan_out:
            stored = "as stored, [in, out] (a Conv1D)" if site.stored_in_out else "transposed, as an nn.Linear's [out, in]"
            raise LoraPathError(f"LoRA target {module}: the graph reads its weight {stored} at {site.node}, but the "
                                f"adapter says fan_in_fan_out={target.fan_in_fan_out}; set fan_in_fan_out="
                                f"{site.stored_in_out} in the LoRA config")


def _new_name(base: str, taken: set[str]) -> str:
    name, i = base, 1
    while name in taken:
        name, i = f"{base}_{i}", i + 1
    taken.add(name)
    return name


def _add_adapter_ids(graph: Graph, inputs: list[GraphInput], names: set[str]) -> str:
    """Append the `adapter_ids` user input ([batch] int32, batch the first input's leading dim); its name."""
    users = [i for i in graph.user_inputs if i.meta is not None and i.meta.shape]
    if not users:
        raise LoraPathError("per-row adapters need a batch: this graph has no tensor input with a leading dim")
    if any(i.name == ADAPTER_IDS for i in graph.inputs):
        raise LoraPathError(f"this graph already has an input named {ADAPTER_IDS!r}")
    names.add(ADAPTER_IDS)
    inputs.append(GraphInput(ADAPTER_IDS, "user_input", TensorMeta("int32", [users[0].meta.shape[0]])))
    return ADAPTER_IDS


def _with_ids_spec(spec: dict) -> dict:
    """The (args, kwargs) input spec with `adapter_ids` as the last keyword input (the last leaf, as appended)."""
    children = spec.get("children", [])
    if spec.get("type") != "tuple" or len(children) != 2 or children[1].get("type") != "dict":
        raise LoraPathError("per-row adapters need a graph whose inputs are (args, kwargs), as converted models' are")
    kwargs = children[1]
    if ADAPTER_IDS in kwargs.get("keys", []):
        raise LoraPathError(f"this graph already takes a keyword input {ADAPTER_IDS!r}")
    new_kwargs = {**kwargs, "keys": [*kwargs.get("keys", []), ADAPTER_IDS],
                  "children": [*kwargs.get("children", []), {"type": "leaf"}]}
    return {**spec, "children": [children[0], new_kwargs]}
