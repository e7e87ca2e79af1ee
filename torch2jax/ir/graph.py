"""The portable graph: torch2jax's own small, torch-free representation of an exported program.

`capture` builds it once from torch's ExportedProgram; the interpreter and every lowering work
on it alone, and it is saved as `graph.json` in the artifact so a model can be re-lowered later
without PyTorch.

Argument values are kept in an encoded, JSON-ready form:
  None, bool, int, str, float        as themselves (non-finite floats as {"float": "inf"})
  list / tuple                       as a list
  a reference to another node        {"ref": "node_name"}
  torch.dtype                        {"dtype": "float32"}
  torch.device / layout / memory_format   {"device": "cpu"} / {"layout": ...} / {"memory_format": ...}
  an op passed as an argument        {"op": "aten._linalg_check_errors.default"} (higher_order.with_effects)
  a branch or body of control flow   {"subgraph": "true_graph_0"}, a key of the graph's `subgraphs`
Shapes are lists whose entries are ints or strings: a string is a symbolic dimension,
an expression over the graph's named symbols (e.g. "batch", "2*seq").
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import GraphFormatError

GRAPH_FORMAT_VERSION = 2  # 2: example_values (written only by graphs that have them; others stay 1)

INPUT_KINDS = ("parameter", "buffer", "constant", "user_input", "token")
BAKED_TYPES = (bool, int, float, str, type(None))  # python input values baked into a graph (GraphInput.baked)
OUTPUT_KINDS = ("user_output", "buffer_mutation", "user_input_mutation", "token")
PARAM_KINDS = ("parameter", "buffer", "constant")
# the key, among a run's updates, of the flags that say whether the inputs gave the example's values (example_values)
EXAMPLE_CHECKS = "torch2jax:example_checks"


@dataclass
class TensorMeta:
    """What torch's fake tensor said about a value: its dtype (torch short name) and shape."""

    dtype: str
    shape: list[int | str]

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(data: Any) -> TensorMeta:
        _expect(isinstance(data, dict) and isinstance(data.get("dtype"), str), "tensor meta needs a dtype", data)
        shape = data.get("shape")
        _expect(isinstance(shape, list) and all(_is_dim(d) for d in shape), "tensor meta needs a shape list", data)
        return TensorMeta(data["dtype"], list(shape))

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)


@dataclass
class Node:
    """One call in the graph: `op` is a qualified name such as `aten.add.Tensor` or `operator.getitem`."""

    name: str
    op: str
    args: list
    kwargs: dict
    meta: Any = None  # TensorMeta, a list of them (multi-output ops), {"sym": "expr"} or None
    source: str | None = None  # the user's source line, for error messages

    def to_json(self) -> dict:
        out: dict[str, Any] = {"name": self.name, "op": self.op, "args": self.args, "kwargs": self.kwargs}
        out["meta"] = _meta_to_json(self.meta)
        if self.source:
            out["source"] = self.source
        return out

    @staticmethod
    def from_json(data: Any) -> Node:
        _expect(isinstance(data, dict), "a node must be an object", data)
        name, op = data.get("name"), data.get("op")
        _expect(isinstance(name, str) and isinstance(op, str), "a node needs a name and an op", data)
        args, kwargs = data.get("args", []), data.get("kwargs", {})
        _expect(isinstance(args, list) and isinstance(kwargs, dict), f"node {name}: bad args/kwargs", data)
        source = data.get("source")
        _expect(source is None or isinstance(source, str), f"node {name}: bad source", data)
        return Node(name, op, args, kwargs, _meta_from_json(data.get("meta")), source)


@dataclass
class GraphInput:
    """A placeholder: a parameter/buffer/constant (keyed by `target`, its state_dict name) or a user input."""

    name: str
    kind: str
    meta: TensorMeta | None
    target: str | None = None
    # a python value torch.export specialized the graph on (use_cache=False), or a tensor input fixed to its example
    # value (nested lists; capture/specialize.py): baked in, not an input of the StableHLO; a call must pass the
    # same value (or leave a python one out)
    baked: bool = False
    value: Any = None

    def to_json(self) -> dict:
        out = {"name": self.name, "kind": self.kind, "target": self.target, "meta": _meta_to_json(self.meta)}
        if self.baked:
            out["value"] = self.value
        return out

    @staticmethod
    def from_json(data: Any) -> GraphInput:
        _expect(isinstance(data, dict) and isinstance(data.get("name"), str), "an input needs a name", data)
        _expect(data.get("kind") in INPUT_KINDS, f"input kind must be one of {INPUT_KINDS}", data)
        target = data.get("target")
        _expect(target is None or isinstance(target, str), "input target must be a string", data)
        meta = _meta_from_json(data.get("meta"))
        _expect(meta is None or isinstance(meta, TensorMeta), "input meta must describe one tensor", data)
        baked = "value" in data
        _expect(not baked or isinstance(data["value"], BAKED_TYPES) or (meta is not None and _nested_numbers(data["value"])),
                "a baked input's value must be a python constant, or a tensor input's nested list of numbers", data)
        return GraphInput(data["name"], data["kind"], meta, target, baked, data.get("value"))


