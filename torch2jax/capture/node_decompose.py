"""Decomposition to core ATen one node at a time, where the exported program needs nothing more.

`ExportedProgram.run_decompositions` retraces the whole program through functionalization to decompose
a few dozen high-level ops (`linear`, `layer_norm`, `dropout`, `to`, ...): a third of a small model's
conversion time, and more on a large one. When the program mutates nothing, holds only ATen ops and has
static shapes, that retrace has nothing to functionalize, so each op to decompose is traced alone (on
fake tensors of its inputs' shapes, through torch's own decomposition table) and its core ATen graph put in
its place; identical ops on identical shapes (a model's repeated layers) are traced once. Any program this
cannot handle exactly is left to the whole retrace (`decompose_nodes` returns None before changing it).
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.node import map_arg

_Node = torch.fx.Node


def decompose_nodes(ep: torch.export.ExportedProgram, table: Mapping, to_decompose: Callable[[Any], bool]
                    ) -> torch.export.ExportedProgram | None:
    """A copy of `ep` with every node whose op `to_decompose` selects replaced by its decomposition (through
    `table`); None when the program needs torch's whole retrace. `ep` itself is left as it is."""
    signature = ep.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        return None
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    # the program's own fake mode: new nodes' values must come from the mode its other values come from
    mode = detect_fake_mode([n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]) or FakeTensorMode()
    graph = copy.deepcopy(ep.graph)  # the nodes, not the weights: those are the program's inputs
    if not _traceable(graph):
        return None
    traced: dict[str, torch.fx.GraphModule | None] = {}
    # High-level ops first: their schemas do not say when they return an input (type_as, to), core ATen's do, so
    # in-place ops are judged on the decomposed graph; their out-of-place twins may need decomposing in turn.
    if not _decompose_ops(graph, table, to_decompose, mode, traced):
        return None
    if not _in_place_ops_made_functional(graph, mode) or not _nothing_mutated(graph):
        return None
    if not _decompose_ops(graph, table, to_decompose, mode, traced):
        return None
    graph.eliminate_dead_code()
    return ep._update(torch.fx.GraphModule(ep.graph_module, graph), _outputs_renamed(ep.graph_signature, graph))


def _decompose_ops(graph: torch.fx.Graph, table: Mapping, to_decompose: Callable[[Any], bool], mode: Any,
                   traced: dict[str, torch.fx.GraphModule | None]) -> bool:
    """Splice the decomposition of every functional node `to_decompose` selects; False where one cannot be traced."""
    for node in list(graph.nodes):
        if (node.op != "call_function" or node.target is operator.getitem or node.target._schema.is_mutable
                or not to_decompose(node.target)):
            continue
        key = _signature(node)
        if key not in traced:
            traced[key] = _trace_alone(node, table, mode)
        sub = traced[key]
        if sub is None:
            return False
        output = next(iter(sub.graph.find_nodes(op="output"))).args[0]
        if isinstance(output, (list, tuple)) and not all(u.target is operator.getitem for u in node.users):
            return False  # a tuple result read whole: only its items can be rewired
        _splice(graph, node, sub)
    return True


def _outputs_renamed(signature: Any, graph: torch.fx.Graph) -> Any:
    """The signature with each output named after the node that now computes it (a rewritten node's name changed)."""
    from torch.export.graph_signature import ExportGraphSignature, OutputSpec, TensorArgument

    values = next(iter(graph.find_nodes(op="output"))).args[0]
    specs = []
    for spec, value in zip(signature.output_specs, values, strict=True):
        if isinstance(spec.arg, TensorArgument) and isinstance(value, _Node):
            spec = OutputSpec(kind=spec.kind, arg=TensorArgument(name=value.name), target=spec.target)
        specs.append(spec)
    return ExportGraphSignature(input_specs=signature.input_specs, output_specs=specs)


