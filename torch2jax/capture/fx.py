"""Translate torch's ExportedProgram into the portable graph, once (convert half: needs torch).

After this step nothing downstream sees a torch object: ops become names, values become the
encoded forms described in `ir/graph.py`, fake tensors become dtype + shape metadata, torch's
symbolic dims are renamed to the user's dim names.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import ExportError
from ..ir.graph import BAKED_TYPES, Graph, GraphInput, GraphOutput, Node, TensorMeta, encode_float
from . import data_dependent_shapes
from .fx_nodes import op_name, user_frame

_INPUT_KIND = {
    "PARAMETER": "parameter",
    "BUFFER": "buffer",
    "CONSTANT_TENSOR": "constant",
    "USER_INPUT": "user_input",
    "TOKEN": "token",
}
_OUTPUT_KIND = {
    "USER_OUTPUT": "user_output",
    "BUFFER_MUTATION": "buffer_mutation",
    "USER_INPUT_MUTATION": "user_input_mutation",
    "TOKEN": "token",
}


class Captured:
    """The portable graph plus what only torch could tell: params as tensors and op schemas."""

    def __init__(self, graph: Graph, tensors: dict[str, torch.Tensor], schemas: dict[str, str],
                 input_writes: list[str] | None = None):
        self.graph = graph
        self.tensors = tensors
        self.schemas = schemas
        self.input_writes = input_writes or []  # the user inputs forward() writes into, with their lines (dropped)


def capture(ep: torch.export.ExportedProgram, symbol_names: dict[str, str],
            param_renames: dict[str, str] | None = None, fixed: list | None = None,
            example: Callable[[], dict[str, dict[str, Any]]] | None = None, followed_example: bool = False) -> Captured:
    """Build the portable graph of `ep`; `symbol_names` renames torch symbols (s0) to dim names, `param_renames`
    state_dict names (decomposition.subclass_param_names); `fixed` lists the tensor inputs the graph was fixed to
    (specialize.FixedInput), baked in like python values. `example()` gives the values torch left free on the example
    inputs (example_path.example_values); they are taken, and checked at run time, when the graph would otherwise be
    refused for data-dependent shapes or when the export followed the example (`followed_example`): see
    data_dependent_shapes.py."""
    bounds = data_dependent_shapes.bound(ep.graph_module, example, followed_example)
    capturer = _Capturer(symbol_names)
    graph = capturer.graph(ep.graph_module, ep.graph_signature)
    data_dependent_shapes.mark(graph, ep.graph_module, bounds)
    views = _strided_views(ep.graph_module)
    for node in graph.nodes:
        if node.name in views:
            node.op = STRIDED_VIEW
            node.args = [*node.args, *[None] * (4 - len(node.args)), *views[node.name]]
            node.kwargs = {}
    input_writes = _drop_input_mutations(graph)
    call_spec = ep.call_spec  # torch rebuilds it on every access
    graph.in_spec = treespec_to_json(call_spec.in_spec)
    graph.out_spec = treespec_to_json(call_spec.out_spec)
    graph.symbols = _symbol_ranges(ep, symbol_names)
    _bake_python_inputs(graph, ep.graph_module)
    _bake_fixed_inputs(graph, fixed or [])
    tensors, graph.aliases = state_tensors(graph, ep.state_dict, ep.constants)
    if param_renames:
        for inp in graph.inputs:
            inp.target = param_renames.get(inp.target, inp.target)
        tensors = {param_renames.get(name, name): t for name, t in tensors.items()}
        graph.aliases = {param_renames.get(k, k): param_renames.get(v, v) for k, v in graph.aliases.items()}
    return Captured(graph, tensors, capturer.schemas, input_writes)


def input_writes_notice(lines: list[str]) -> str:
    """What a user is told when forward() writes into its inputs (the writes are dropped, the outputs kept)."""
    return ("forward() modifies its input(s) in place:\n" + "\n".join(lines)
            + "\nThe converted function returns the same outputs, but cannot write into its caller's arrays (JAX arrays "
            "are immutable): after a call they keep their values. Returning the new value (x = x + 1 rather than "
            "x.add_(1)), or working on a copy, silences this.")


def _bake_python_inputs(graph: Graph, graph_module: torch.fx.GraphModule) -> None:
    """torch.export specializes the graph on python values passed as inputs (a `use_cache=False` kwarg): record each
    value on its input, so that it is baked in (not an input of the StableHLO) and a call passing another is refused."""
    values = {node.name: node.meta.get("val") for node in graph_module.graph.nodes if node.op == "placeholder"}
    for inp in graph.user_inputs:
        value = values.get(inp.name)
        if inp.meta is None and isinstance(value, BAKED_TYPES):
            inp.baked, inp.value = True, value


def _bake_fixed_inputs(graph: Graph, fixed: list) -> None:
    """Tensor inputs fixed to their example values (capture/specialize.py): the graph reads a constant instead, so
    the input is baked in (its value recorded) and a call passing another value is refused."""
    by_name = {inp.name: inp for inp in graph.user_inputs}
    for f in fixed:
        inp = by_name.get(f.name)
        if inp is None:
            raise ExportError(f"the fixed input {f.name!r} is not among the exported program's inputs ({', '.join(by_name)})")
        inp.baked, inp.value = True, f.values


def capture_graph_module(gm: torch.fx.GraphModule) -> Captured:
    """A bare FX graph as a portable Graph: aot_autograd's forward or backward graph, or one part of it.

    Every placeholder is a user input (a tensor, or a SymInt whose value is static at call time),
    every output a user output (None stays None); tensors the graph reads with `get_attr` (lifted
    constants) become `constant` inputs, returned in `tensors`. Symbolic dims keep torch's names (s0).
    """
    constants: dict[str, torch.Tensor] = {}
    capturer = _Capturer({}, constants)
    graph = capturer.graph(gm, None)
    graph.inputs = [GraphInput(name, "constant", capturer.meta(t), name) for name, t in constants.items()] + graph.inputs
    return Captured(graph, {name: t.detach() for name, t in constants.items()}, capturer.schemas)


# as_strided of an input whose elements are not in row-major order in their storage: its strides and offset are given
STRIDED_VIEW = "torch2jax.as_strided_view.default"


def _strided_views(graph_module: torch.fx.GraphModule) -> dict[str, tuple[list[int], int]]:
    """{as_strided node: (its input's strides, storage offset)} where those are not a fresh row-major buffer's: torch's
    as_strided reads the storage, not the input's elements in order (Longformer's sliding chunks of a transposed
    tensor). Static strides only (others stay as_strided, which reads the input as row-major)."""
    found = {}
    for node in graph_module.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.as_strided.default:
            continue
        value = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            continue
        strides, offset = value.stride(), value.storage_offset()
        if not all(isinstance(d, int) for d in (*value.shape, *strides, offset)):
            continue
        row_major = [math.prod(value.shape[d + 1:]) for d in range(value.ndim)]
        if offset != 0 or any(n != 1 and s != r for n, s, r in zip(value.shape, strides, row_major)):
            found[node.name] = (list(strides), offset)
    return found


def _drop_input_mutations(graph: Graph) -> list[str]:
    """A JAX function cannot write into its caller's arrays: the writes torch.export records on user inputs are
    dropped, and returned as lines naming each input and its line (trace() tells the user). The outputs are
    unaffected (the graph is functional: what reads an input after the write reads the new value). A forward whose
    only effect is such a write is refused."""
    mutations = [o for o in graph.outputs if o.kind == "user_input_mutation"]
    if not mutations:
        return []
    sources = {node.name: node.source for node in graph.nodes}
    lines = []
    for out in mutations:
        ref = out.value.get("ref") if isinstance(out.value, dict) else None
        where = sources.get(ref) or ""
        lines.append(f"  - input {out.target!r}" + (f", at {where.strip().splitlines()[-1].strip()}" if where else ""))
    if not any(o.value is not None for o in graph.user_outputs):
        raise ExportError(
            "forward() returns nothing and modifies its input(s) in place, which a JAX function cannot do to its "
            "caller's arrays:\n" + "\n".join(lines)
            + "\nReturn the new value instead (return x + 1 rather than x.add_(1))."
        )
    graph.outputs = [o for o in graph.outputs if o.kind != "user_input_mutation"]
    return lines


class _Capturer:
    def __init__(self, symbol_names: dict[str, str], constants: dict[str, torch.Tensor] | None = None):
        self.symbol_names = symbol_names
        self.constants = constants  # where a bare graph's get_attr tensors go (None: not accepted)
        self.schemas: dict[str, str] = {}
        self._sym_text: dict[Any, str] = {}  # sympy expression -> its text with dims renamed

    def graph(self, gm: torch.fx.GraphModule, signature) -> Graph:
        kinds = {}
        if signature is not None:
            for spec in signature.input_specs:
                kinds[spec.arg.name] = (_INPUT_KIND.get(spec.kind.name), spec.target)
        inputs, nodes, outputs, subgraphs = [], [], [], {}
        for fx_node in gm.graph.nodes:
            if fx_node.op == "placeholder":
                kind, target = kinds.get(fx_node.name, ("user_input", None))
                if kind is None:
                    raise ExportError(f"input {fx_node.name} has a kind torch2jax does not support (custom objects)")
                meta = self.meta(fx_node.meta.get("val"))
                inputs.append(GraphInput(fx_node.name, kind, meta if isinstance(meta, TensorMeta) else None, target))
            elif fx_node.op == "call_function":
                nodes.append(self.node(fx_node))
            elif fx_node.op == "output":
                values = fx_node.args[0]
                if not isinstance(values, (list, tuple)):  # a subgraph returning one value (a while_loop condition)
                    values = [values]
                specs = signature.output_specs if signature is not None else [None] * len(values)
                for value, spec in zip(values, specs):
                    kind = _OUTPUT_KIND.get(spec.kind.name) if spec is not None else "user_output"
                    if kind is None:
                        raise ExportError(f"output kind {spec.kind.name} is not supported yet")
                    target = spec.target if spec is not None else None
                    outputs.append(GraphOutput(kind, self.encode(value), target))
            elif fx_node.op == "get_attr":
                # the branches and bodies of control-flow ops: captured as subgraphs, all inputs explicit
                module = getattr(gm, fx_node.target)
                if isinstance(module, torch.Tensor) and self.constants is not None:
                    self.constants[fx_node.name] = module
                    continue
                if not isinstance(module, torch.fx.GraphModule):
                    raise ExportError(f"get_attr {fx_node.target} of type {type(module).__name__} is not supported")
                subgraphs[fx_node.name] = self.graph(module, None)
            else:
                raise ExportError(f"unexpected FX node kind {fx_node.op!r} ({fx_node.name})")
        return Graph(inputs, nodes, outputs, subgraphs=subgraphs)

    def node(self, fx_node: torch.fx.Node) -> Node:
        target = fx_node.target
        name = op_name(target)
        schema = getattr(target, "_schema", None)
        if schema is not None:
            self.schemas.setdefault(name, str(schema))
        return Node(
            name=fx_node.name,
            op=name,
            args=[self.encode(a) for a in fx_node.args],
            kwargs={k: self.encode(v) for k, v in fx_node.kwargs.items()},
            meta=self.meta(fx_node.meta.get("val")),
            source=user_frame(fx_node.meta.get("stack_trace")),
        )

    def encode(self, value: Any) -> Any:
        if isinstance(value, torch.fx.Node):
            is_subgraph = value.op == "get_attr" and value.name not in (self.constants or {})
            return {"subgraph": value.name} if is_subgraph else {"ref": value.name}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return encode_float(value)
        if isinstance(value, (list, tuple)):
            return [self.encode(v) for v in value]
        if isinstance(value, torch.dtype):
            return {"dtype": dtype_name(value)}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, torch.layout):
            return {"layout": str(value).removeprefix("torch.")}
        if isinstance(value, torch.memory_format):
            return {"memory_format": str(value).removeprefix("torch.")}
        if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.sym(value)
        if isinstance(value, torch._ops.OpOverload):  # with_effects' op, e.g. aten._linalg_check_errors
            return {"op": op_name(value)}
        raise ExportError(f"cannot represent argument {value!r} of type {type(value).__name__} in the portable graph")

    def meta(self, val: Any) -> Any:
        if isinstance(val, torch.Tensor):
            return TensorMeta(dtype_name(val.dtype), [self.dim(d) for d in val.shape])
        if isinstance(val, (list, tuple)):
            return [self.meta(v) for v in val]
        if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return {"sym": self.sym(val)}
        return None

    def dim(self, d: Any) -> int | str:
        if isinstance(d, int):
            return d
        expr = d.node.expr
        if expr.is_number:
            return int(expr)
        return self.sym(d)

    def sym(self, value: Any) -> str:
        """The expression as text with dims renamed; cached, since sympy's printer is slow and a graph
        repeats a handful of expressions (s0, 8*s0, ...) in nearly every node's shape."""
        expr = value.node.expr if hasattr(value, "node") else value
        text = self._sym_text.get(expr)
        if text is None:
            import sympy

            names = {s: sympy.Symbol(self.symbol_names.get(str(s), str(s))) for s in expr.free_symbols}
            text = self._sym_text[expr] = str(expr.xreplace(names))
        return text


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def treespec_to_json(spec: Any) -> dict:
    """torch's TreeSpec -> the project's JSON spec; dataclass-like model outputs become dicts."""
    if spec.is_leaf():
        return {"type": "leaf"}
    children = [treespec_to_json(c) for c in spec.children()]
    kind = spec.type
    if kind is type(None):
        return {"type": "none"}
    if kind is tuple or kind is torch.Size:
        return {"type": "tuple", "children": children}
    if kind is list:
        return {"type": "list", "children": children}
    if kind is dict or (isinstance(kind, type) and issubclass(kind, dict)):
        keys = list(spec.context) if spec.context is not None else []
        if isinstance(spec.context, (list, tuple)) and len(spec.context) == 2 and kind is not dict:
            keys = list(spec.context[1]) if isinstance(spec.context[1], (list, tuple)) else keys
        return {"type": "dict", "keys": _json_keys(keys), "children": children}
    if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return {"type": "dict", "keys": list(kind._fields), "children": children}
    if isinstance(kind, type) and issubclass(kind, tuple):  # torch.return_types (values, indices), ...
        return {"type": "tuple", "children": children}
    fields = _context_keys(spec.context)
    if fields is not None and len(fields) == len(children):
        return {"type": "dict", "keys": fields, "children": children}
    raise ExportError(
        f"the model returns or takes a {kind.__name__}, which torch2jax cannot describe; "
        "return tensors in tuples, lists or dicts"
    )


def _context_keys(context: Any) -> list | None:
    if isinstance(context, (list, tuple)) and all(isinstance(k, str) for k in context):
        return list(context)
    if isinstance(context, (list, tuple)) and context and isinstance(context[-1], (list, tuple)):
        return _context_keys(context[-1])
    return None


def _json_keys(keys: list) -> list:
    for key in keys:
        if not isinstance(key, (str, int)) or isinstance(key, bool):
            raise ExportError(f"dict key {key!r} cannot be stored; use str or int keys")
    return keys


def _symbol_ranges(ep: torch.export.ExportedProgram, symbol_names: dict[str, str]) -> dict[str, dict]:
    ranges = {}
    for sym, vr in ep.range_constraints.items():
        name = symbol_names.get(str(sym), str(sym))
        if not str(name).isidentifier():
            continue
        ranges[name] = {"min": _finite_int(vr.lower), "max": _finite_int(vr.upper)}
    return ranges


def _finite_int(bound: Any) -> int | None:
    """A range bound as an int; torch's infinities (sympy oo, int_oo) become None."""
    try:
        value = int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return value if abs(value) < 2**62 else None


def state_tensors(graph: Graph, state: dict[str, torch.Tensor],
                  constants: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The graph's params keyed by state_dict name, from `state` (else `constants`); tied weights (same storage,
    shape, strides) kept once, the other names listed as aliases."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for inp in graph.inputs:
        if inp.kind not in ("parameter", "buffer", "constant"):
            continue
        source = constants if inp.kind == "constant" or inp.target not in state else state
        tensor = source[inp.target]
        identity = _storage_identity(tensor)
        if isinstance(tensor, torch.nn.Parameter):
            tensor = tensor.data
        if identity is not None and identity in seen:
            aliases[inp.target] = seen[identity]
            continue
        if identity is not None:
            seen[identity] = inp.target
        tensors[inp.target] = tensor.detach()
    return tensors, aliases


def _storage_identity(tensor: torch.Tensor) -> tuple | None:
    """What makes two state entries one tensor: the same storage and view; for fake (storage-less) params,
    the same Parameter object, as the module ties it (every fake tensor reports data_ptr 0)."""
    if tensor.numel() == 0:
        return None
    if isinstance(tensor, FakeTensor) or isinstance(getattr(tensor, "data", None), FakeTensor):
        return ("object", id(tensor))
    try:
        return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
    except (RuntimeError, NotImplementedError):
        return None