def _example_values_from_json(data: Any) -> dict[str, dict]:
    _expect(isinstance(data, dict) and all(
        isinstance(v, dict) and isinstance(v.get("node"), str)
        and (isinstance(v.get("value"), int) or isinstance(v.get("condition"), str)) for v in data.values()),
        "example_values maps keys to {node, value or condition}", data)
    return {str(k): dict(v) for k, v in data.items()}


def _nested_numbers(value: Any) -> bool:
    if isinstance(value, list):
        return all(_nested_numbers(item) for item in value)
    return isinstance(value, (bool, int, float))


@dataclass
class GraphOutput:
    """One value the graph returns: a user output, or the new value of a mutated buffer (`target`)."""

    kind: str
    value: Any
    target: str | None = None

    def to_json(self) -> dict:
        return {"kind": self.kind, "value": self.value, "target": self.target}

    @staticmethod
    def from_json(data: Any) -> GraphOutput:
        _expect(isinstance(data, dict) and data.get("kind") in OUTPUT_KINDS, f"output kind must be one of {OUTPUT_KINDS}", data)
        target = data.get("target")
        _expect(target is None or isinstance(target, str), "output target must be a string", data)
        return GraphOutput(data["kind"], data.get("value"), target)


@dataclass
class Graph:
    """A whole program: inputs, nodes in execution order, outputs, and the user-facing pytree specs."""

    inputs: list[GraphInput]
    nodes: list[Node]
    outputs: list[GraphOutput]
    in_spec: dict = field(default_factory=lambda: {"type": "leaf"})
    out_spec: dict = field(default_factory=lambda: {"type": "leaf"})
    symbols: dict[str, dict] = field(default_factory=dict)  # name -> {"min": int, "max": int | None}
    aliases: dict[str, str] = field(default_factory=dict)  # tied weight name -> the name kept in params
    subgraphs: dict[str, Graph] = field(default_factory=dict)
    # what the model reads from its tensors to decide shapes and branches, taken from the example inputs
    # (capture/example_path.py), checked at run time: symbol -> {"value": int, "node": the node that reads it,
    # "at": the model's code line, "file" and "line" where it is (optional: older graphs lack them)}, or assertion
    # node -> {"condition": text, "node": it, "at": ..., "file": ..., "line": ...}
    example_values: dict[str, dict] = field(default_factory=dict)

    def with_fixed_dims(self, values: dict[str, int]) -> Graph:
        """The same program with some symbolic dims pinned to one size (range [v, v]): one traced graph serves
        another entry point, e.g. a prefill over any number of tokens as the one-token decode step. The shapes
        keep the symbol's name; export gives it the pinned size and calls are checked against it."""
        unknown = sorted(set(values) - set(self.symbols))
        if unknown:
            raise GraphFormatError(f"cannot pin dims {unknown}: the graph's symbolic dims are {sorted(self.symbols)}")
        pinned = {name: {"min": int(v), "max": int(v)} for name, v in values.items()}
        return dataclasses.replace(self, symbols={**self.symbols, **pinned})

    def fixed_dims(self) -> dict[str, int]:
        """Symbolic dims whose range is a single size (see with_fixed_dims)."""
        return {name: int(r["min"]) for name, r in self.symbols.items()
                if r.get("min") is not None and r.get("min") == r.get("max")}

    @property
    def user_inputs(self) -> list[GraphInput]:
        return [i for i in self.inputs if i.kind == "user_input"]

    @property
    def user_outputs(self) -> list[GraphOutput]:
        return [o for o in self.outputs if o.kind == "user_output"]

    @property
    def mutations(self) -> list[GraphOutput]:
        return [o for o in self.outputs if o.kind == "buffer_mutation"]

    def all_nodes(self):
        """Every node, those of subgraphs (control-flow branches and bodies) included."""
        yield from self.nodes
        for sub in self.subgraphs.values():
            yield from sub.all_nodes()

    def ops(self) -> list[str]:
        """Every op name used, subgraphs included, in first-use order."""
        return list(dict.fromkeys(node.op for node in self.all_nodes()))

    def to_json(self) -> dict:
        return {
            "format_version": GRAPH_FORMAT_VERSION if self.example_values else 1,  # older readers would skip the checks
            "inputs": [i.to_json() for i in self.inputs],
            "nodes": [n.to_json() for n in self.nodes],
            "outputs": [o.to_json() for o in self.outputs],
            "in_spec": self.in_spec,
            "out_spec": self.out_spec,
            "symbols": self.symbols,
            "aliases": self.aliases,
            "subgraphs": {k: g.to_json() for k, g in self.subgraphs.items()},
            **({"example_values": self.example_values} if self.example_values else {}),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), allow_nan=False, separators=(",", ":"))

    @staticmethod
    def from_json(data: Any) -> Graph:
        _expect(isinstance(data, dict), "the graph must be a JSON object", type(data).__name__)
        version = data.get("format_version")
        _expect(isinstance(version, int), "the graph has no format_version", version)
        if version > GRAPH_FORMAT_VERSION:
            raise GraphFormatError(
                f"graph format version {version} is newer than this torch2jax understands "
                f"({GRAPH_FORMAT_VERSION}); upgrade torch2jax to load it"
            )
        for key in ("inputs", "nodes", "outputs"):
            _expect(isinstance(data.get(key), list), f"the graph needs a list of {key}", key)
        symbols, aliases, subgraphs = data.get("symbols", {}), data.get("aliases", {}), data.get("subgraphs", {})
        _expect(isinstance(symbols, dict) and isinstance(aliases, dict) and isinstance(subgraphs, dict), "bad graph tables", key)
        graph = Graph(
            inputs=[GraphInput.from_json(i) for i in data["inputs"]],
            nodes=[Node.from_json(n) for n in data["nodes"]],
            outputs=[GraphOutput.from_json(o) for o in data["outputs"]],
            in_spec=_spec_from_json(data.get("in_spec", {"type": "leaf"})),
            out_spec=_spec_from_json(data.get("out_spec", {"type": "leaf"})),
            symbols={str(k): v for k, v in symbols.items()},
            aliases={str(k): str(v) for k, v in aliases.items()},
            subgraphs={str(k): Graph.from_json(v) for k, v in subgraphs.items()},
            example_values=_example_values_from_json(data.get("example_values", {})),
        )
        _check_references(graph)
        return graph

    @staticmethod
    def loads(text: str | bytes) -> Graph:
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise GraphFormatError(f"graph.json is not valid JSON: {err}") from None
        return Graph.from_json(data)


