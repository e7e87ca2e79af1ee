"""A lowering run as one compiled call per argument signature, not primitive by primitive.

Run eagerly, a lowering dispatches each JAX primitive it uses on its own (`relu` is a constant,
a comparison and a select: three dispatches). Jitted per signature (the op, which arguments are
arrays and the values of all the others), it is one dispatch of one fused computation, compiled
on the signature's first call. A lowering that needs concrete values (it reads an array's value in
Python, as boolean indexing does) cannot be traced: its signature is remembered and runs eagerly from
then on, and an eager run also gives a failing lowering's own error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ..ops import Lowering

_COMPILED: dict[tuple, Callable | None] = {}  # signature -> jitted function, or None: run eagerly


def run(lowering: Lowering, args: tuple, kwargs: dict) -> Any:
    """`lowering.fn(*args, **kwargs)`, compiled once per signature where it can be traced."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    is_array = tuple(isinstance(leaf, jax.Array) for leaf in leaves)
    statics = tuple(None if array else leaf for leaf, array in zip(leaves, is_array))
    signature = (lowering.op, treedef, is_array, statics)
    try:
        fn = _COMPILED.get(signature, _COMPILED)
    except TypeError:  # an unhashable argument: nothing to key a compiled function on
        return lowering.fn(*args, **kwargs)
    if fn is None:
        return lowering.fn(*args, **kwargs)
    arrays = [leaf for leaf, array in zip(leaves, is_array) if array]
    if fn is not _COMPILED:
        return fn(*arrays)
    fn = _compile(lowering, treedef, is_array, statics)
    try:
        result = fn(*arrays)
    except Exception:  # not traceable (it reads values: boolean indexing, a size from an array) or a real error,
        result = lowering.fn(*args, **kwargs)  # which the eager run raises again, as it would have without jit
        _COMPILED[signature] = None
        return result
    _COMPILED[signature] = fn
    return result


def _compile(lowering: Lowering, treedef: Any, is_array: tuple, statics: tuple) -> Callable:
    def call(*arrays: jax.Array) -> Any:
        given = iter(arrays)
        leaves = [next(given) if array else static for array, static in zip(is_array, statics)]
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return lowering.fn(*args, **kwargs)

    return jax.jit(call)
