"""Serialize a model's function as StableHLO with jax.export (symbolic shapes, platforms, VJP).

The exported function is `f(params, leaves) -> (outputs, updates)`: params stay arguments, so
weights are never baked into the StableHLO and can be swapped without re-export.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax import export as jax_export

from ..errors import Torch2JaxError
from ..ir import dtypes
from ..ir.graph import Graph
from ..lowering import interpreter
from .collector import existing_objects_frozen
from .model import Model, baked_leaf

DEFAULT_PLATFORMS = ("cpu", "cuda", "tpu")


def input_specs(graph: Graph) -> list:
    """ShapeDtypeStructs for the user inputs, all symbolic dims in one shared scope."""
    constraints = []
    fixed = graph.fixed_dims()  # pinned to one size: exported as that size, not as a symbol
    for name, rng in sorted(graph.symbols.items()):
        if name in fixed:
            continue
        if rng.get("min") is not None and rng["min"] > 1:
            constraints.append(f"{name} >= {rng['min']}")
        if rng.get("max") is not None:
            constraints.append(f"{name} <= {rng['max']}")
    scope = jax_export.SymbolicScope(constraints)
    specs = []
    for inp in graph.user_inputs:
        if inp.baked:
            continue  # a python value the graph was specialized on: baked in (see with_baked / without_baked)
        if inp.meta is None:
            raise Torch2JaxError(f"input {inp.name!r} is not a tensor; only tensor inputs can be exported")
        dtype = dtypes.jax_dtype(inp.meta.dtype)
        if inp.meta.is_static:
            specs.append(jax.ShapeDtypeStruct(tuple(inp.meta.shape), dtype))
            continue
        text = ", ".join(str(fixed.get(d, d)) if isinstance(d, str) else str(d) for d in inp.meta.shape)
        specs.append(jax.ShapeDtypeStruct(jax_export.symbolic_shape(text, scope=scope), dtype))
    return specs


@existing_objects_frozen()
def export(model: Model, platforms: Sequence[str] = DEFAULT_PLATFORMS) -> jax_export.Exported:
    """jax.export the model's function for `platforms`."""
    params_spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), model.params)
    run = model._run
    specs: list[Any] = [params_spec, input_specs(model.graph)]
    if interpreter.needs_rng(model.graph):
        specs.append(jax.ShapeDtypeStruct(_KEY_DATA_SHAPE, "uint32"))

    def exported_fn(params, leaves, key_data=None):
        rng = None if key_data is None else jax.random.wrap_key_data(key_data)
        return run(params, with_baked(model.graph, leaves), rng)

    try:
        return jax_export.export(jax.jit(exported_fn), platforms=tuple(platforms))(*specs)
    except Torch2JaxError:
        raise
    except Exception as err:
        raise Torch2JaxError(f"jax.export could not serialize the model: {type(err).__name__}: {err}") from err


def serialize(exported: jax_export.Exported, vjp_order: int = 1) -> bytes:
    return bytes(exported.serialize(vjp_order=vjp_order))


def with_baked(graph: Graph, leaves: Sequence) -> list:
    """The StableHLO's tensor leaves -> every user input's leaf, the baked python values put back in place."""
    tensors = iter(leaves)
    return [baked_leaf(inp) if inp.baked else next(tensors) for inp in graph.user_inputs]


def without_baked(graph: Graph, leaves: Sequence) -> list:
    """Every user input's leaf -> the StableHLO's inputs: the baked python values left out."""
    return [leaf for inp, leaf in zip(graph.user_inputs, leaves) if not inp.baked]


def exported_runner(exported: jax_export.Exported, graph: Graph | None = None):
    """A run function (see model.RunFn) that calls the deserialized StableHLO (of `graph`, whose baked python
    inputs it leaves out)."""

    takes_key = _positional_count(exported) == 3
    baked = graph is not None and any(inp.baked for inp in graph.user_inputs)

    def run(params: dict, leaves: list, rng: Any = None):
        leaves = without_baked(graph, leaves) if baked else leaves
        if not takes_key:
            return exported.call(params, list(leaves))
        if rng is None:
            raise Torch2JaxError("this model draws random numbers: pass a PRNG key, e.g. model(x, rng=jax.random.key(0))")
        return exported.call(params, list(leaves), _key_data(rng))

    return run



_KEY_DATA_SHAPE = (2,)  # threefry keys, the default implementation


def _positional_count(exported: jax_export.Exported) -> int:
    """How many positional arguments the exported function takes: (params, leaves[, key_data])."""
    args_tree, _kwargs_tree = jax.tree_util.treedef_children(exported.in_tree)
    return len(jax.tree_util.treedef_children(args_tree))


def _key_data(rng: Any) -> Any:
    """Typed keys (jax.random.key) become their raw uint32 data; raw keys pass through."""
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(rng)
    return rng
