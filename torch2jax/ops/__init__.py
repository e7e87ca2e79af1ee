"""The op registry and the built-in lowerings, one module per op family.

`registry` is the data and knows nothing of the families; `load_builtin_lowerings` is the one
step that imports them. Readers (the interpreter, the graph passes, coverage) go through
`lookup` / `registered` here, which load the families first, so no import order matters.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from . import registry
from .registry import Lowering, canonical_op_name, lowers

__all__ = ["FAMILIES", "Lowering", "canonical_op_name", "load_builtin_lowerings", "lookup", "lowers", "register_lowering", "registered"]

# The op-family modules of this package; each registers its lowerings when imported.
FAMILIES = (
    "activations",
    "attention",
    "backward",
    "control_flow",
    "conv",
    "elementwise",
    "fft",
    "foreach",
    "fusion_barrier",
    "histogram",
    "indexing",
    "linalg",
    "linalg_decomp",
    "lora",
    "losses",
    "normalization",
    "pooling",
    "python_values",
    "quantized",
    "random",
    "recurrent",
    "reductions",
    "shape",
    "sorting",
    "special",
    "upsample",
)
_loaded = False


def load_builtin_lowerings() -> None:
    """Import every op family once, registering the built-in lowerings."""
    global _loaded
    if not _loaded:
        _loaded = True
        for family in FAMILIES:
            importlib.import_module(f"{__name__}.{family}")


def lookup(op: str) -> Lowering | None:
    """The lowering registered for an overload name (`aten.add.Tensor`), or None."""
    if not _loaded:
        load_builtin_lowerings()
    return registry.lookup(op)


def registered() -> dict[str, Lowering]:
    """Every registered lowering, built-in and user, by overload name."""
    load_builtin_lowerings()
    return registry.registered()


def register_lowering(op: Any, fn: Callable | None = None, *, ctx: bool = False, replace: bool = False):
    """Public API: give a JAX lowering for an op, e.g. a user's own `torch.library` custom op.

    `op` is a qualified name (`"mylib::my_op"`, `"mylib::my_op.overload"`, `"aten.add.Tensor"`) or
    a torch op object. `fn` takes jax arrays and python values in the op's schema order and returns
    jax arrays. Usable as a call or as a decorator: `@torch2jax.register_lowering("mylib::my_op")`.
    """
    load_builtin_lowerings()  # built-in lowerings first, so that replace=True overrides them and not the reverse

    def decorate(f: Callable) -> Callable:
        registry.add(op, f, ctx=ctx, replace=replace)
        return f

    return decorate(fn) if fn is not None else decorate
