"""A deep stack of alike layers, traced at three layers and repeated: torch.export's cost grows with every
layer it traces (most of a large model's conversion), while the graph of layer 5 is layer 4's with other names.

`repeat_layers` builds the graph of an N-unit model from the graph of the same model cut to 3 units (a unit
is one layer, or a block of p layers where layer kinds alternate): the first and the last unit as traced,
the middle one repeated N - 2 times, its inputs (params, cache) renamed per unit. Whoever uses it must show
that the result is right for this model; `first_difference` compares a repeated graph with a traced one,
e.g. 3 units repeated to 4 against 4 traced, so a model whose layers or surroundings are not alike is caught
and traced whole instead.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from ...capture.converter import StageTimer
from ...capture.fx import Captured, state_tensors
from ...ir.graph import Graph, GraphInput, GraphOutput, Node, iter_refs

TRACED_UNITS = 3  # first, middle (the one repeated), last: a unit is a layer, or a block of alternating layers

RenameInput = Callable[[GraphInput, int, int], GraphInput]  # (input of unit src, src, dst) -> input of unit dst


SIZE_READS = ("aten.sym_size.int",)  # ops that read an input's shape, not its values


class NotRepeatable(Exception):
    """The graph does not have the shape `repeat_layers` needs; the message says where."""


class UserInputs(Protocol):
    """How a step names its own inputs that belong to a layer (a KV cache's per-layer tensors)."""

    def layer(self, input_name: str) -> int | None: ...

    def renamed(self, input_name: str, shift: int) -> str: ...


def capture_repeated(module: torch.nn.Module, layers: int, min_units: int, timer: StageTimer, *,
                     trace: Callable[[int, str], tuple[Captured, Any]], with_specs: Callable[[Graph, int], Graph],
                     layer_state: Sequence[Any], state: Callable[[], dict], user_inputs: UserInputs) -> Captured:
    """The captured step of `module` with all `layers` layers, built from traces of 3 and 4 units.

    `trace(n, what)` traces the step of `module` as it is (cut to n layers while called) -> (Captured, program);
    `with_specs(graph, n)` gives a graph the step's input/output structure for n layers; `layer_state[i]` is what
    layer i's own step inputs look like (their shapes: they must repeat with the unit); `state()` the step's
    params and buffers by name. Raises NotRepeatable where the model is not shown to repeat."""
    stack, size = repeat_unit(module, layers, min_units)
    if any(layer_state[i] != layer_state[i % size] for i in range(layers)):
        raise NotRepeatable("the layers' caches differ in shape")
    traced = {}
    for units in (TRACED_UNITS, TRACED_UNITS + 1):
        with cut_to(module, stack, units * size):
            captured, ep = trace(units * size, f" of {units * size} of the {layers} layers")
        layer_of = layer_of_nodes(ep.graph_module, stack) | layer_of_inputs(captured.graph, stack, user_inputs.layer)
        traced[units] = captured, ep, {name: layer // size for name, layer in layer_of.items()}
    captured, ep, unit_of = traced[TRACED_UNITS]
    rename = _input_renamer(stack, size, user_inputs)
    more = TRACED_UNITS + 1
    unit = "layer" if size == 1 else f"block of {size} layers"
    with timer.stage("repeat", f"repeat a middle {unit} for layers {size} to {layers - size - 1}, first checking that "
                               f"{TRACED_UNITS * size} layers repeated to {more * size} equal {more * size} traced"):
        check = with_specs(repeat_layers(captured.graph, unit_of, more, rename), more * size)
        difference = first_difference(check, traced[more][0].graph)
        if difference:
            raise NotRepeatable(f"{TRACED_UNITS * size} layers repeated to {more * size} differ from {more * size} traced: "
                                f"{difference}")
        graph = with_specs(repeat_layers(captured.graph, unit_of, layers // size, rename), layers)
        tensors, graph.aliases = state_tensors(graph, state(), ep.constants)
    return Captured(graph, tensors, captured.schemas)


def repeat_unit(module: torch.nn.Module, layers: int, min_units: int) -> tuple[str, int]:
    """(the layer stack's dotted name, the layers per repeated unit) of a model whose stack is at least `min_units`
    units that repeat; raises NotRepeatable otherwise."""
    stack = layer_stack(module, layers)
    size = period(module.get_submodule(stack), layers // min_units)
    if layers % size:
        raise NotRepeatable(f"{layers} layers are not a whole number of {size}-layer blocks")
    return stack, size


def _input_renamer(stack: str, size: int, user_inputs: UserInputs) -> RenameInput:
    """How an input of unit `src` is named in unit `dst` (units of `size` layers): `model.layers.3.mlp.up_proj.weight`
    (placeholder `p_model_layers_3_mlp_up_proj_weight`) as torch.export names params, the step's own inputs as told."""
    flat = stack.replace(".", "_")
    pattern = re.compile(re.escape(stack) + r"\.(\d+)\.")

    def rename(inp: GraphInput, src: int, dst: int) -> GraphInput:
        shift = size * (dst - src)
        if inp.kind == "user_input":
            return GraphInput(user_inputs.renamed(inp.name, shift), inp.kind, inp.meta, inp.target)
        layer = int(pattern.match(inp.target or "").group(1))
        target = f"{stack}.{layer + shift}." + inp.target[len(f"{stack}.{layer}."):]
        name = inp.name.replace(f"_{flat}_{layer}_", f"_{flat}_{layer + shift}_", 1)
        return GraphInput(name, inp.kind, inp.meta, target)

    return rename


def layer_of_nodes(graph_module: torch.fx.GraphModule, prefix: str) -> dict[str, int]:
    """The layer each FX call node belongs to, from the module stack torch.export records: a node inside
    module `{prefix}.{i}` (e.g. `model.layers.3.self_attn`) is in layer i."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)(\.|$)")
    found = {}
    for node in graph_module.graph.nodes:
        for path, _ in (node.meta.get("nn_module_stack") or {}).values():
            match = pattern.match(str(path))
            if match:
                found[node.name] = int(match.group(1))
                break
    return found


def layer_of_inputs(graph: Graph, prefix: str, user_input_layer: Callable[[str], int | None]) -> dict[str, int]:
    """The layer each input belongs to: params and buffers by their state_dict name, user inputs as told."""
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
    found = {}
    for inp in graph.inputs:
        if inp.kind == "user_input":
            layer = user_input_layer(inp.name)
        else:
            match = pattern.match(inp.target or "")
            layer = int(match.group(1)) if match else None
        if layer is not None:
            found[inp.name] = layer
    return found


def repeat_layers(graph: Graph, layer_of: dict[str, int], layers: int, rename_input: RenameInput) -> Graph:
    """The graph of `graph`'s model with `layers` layers instead of TRACED_UNITS (see the module docstring).

    `layer_of` gives the layer of every input and node inside a layer; everything else runs before the first
    layer or after the last. Raises NotRepeatable where the graph is not a stack the rule fits."""
    if graph.subgraphs:
        raise NotRepeatable("the graph has control flow (subgraphs)")
    if layers < TRACED_UNITS:
        raise NotRepeatable(f"{layers} layers: fewer than the {TRACED_UNITS} traced")
    first, middle, last = range(TRACED_UNITS)
    graph = one_node_per_size(graph)
    layer_of = _hoist_shared_scalars(graph, layer_of)
    members: dict[int, list[str]] = {i: [] for i in range(TRACED_UNITS)}
    for name in [i.name for i in graph.inputs] + [n.name for n in graph.nodes]:
        if name in layer_of:
            if layer_of[name] not in members:
                raise NotRepeatable(f"{name} is in layer {layer_of[name]} of a {TRACED_UNITS}-layer graph")
            members[layer_of[name]].append(name)
    if len(members[first]) != len(members[middle]):
        raise NotRepeatable(f"layer 0 has {len(members[first])} values and layer 1 {len(members[middle])}")
    position = {name: p for names in members.values() for p, name in enumerate(names)}
    after = _after_layers(graph, layer_of)

    copies = {middle: range(1, layers - 1), first: range(0, 1), last: range(layers - 1, layers)}
    renamed: dict[tuple[str, int], str] = {}  # (traced name, output layer) -> name in the result
    inputs_by_name = {i.name: i for i in graph.inputs}

    def name_in(name: str, layer: int) -> str:
        source = layer_of[name]
        if source == middle and layer != 1 and name not in inputs_by_name:
            return f"{name}_layer{layer}"
        if name in inputs_by_name and layer != source:
            return rename_input(inputs_by_name[name], source, layer).name
        return name

    for name, source in layer_of.items():
        for layer in copies[source]:
            renamed[name, layer] = name_in(name, layer)

    def resolve(ref: str, source: int | None, layer: int | None, shape_only: bool = False) -> str:
        """Where a value read by an item of traced layer `source`, written out as layer `layer`, lives."""
        home = layer_of.get(ref)
        if home is None:
            if ref in after and source is not None:
                raise NotRepeatable(f"layer {source} reads {ref}, which runs after a layer but in none")
            return ref
        if source is None and shape_only:  # a size read before the layers, from an input of one
            return renamed[ref, copies[home][0]]
        if source is None:  # after the layers: it may read the last layer only
            if home != last:
                raise NotRepeatable(f"{ref} of layer {home} is read after the layers")
            return renamed[ref, layers - 1]
        if home == source:
            return renamed[ref, layer]
        if home != source - 1:
            raise NotRepeatable(f"layer {source} reads {ref} of layer {home}, not of the layer before it")
        if source == middle and layer > 1:  # the layer before is itself a copy of the middle one
            return renamed[members[middle][position[ref]], layer - 1]
        return renamed[ref, layer - 1]

    inputs = [i if layer is None or layer == layer_of[i.name] else rename_input(i, layer_of[i.name], layer)
              for i, layer in _expand(graph.inputs, lambda i: layer_of.get(i.name), copies)]
    nodes = [_rewrite_node(n, layer_of.get(n.name), layer, resolve, name_in)
             for n, layer in _expand(graph.nodes, lambda n: layer_of.get(n.name), copies)]
    outputs = []
    for out, layer in _expand(graph.outputs, lambda o: _output_layer(o, layer_of), copies):
        source = _output_layer(out, layer_of)
        outputs.append(GraphOutput(out.kind, _rewrite(out.value, lambda r, s=source, x=layer: resolve(r, s, x)), out.target))
    names = [i.name for i in inputs] + [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise NotRepeatable("renaming the repeated layers made two values of one name")
    return Graph(inputs, nodes, outputs, dict(graph.in_spec), dict(graph.out_spec), dict(graph.symbols),
                 dict(graph.aliases))


def one_node_per_size(graph: Graph) -> Graph:
    """The graph with each symbolic size computed once: torch.export reads `batch` from whichever input it
    meets (one read per cache input, each layer using its own), so the reads multiply with the layers while
    the program does not. A scalar node whose expression an earlier one has is replaced by that one."""
    first: dict[str, str] = {}
    same: dict[str, str] = {}
    for node in graph.nodes:
        if isinstance(node.meta, dict) and isinstance(node.meta.get("sym"), str):
            kept = first.setdefault(node.meta["sym"], node.name)
            if kept != node.name:
                same[node.name] = kept
    if not same:
        return graph

    def ref(r: str) -> str:
        return same.get(r, r)

    nodes = [_reading(n, ref) for n in graph.nodes if n.name not in same]
    outputs = [GraphOutput(o.kind, _rewrite(o.value, ref), o.target) for o in graph.outputs]
    return dataclasses.replace(graph, nodes=nodes, outputs=outputs)


def _hoist_shared_scalars(graph: Graph, layer_of: dict[str, int]) -> dict[str, int]:
    """Size arithmetic the first layer did for all (torch traces `batch * tokens` once and every layer reads
    that node) belongs before the layers: a scalar node that reads no layer's value leaves its layer."""
    layer_of = dict(layer_of)
    for node in graph.nodes:
        is_scalar = isinstance(node.meta, dict) and "sym" in node.meta
        if node.name in layer_of and is_scalar and not any(r in layer_of for r in iter_refs([node.args, node.kwargs])):
            del layer_of[node.name]
    return layer_of


def _expand(items: list, layer: Callable[[Any], int | None], copies: dict[int, range]) -> Iterator[tuple[Any, int | None]]:
    """Each item with the layer it is written out as: a run of the middle layer's items once per copy."""
    run: list = []
    for item in items + [None]:
        if item is not None and layer(item) == 1:
            run.append(item)
            continue
        for target in (copies[1] if run else ()):
            yield from ((x, target) for x in run)
        run = []
        if item is not None:
            source = layer(item)
            yield item, (None if source is None else copies[source][0])


def _after_layers(graph: Graph, layer_of: dict[str, int]) -> set[str]:
    """Nodes in no layer that read a layer's value (directly or not): the model's tail, e.g. the final norm."""
    after: set[str] = set()
    for node in graph.nodes:
        if node.name in layer_of or node.op in SIZE_READS:
            continue
        if any(r in layer_of or r in after for r in iter_refs([node.args, node.kwargs])):
            after.add(node.name)
    return after


def _output_layer(out: GraphOutput, layer_of: dict[str, int]) -> int | None:
    layers = {layer_of[r] for r in iter_refs(out.value) if r in layer_of}
    return layers.pop() if len(layers) == 1 else None


def _rewrite_node(node: Node, source: int | None, layer: int | None, resolve, name_in) -> Node:
    def ref(r: str) -> str:
        return resolve(r, source, layer, node.op in SIZE_READS)

    return _reading(node, ref, node.name if source is None else name_in(node.name, layer))


def _reading(node: Node, ref: Callable[[str], str], name: str | None = None) -> Node:
    """The node (renamed to `name`) reading `ref(r)` wherever it read r."""
    return Node(name or node.name, node.op, _rewrite(node.args, ref), _rewrite(node.kwargs, ref), node.meta, node.source)


def _rewrite(value: Any, ref: Callable[[str], str]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            return {"ref": ref(value["ref"])}
        return {k: _rewrite(v, ref) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, ref) for v in value]
    return value


def first_difference(a: Graph, b: Graph) -> str | None:
    """None when the two graphs compute the same thing the same way (node names and repeated size reads aside),
    else where they part."""
    a, b = one_node_per_size(a), one_node_per_size(b)
    if len(a.inputs) != len(b.inputs):
        return f"{len(a.inputs)} inputs against {len(b.inputs)}"
    for x, y in zip(a.inputs, b.inputs):
        if x.to_json() != y.to_json():
            return f"input {x.name} against {y.name}"
    if len(a.nodes) != len(b.nodes):
        return f"{len(a.nodes)} nodes against {len(b.nodes)}"
    index_a, index_b = _node_index(a), _node_index(b)
    for x, y in zip(a.nodes, b.nodes):
        if _canonical(x, index_a) != _canonical(y, index_b):
            return f"node {x.name} ({x.op}) against {y.name} ({y.op})"
    outs_a = [(o.kind, _rewrite(o.value, lambda r: index_a.get(r, r)), o.target) for o in a.outputs]
    outs_b = [(o.kind, _rewrite(o.value, lambda r: index_b.get(r, r)), o.target) for o in b.outputs]
    if outs_a != outs_b:
        return "the outputs"
    for field in ("in_spec", "out_spec", "symbols", "aliases"):
        if getattr(a, field) != getattr(b, field):
            return f"the graphs' {field}"
    return None


def _node_index(graph: Graph) -> dict[str, str]:
    return {n.name: f"#{i}" for i, n in enumerate(graph.nodes)}


def _canonical(node: Node, index: dict[str, str]) -> tuple:
    def ref(r: str) -> str:
        return index.get(r, r)

    meta = node.to_json()["meta"]
    return node.op, _rewrite(node.args, ref), _rewrite(node.kwargs, ref), meta


def layer_stack(module: torch.nn.Module, layers: int) -> str:
    """The dotted name of the module's one ModuleList of `layers` layers of one class (e.g. `model.layers`)."""
    found = [name for name, m in module.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == layers
             and len({type(layer) for layer in m}) == 1]
    if len(found) != 1:
        raise NotRepeatable(f"{len(found)} lists of {layers} alike layers in {type(module).__name__}, not one")
    return found[0]


def period(stack: torch.nn.ModuleList, longest: int) -> int:
    """The fewest layers p (at most `longest`) such that every layer is built like the one p before it: 1 for a
    plain stack, 2 for alternating sliding and full attention. Built alike means the same submodules, params,
    buffers and settings (a sliding window, an MoE block); only `layer_idx` may differ. A layer whose forward reads
    its index for anything but the cache would pass this check; comparing 3 repeated to 4 traced is the other guard."""
    builds = [_build(layer) for layer in stack]
    for size in range(1, max(longest, 0) + 1):
        if all(_same(builds[i], builds[i % size]) for i in range(len(builds))):
            return size
    unlike = next((i for i in range(len(builds)) if not _same(builds[i], builds[1 % len(builds)])), 0)
    patterns = f", and no pattern of up to {longest} layers repeats" if longest > 1 else ""
    raise NotRepeatable(f"layer {unlike} is not built like layer 1{patterns}")


def _build(module: torch.nn.Module) -> list:
    out = []
    for name, m in module.named_modules():
        settings = {k: v for k, v in vars(m).items() if not k.startswith("_") and k not in ("layer_idx", "training")}
        params = [(n, tuple(p.shape), p.dtype) for n, p in m.named_parameters(recurse=False)]
        buffers = [(n, tuple(b.shape), b.dtype) for n, b in m.named_buffers(recurse=False)]
        out.append((name, type(m), params, buffers, settings))
    return out


def _same(a: Any, b: Any, depth: int = 0) -> bool:
    """Equal settings: by ==, else (objects that compare by identity, e.g. a functools.partial activation)
    the same type with the same attributes, a few levels deep."""
    if a is b:
        return True
    if type(a) is not type(b) or depth > 6:
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], depth + 1) for k in a)
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())
    if isinstance(a, functools.partial):
        return _same((a.func, a.args, a.keywords), (b.func, b.args, b.keywords), depth + 1)
    try:
        if bool(a == b):
            return True
    except Exception:  # noqa: S110 - no usable ==: compare attributes below
        pass
    state = getattr(a, "__dict__", None)
    return state is not None and _same(state, getattr(b, "__dict__", None), depth + 1)


@contextmanager
def cut_to(module: torch.nn.Module, stack: str, layers: int) -> Iterator[None]:
    """The module with only the first `layers` layers of `stack`, and its config saying so, while inside."""
    parent_name, _, attr = stack.rpartition(".")
    parent = module.get_submodule(parent_name)
    full = getattr(parent, attr)
    config = getattr(module, "config", None)
    saved = {key: getattr(config, key) for key in ("num_hidden_layers", "layer_types") if hasattr(config, key)}
    setattr(parent, attr, torch.nn.ModuleList(list(full)[:layers]))
    try:
        if "num_hidden_layers" in saved:
            config.num_hidden_layers = layers
        if saved.get("layer_types") is not None:
            config.layer_types = list(saved["layer_types"])[:layers]
        yield
    finally:
        setattr(parent, attr, full)
        for key, value in saved.items():
            setattr(config, key, value)
