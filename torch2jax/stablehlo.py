"""Serialize a model's function as StableHLO with jax.export (symbolic shapes, platforms, VJP).

The exported function is `f(params, leaves) -> (outputs, updates)`: params stay arguments, so
weights are never baked into the StableHLO and can be swapped without re-export.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
from jax import export as jax_export

from . import dtypes
from .errors import Torch2JaxError
from .graph import Graph
from .model import Model

DEFAULT_PLATFORMS = ("cpu", "cuda", "tpu")


def input_specs(graph: Graph) -> list:
    """ShapeDtypeStructs for the user inputs, all symbolic dims in one shared scope."""
    constraints = []
    for name, rng in sorted(graph.symbols.items()):
        if rng.get("min") is not None and rng["min"] > 1:
            constraints.append(f"{name} >= {rng['min']}")
        if rng.get("max") is not None:
            constraints.append(f"{name} <= {rng['max']}")
    scope = jax_export.SymbolicScope(constraints)
    specs = []
    for inp in graph.user_inputs:
        if inp.meta is None:
            raise Torch2JaxError(f"input {inp.name!r} is not a tensor; only tensor inputs can be exported")
        dtype = dtypes.jax_dtype(inp.meta.dtype)
        if inp.meta.is_static:
            specs.append(jax.ShapeDtypeStruct(tuple(inp.meta.shape), dtype))
            continue
        text = ", ".join(str(d) for d in inp.meta.shape)
        specs.append(jax.ShapeDtypeStruct(jax_export.symbolic_shape(text, scope=scope), dtype))
    return specs


def export(model: Model, platforms: Sequence[str] = DEFAULT_PLATFORMS) -> jax_export.Exported:
    """jax.export the model's function for `platforms`."""
    params_spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), model.params)
    run = model._run

    def exported_fn(params, leaves):
        return run(params, list(leaves), None)

    try:
        return jax_export.export(jax.jit(exported_fn), platforms=tuple(platforms))(params_spec, input_specs(model.graph))
    except Torch2JaxError:
        raise
    except Exception as err:
        raise Torch2JaxError(f"jax.export could not serialize the model: {type(err).__name__}: {err}") from err


def serialize(exported: jax_export.Exported, vjp_order: int = 1) -> bytes:
    return bytes(exported.serialize(vjp_order=vjp_order))


def exported_runner(exported: jax_export.Exported):
    """A run function (see model.RunFn) that calls the deserialized StableHLO."""

    def run(params: dict, leaves: list, rng: Any = None):
        return exported.call(params, list(leaves))

    return run

