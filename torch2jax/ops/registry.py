"""The op registry: ATen overload name -> JAX lowering.

A lowering is a small pure function of jax arrays and python values, in the op's schema order:

    @lowers("aten.add.Tensor", "aten.add.Scalar")
    def add(x, y, alpha=1): ...

Lowerings that need to know the node's output (its dtype or shape, as torch computed it) or
need randomness declare `ctx=True` and receive a `LoweringContext` as their first argument.
Keys are strings so that the registry, the interpreter and every lowering work without torch.

This module is the data alone and knows nothing of where the built-in lowerings live: the
package (`torch2jax.ops`) loads them in one explicit step before anyone reads the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_REGISTRY: dict[str, Lowering] = {}


@dataclass(frozen=True)
class Lowering:
    op: str
    fn: Callable
    ctx: bool
    module: str  # the file that registered it: op family, or the user's module


def lowers(*ops: str, ctx: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated function as the lowering of each overload in `ops`."""
    if not ops:
        raise TypeError("lowers() needs at least one op name")

    def decorate(fn: Callable) -> Callable:
        for op in ops:
            _add(canonical_op_name(op), fn, ctx, replace=False)
        return fn

    return decorate


def add(op: Any, fn: Callable, *, ctx: bool = False, replace: bool = False) -> None:
    """Register `fn` for `op` (a name or a torch op object); a second lowering for one op needs replace=True."""
    _add(canonical_op_name(op), fn, ctx, replace)


def canonical_op_name(op: Any) -> str:
    """`mylib::my_op` -> `mylib.my_op.default`; torch op objects -> their overload name."""
    if not isinstance(op, str):
        overloads = getattr(op, "overloads", None)
        if callable(overloads) and not hasattr(op, "_schema"):  # an OpOverloadPacket
            op = f"{op}.default"
        else:
            op = str(op)
    if "::" in op:
        namespace, rest = op.split("::", 1)
        parts = rest.split(".")
        op = f"{namespace}.{parts[0]}.{parts[1] if len(parts) > 1 else 'default'}"
    return op


def _add(name: str, fn: Callable, ctx: bool, replace: bool) -> None:
    existing = _REGISTRY.get(name)
    if existing is not None and not replace and existing.fn is not fn:
        raise ValueError(
            f"{name} already has a lowering ({existing.module}.{existing.fn.__name__}); "
            "pass replace=True to override it"
        )
    _REGISTRY[name] = Lowering(name, fn, ctx, getattr(fn, "__module__", "?"))


def lookup(op: str) -> Lowering | None:
    return _REGISTRY.get(op)


def registered() -> dict[str, Lowering]:
    return dict(_REGISTRY)