def _traceable(graph: torch.fx.Graph) -> bool:
    """ATen ops only (no higher-order op, no module call) and no symbolic shape."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            if not isinstance(node.target, torch._ops.OpOverload):
                return False
        elif node.op in ("call_module", "call_method"):
            return False
        if node.op in ("placeholder", "call_function") and not _static(node.meta.get("val")):
            return False
    return True


def _nothing_mutated(graph: torch.fx.Graph) -> bool:
    return not any(node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
                   and node.target._schema.is_mutable for node in graph.nodes)


def _in_place_ops_made_functional(graph: torch.fx.Graph, mode: Any) -> bool:
    """Rewrite `x.op_(...)` as `y = op(x, ...)`, later readers of `x` reading `y`, where that is exact: `x` is a
    fresh tensor (no view of anything) that nothing views, and `op` gives `x`'s dtype and shape. Run on core ATen
    ops, whose schemas say which results alias an input. False where an in-place op is left that this cannot
    rewrite (then torch's functionalization is needed)."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        functional = _functional_twin(node.target) if node.op == "call_function" else None
        if functional is None:
            continue
        target = node.args[0] if node.args else None
        if not (isinstance(target, _Node) and _fresh(target) and not any(
                user is not node and _aliases(user.target) for user in target.users)):
            return False
        value = target.meta.get("val")
        with mode:
            try:
                result = functional(*map_arg(node.args, lambda a: a.meta["val"]),
                                    **map_arg(node.kwargs, lambda a: a.meta["val"]))
            except Exception:  # noqa: BLE001 - not rewritten; the retrace decides
                return False
        if not (isinstance(value, torch.Tensor) and isinstance(result, torch.Tensor)
                and result.dtype == value.dtype and result.shape == value.shape):
            return False
        with graph.inserting_before(node):
            twin = graph.call_function(functional, node.args, node.kwargs)
        twin.meta = {**node.meta, "val": result}
        order[twin] = order[node]
        node.replace_all_uses_with(twin)
        for user in list(target.users):
            if user is not twin and order[user] > order[node]:
                user.replace_input_with(target, twin)
        graph.erase_node(node)
    return True


def _functional_twin(op: Any) -> Any:
    """aten.add_.Tensor -> aten.add.Tensor: the out-of-place op of an in-place ATen op, or None."""
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.is_mutable:
        return None
    name = op._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_") or op.namespace != "aten":
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    return twin if isinstance(twin, torch._ops.OpOverload) and not twin._schema.is_mutable else None


def _fresh(node: _Node) -> bool:
    """A tensor made by a call that returns new memory (not a view, not a program input)."""
    return (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and not _aliases(node.target) and isinstance(node.meta.get("val"), torch.Tensor))


def _aliases(op: Any) -> bool:
    """Whether an op's result may share memory with an input (a view, or an in-place op's self)."""
    if not isinstance(op, torch._ops.OpOverload):
        return op is not operator.getitem
    return any(ret.alias_info is not None for ret in op._schema.returns)


def _static(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_static(v) for v in value)
    if isinstance(value, torch.Tensor):
        return all(isinstance(s, int) for s in value.shape) and all(isinstance(s, int) for s in value.stride())
    return not isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _signature(node: _Node) -> str:
    """What the traced decomposition depends on: the op, its inputs' shapes, strides and dtypes, and its constants."""
    def meta(arg: _Node) -> tuple:
        value = arg.meta["val"]
        return ("tensor", tuple(value.shape), tuple(value.stride()), value.dtype, value.device.type)

    return repr((str(node.target), map_arg(node.args, meta), map_arg(node.kwargs, meta)))


def _trace_alone(node: _Node, table: Mapping, mode: Any) -> torch.fx.GraphModule | None:
    """The op's core ATen graph, its placeholders the node's tensor inputs in argument order; None when it
    holds anything but functional ATen ops (a constant, a mutation, another decomposition's leftovers)."""
    inputs = _tensor_inputs(node)
    if not all(isinstance(arg.meta.get("val"), torch.Tensor) for arg in inputs):
        return None

    def call(*tensors: torch.Tensor) -> Any:
        values = iter(tensors)
        args, kwargs = map_arg((node.args, node.kwargs), lambda _arg: next(values))
        return node.target(*args, **kwargs)

    # the python dispatcher, as torch's retrace has it: some ops decompose there (native_batch_norm in eval mode
    # to _native_batch_norm_legit_no_training)
    with mode, enable_python_dispatcher():
        fakes = [torch.empty_strided(tuple(arg.meta["val"].shape), tuple(arg.meta["val"].stride()),
                                     dtype=arg.meta["val"].dtype, device=arg.meta["val"].device) for arg in inputs]
        try:
            sub = make_fx(call, decomposition_table=table)(*fakes)
        except Exception:  # noqa: BLE001 - the whole retrace decides, and reports, what this cannot trace
            return None
    for sub_node in sub.graph.nodes:
        if sub_node.op in ("placeholder", "output"):
            continue
        if not _static(sub_node.meta.get("val")):
            return None  # a size read from the data (repeat_interleave by a tensor): the retrace's example path handles it
        if sub_node.op != "call_function" or not (sub_node.target is operator.getitem or (
                isinstance(sub_node.target, torch._ops.OpOverload) and not sub_node.target._schema.is_mutable)):
            return None
    return sub


def _tensor_inputs(node: _Node) -> list[_Node]:
    """The node's input nodes in argument order, repeats kept: the traced decomposition's placeholders."""
    inputs: list[_Node] = []
    map_arg((node.args, node.kwargs), inputs.append)
    return inputs


def _splice(graph: torch.fx.Graph, node: _Node, sub: torch.fx.GraphModule) -> None:
    """Put `sub`'s nodes in `node`'s place, its placeholders bound to `node`'s tensor inputs."""
    env: dict[_Node, Any] = dict(zip(sub.graph.find_nodes(op="placeholder"), _tensor_inputs(node)))
    result: Any = None
    with graph.inserting_before(node):
        for sub_node in sub.graph.nodes:
            if sub_node.op == "output":
                result = map_arg(sub_node.args[0], env.__getitem__)
            elif sub_node.op == "call_function":
                new = graph.call_function(sub_node.target, map_arg(sub_node.args, env.__getitem__),
                                          map_arg(sub_node.kwargs, env.__getitem__))
                new.meta = {**node.meta, "val": sub_node.meta.get("val")}
                env[sub_node] = new
    if isinstance(result, (list, tuple)):
        for user in list(node.users):
            user.replace_all_uses_with(result[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    graph.erase_node(node)

