"""A lowering run as one compiled call per argument signature, not primitive by primitive.

Run eagerly, a lowering dispatches each JAX primitive it uses on its own (`relu` is a constant,
a comparison and a select: three dispatches). Jitted per signature, it is one dispatch of one fused
computation, compiled on the signature's first call. The signature is everything that can change
the traced program's form: the op, the argument structure (which arguments are arrays, which are
None), each array's shape, dtype and weak type, and the values of all non-array arguments. A
compiled function is therefore traced once, on its signature's first call, and never retraced for
another form: an integer index and a boolean one (`x[mask]`) are different signatures, so one can
never run the other's kernel. A lowering that needs concrete values (it reads an array's value in
Python, as boolean indexing does, or sizes its result from one) fails on that first trace: its
signature is remembered and runs eagerly from then on, and an eager run also gives a failing
lowering its own error. An op called with ever-new non-array values (a clamp bound that changes
each step) would compile on every call and keep every compiled function: after MAX_VARIANTS of them
for one argument form it runs eagerly instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from ..ops import Lowering

MAX_VARIANTS = 16  # compiled signatures per op, argument structure and array forms before it runs eagerly

_EAGER = None  # a signature's entry when it runs eagerly
_COMPILED: dict[tuple, Callable | None] = {}  # signature -> jitted function, or _EAGER
_VARIANTS: dict[tuple, int] = {}  # (op, argument structure, array forms) -> signatures compiled for it


def run(lowering: Lowering, args: tuple, kwargs: dict) -> Any:
    """`lowering.fn(*args, **kwargs)`, compiled once per signature where it can be traced."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    is_array = tuple(isinstance(leaf, jax.Array) for leaf in leaves)
    # each array's form: a jitted function retraces for another one, outside the fallback below (issue 55)
    forms = tuple((leaf.shape, leaf.dtype, leaf.weak_type) for leaf, array in zip(leaves, is_array) if array)
    # the static values' types too: 1 and 1.0 (and True) are equal keys but trace to different dtypes
    statics = tuple(None if array else (type(leaf), leaf) for leaf, array in zip(leaves, is_array))
    signature = (lowering.op, treedef, is_array, forms, statics)
    try:
        known = signature in _COMPILED
    except TypeError:  # an unhashable argument: nothing to key a compiled function on
        return lowering.fn(*args, **kwargs)
    arrays = [leaf for leaf, array in zip(leaves, is_array) if array]
    if known:
        fn = _COMPILED[signature]
        return lowering.fn(*args, **kwargs) if fn is _EAGER else fn(*arrays)
    family = (lowering.op, treedef, is_array, forms)  # the static values' variants are bounded per form
    if _VARIANTS.get(family, 0) >= MAX_VARIANTS:
        return lowering.fn(*args, **kwargs)
    fn = _compile(lowering, treedef, is_array, statics)
    try:
        result = fn(*arrays)
    except Exception:  # not traceable (it reads values: boolean indexing, a size from an array) or a real error,
        result = lowering.fn(*args, **kwargs)  # which the eager run raises again, as it would have without jit
        _COMPILED[signature] = _EAGER
        return result
    _COMPILED[signature] = fn
    _VARIANTS[family] = _VARIANTS.get(family, 0) + 1
    return result


def _compile(lowering: Lowering, treedef: Any, is_array: tuple, statics: tuple) -> Callable:
    def call(*arrays: jax.Array) -> Any:
        given = iter(arrays)
        leaves = [next(given) if array else static[1] for array, static in zip(is_array, statics)]
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        return lowering.fn(*args, **kwargs)

    return jax.jit(call)