def encode_float(value: float) -> float | dict:
    """Floats as JSON: finite ones as they are, inf/-inf/nan tagged."""
    if math.isfinite(value):
        return value
    return {"float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}


def _is_dim(d: Any) -> bool:
    return (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or isinstance(d, str)


def _meta_to_json(meta: Any) -> Any:
    if isinstance(meta, TensorMeta):
        return meta.to_json()
    if isinstance(meta, list):
        return [_meta_to_json(m) for m in meta]
    return meta


def _meta_from_json(data: Any) -> Any:
    if data is None:
        return None
    if isinstance(data, list):
        return [_meta_from_json(m) for m in data]
    if isinstance(data, dict) and "dtype" in data:
        return TensorMeta.from_json(data)
    if isinstance(data, dict) and set(data) <= {"sym", "scalar"}:
        return data
    raise GraphFormatError(f"malformed meta in graph.json: {str(data)[:200]}")


_SPEC_TYPES = ("leaf", "none", "tuple", "list", "dict")


def _spec_from_json(spec: Any, depth: int = 0) -> dict:
    _expect(depth < 100, "pytree spec is nested too deeply", depth)
    _expect(isinstance(spec, dict) and spec.get("type") in _SPEC_TYPES, f"pytree spec type must be one of {_SPEC_TYPES}", spec)
    children = spec.get("children", [])
    _expect(isinstance(children, list), "pytree spec children must be a list", spec)
    for child in children:
        _spec_from_json(child, depth + 1)
    if spec["type"] == "dict":
        keys = spec.get("keys")
        _expect(isinstance(keys, list) and len(keys) == len(children), "a dict spec needs one key per child", spec)
    return spec


def _check_references(graph: Graph) -> None:
    """Every {"ref": name} must name an input or an earlier node: a malformed file fails here, not mid-trace."""
    defined = {i.name for i in graph.inputs}
    for node in graph.nodes:
        for ref in iter_refs([node.args, list(node.kwargs.values())]):
            _expect(ref in defined, f"node {node.name} uses {ref!r} before it is defined", node.name)
        for name in iter_refs([node.args, list(node.kwargs.values())], key="subgraph"):
            known = isinstance(name, str) and name in graph.subgraphs
            _expect(known, f"node {node.name} uses subgraph {name!r}, which the graph does not have", node.name)
        _expect(node.name not in defined, f"node name {node.name!r} is defined twice", node.name)
        defined.add(node.name)
    for out in graph.outputs:
        for ref in iter_refs(out.value):
            _expect(ref in defined, f"an output uses undefined value {ref!r}", ref)


def iter_refs(value: Any, key: str = "ref"):
    """Yield every node name (or with key="subgraph", subgraph name) referenced inside an encoded value."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if set(item) == {key}:
                yield item[key]
            else:
                stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _expect(condition: bool, message: str, context: Any) -> None:
    if not condition:
        raise GraphFormatError(f"malformed graph.json: {message} (at {str(context)[:120]})")
