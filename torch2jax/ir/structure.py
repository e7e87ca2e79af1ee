"""Pytree specs as plain JSON: how user inputs flatten into graph inputs and graph outputs
unflatten into what the torch module returned (tensor, tuple, list, dict; model outputs as dicts).
"""

from __future__ import annotations

from typing import Any

from ..errors import SignatureError

LEAF = {"type": "leaf"}


def flatten(value: Any, spec: dict, path: str = "inputs") -> list:
    """The leaves of `value`, checked against `spec`; a mismatch names the path and what was expected."""
    kind = spec["type"]
    if kind == "leaf":
        return [value]
    if kind == "none":
        if value is not None:
            raise SignatureError(f"{path}: expected None, got {type(value).__name__}")
        return []
    children = spec.get("children", [])
    if kind in ("tuple", "list"):
        if not isinstance(value, (tuple, list)):
            raise SignatureError(f"{path}: expected a {kind} of {len(children)}, got {type(value).__name__}")
        if len(value) != len(children):
            raise SignatureError(f"{path}: expected {len(children)} items, got {len(value)}")
        leaves = []
        for i, (item, child) in enumerate(zip(value, children)):
            leaves.extend(flatten(item, child, f"{path}[{i}]"))
        return leaves
    if kind == "dict":
        if not isinstance(value, dict):
            raise SignatureError(f"{path}: expected a dict with keys {spec['keys']}, got {type(value).__name__}")
        missing = [k for k in spec["keys"] if k not in value]
        unexpected = [k for k in value if k not in spec["keys"]]
        if missing or unexpected:
            raise SignatureError(f"{path}: expected keys {spec['keys']}; missing {missing}, unexpected {unexpected}")
        leaves = []
        for key, child in zip(spec["keys"], children):
            leaves.extend(flatten(value[key], child, f"{path}[{key!r}]"))
        return leaves
    raise SignatureError(f"{path}: unknown pytree spec type {kind!r}")


def unflatten(spec: dict, leaves: list) -> Any:
    """Rebuild the structure `spec` describes from `leaves` (in flatten order)."""
    it = iter(leaves)
    result = _build(spec, it)
    if next(it, _END) is not _END:
        raise ValueError("more leaves than the spec has places for")
    return result


_END = object()


def _build(spec: dict, it) -> Any:
    kind = spec["type"]
    if kind == "leaf":
        return next(it)
    if kind == "none":
        return None
    children = [_build(c, it) for c in spec.get("children", [])]
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    return dict(zip(spec["keys"], children))


def count_leaves(spec: dict) -> int:
    if spec["type"] == "leaf":
        return 1
    return sum(count_leaves(c) for c in spec.get("children", []))


def leaf_paths(spec: dict, prefix: str = "") -> list[str]:
    """A readable name per leaf: "output" for a lone tensor, else "logits", "hidden.0", "1"..."""
    kind = spec["type"]
    if kind == "leaf":
        return [prefix or "output"]
    if kind == "none":
        return []
    children = spec.get("children", [])
    keys = spec.get("keys") if kind == "dict" else range(len(children))
    paths = []
    for key, child in zip(keys, children):
        paths.extend(leaf_paths(child, f"{prefix}.{key}" if prefix else str(key)))
    return paths
