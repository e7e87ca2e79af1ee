"""Dynamic dims, from the user's spelling to torch's and back: the plain form (`{"x": {0: "batch"}}`, a name or
`{"name": "batch", "min": 1, "max": 64}`; dims that share a name are one dim) made `torch.export.Dim`s for the
export, and torch's symbols in the exported program (s0, s77) named again by the user's dim names."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..errors import InputSpecError


def normalize_dynamic_shapes(spec: Any) -> Any:
    """Plain names -> torch.export.Dim (one Dim per distinct name); torch Dims pass through."""
    if spec is None:
        return None
    made: dict[str, Any] = {}

    def make(entry: Any) -> Any:
        if isinstance(entry, str):
            return dim(entry, None, None)
        if isinstance(entry, dict) and "name" in entry:
            return dim(entry["name"], entry.get("min"), entry.get("max"))
        return entry

    def dim(name: str, lo: int | None, hi: int | None) -> Any:
        if not isinstance(name, str) or not name.isidentifier():
            raise InputSpecError(f"dynamic dim name {name!r} must be an identifier such as 'batch'")
        if name not in made:
            options = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None}
            if hi is not None and (hi <= 1 or (lo is not None and hi <= lo)):
                raise InputSpecError(
                    f"dynamic dim {name!r} has range [{lo}, {hi}], which leaves it no room to vary: "
                    "make it static (drop it from dynamic_shapes) or widen the range"
                )
            made[name] = torch.export.Dim(name, **options)
        return made[name]

    def walk(node: Any) -> Any:
        if isinstance(node, dict) and node and all(isinstance(k, int) for k in node):
            return {k: make(v) for k, v in node.items()}
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            items = [walk(v) if isinstance(v, (dict, list, tuple)) else make(v) for v in node]
            return type(node)(items)
        return make(node)

    return walk(spec)


def symbol_names(ep: torch.export.ExportedProgram, module: torch.nn.Module, args: tuple, kwargs: dict,
                 dims: Any) -> dict[str, str]:
    """Map torch's symbols (s0, s77) to the user's dim names by walking inputs and specs together."""
    if dims is None:
        return {}
    per_leaf = _flat_dim_specs(module, args, kwargs, dims)
    user_inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    names: dict[str, str] = {}
    for input_name, spec in zip(user_inputs, per_leaf):
        val = placeholders[input_name].meta.get("val")
        if spec is None or not isinstance(val, torch.Tensor):
            continue
        items = spec.items() if isinstance(spec, dict) else enumerate(spec)
        for axis, d in items:
            if d is None or not hasattr(d, "__name__"):
                continue
            size = val.shape[axis]
            if isinstance(size, torch.SymInt) and size.node.expr.is_symbol:
                names.setdefault(str(size.node.expr), d.__name__)
    return names


def _flat_dim_specs(module, args: tuple, kwargs: dict, dims: Any) -> list:
    """One dim spec (or None) per tensor leaf, in torch's flattening order of (args, kwargs)."""
    if isinstance(dims, dict):
        try:
            bound = inspect.signature(module.forward).bind(*args, **kwargs)
        except TypeError:
            bound = None
        params = list(bound.arguments) if bound is not None else []
        positional = [dims.get(params[i]) if i < len(params) else None for i in range(len(args))]
        keyword = {k: dims.get(k) for k in kwargs}
    else:
        positional = list(dims) + [None] * (len(args) - len(dims))
        keyword = {k: None for k in kwargs}
    flat: list = []
    for value, spec in zip(args, positional):
        _walk(value, spec, flat)
    for key, value in kwargs.items():
        _walk(value, keyword[key], flat)
    return flat


def _walk(value: Any, spec: Any, flat: list) -> None:
    if isinstance(value, torch.Tensor):
        flat.append(spec)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _walk(item, spec[i] if isinstance(spec, (list, tuple)) and i < len(spec) else None, flat)
    elif isinstance(value, dict):
        for key, item in value.items():
            _walk(item, spec.get(key) if isinstance(spec, dict) else None, flat)
    elif value is not None:
        flat.append(None)
