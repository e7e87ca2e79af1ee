"""One FX graph whose every op has a lowering, as a jitted JAX function called with torch values.

aot_autograd hands the backend flat graphs: placeholders are tensors and SymInts, the output a
tuple of tensors, SymInts and Nones. The graph goes through the same capture -> passes ->
interpreter path as an exported model. SymInts are static arguments of `jax.jit`, so each
distinct shape compiles once and no shape is ever a traced scalar; int64 and float64 stay what torch
says (the function runs with x64 on). A graph that draws random numbers gets a fresh key per call,
drawn from torch's default generator, so `torch.manual_seed` makes runs reproducible.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch

from ..capture.fx import capture_graph_module
from ..ir.graph import Graph
from ..lowering import interpreter, passes
from .handoff import InputSlot, shared, to_tensor


class JaxGraph:
    """`JaxGraph(gm)(values)` computes what `gm(*values)` does, in JAX; values are torch tensors and ints.

    `state` are the positions of placeholders that hold parameters and buffers (aot_autograd's static
    inputs): they enter the graph as params, as in an exported model, so the graph passes that need
    to know a weight from an activation (a batch norm folded into its conv) apply.
    """

    def __init__(self, gm: torch.fx.GraphModule, state: frozenset[int] = frozenset()):
        captured = capture_graph_module(gm)
        placeholders = [i for i in captured.graph.inputs if i.kind == "user_input"]
        for position, inp in enumerate(placeholders):
            if position in state and inp.meta is not None and inp.meta.is_static:
                inp.kind, inp.target = "parameter", inp.name
        graph = passes.optimize(captured.graph)
        self._run = interpreter.build(graph)
        self._constants = {name: shared(t) for name, t in captured.tensors.items()}
        self._state = [inp.kind == "parameter" for inp in placeholders]
        self._names = [inp.name for inp in placeholders]
        # per placeholder: an InputSlot for a tensor, None for a static value (SymInt, float, bool)
        self._slots = [InputSlot() if inp.meta is not None else None for inp in placeholders]
        self._state_positions = [i for i, is_state in enumerate(self._state) if is_state]
        self._other_positions = [i for i, is_state in enumerate(self._state) if not is_state]
        # the params dict of the last call, and the tensors and versions it was made from
        self._params: dict | None = None
        self._params_from: tuple[list, list] = ([], [])
        self._forwarded = _forwarded_inputs(graph, self._names)  # output index -> input index (returned unchanged)
        self._needs_rng = interpreter.needs_rng(graph)
        self._static_outputs: dict[tuple, dict[int, Any]] = {}  # per static arguments: outputs that are not arrays
        self._jitted = jax.jit(self._traced, static_argnums=(2,))

    def _traced(self, params: dict, arrays: list, statics: tuple, rng_bits):
        array_values, static_values = iter(arrays), iter(statics)
        leaves = [next(static_values) if slot is None else next(array_values)
                  for slot, is_state in zip(self._slots, self._state) if not is_state]
        key = None if rng_bits is None else jax.random.wrap_key_data(rng_bits, impl="threefry2x32")
        outputs, _ = self._run(params, leaves, key)
        static = {i: value for i, value in enumerate(outputs) if not isinstance(value, jax.Array)}
        self._static_outputs[statics] = static
        return [None if i in static else value for i, value in enumerate(outputs)]

    def __call__(self, values: Sequence) -> list:
        params = self._params_for(values)
        arrays, statics = [], []
        for position in self._other_positions:
            slot, value = self._slots[position], values[position]
            if slot is None:
                statics.append(value)
            else:
                arrays.append(slot.value(value))
        statics = tuple(_concrete(v) for v in statics)
        bits = _rng_bits() if self._needs_rng else None
        with jax.enable_x64(True):
            outputs = self._jitted(params, arrays, statics, bits)
        static = self._static_outputs[statics]
        results = []
        for i, out in enumerate(outputs):
            if i in self._forwarded:
                results.append(values[self._forwarded[i]])
            elif i in static:
                results.append(static[i])
            else:
                results.append(to_tensor(out))
        return results


    def _params_for(self, values: Sequence) -> dict:
        """The params dict, reused whole while the same parameter and buffer tensors come back at the same
        versions (one comparison per tensor instead of a slot lookup: a ResNet has 80 of them)."""
        state = [values[i] for i in self._state_positions]
        versions = [t._version for t in state]
        seen, seen_versions = self._params_from
        if self._params is not None and versions == seen_versions and all(map(operator.is_, state, seen)):
            return self._params
        params = dict(self._constants)
        for position, tensor in zip(self._state_positions, state):
            params[self._names[position]] = self._slots[position].value(tensor, long_lived=True)
        self._params, self._params_from = params, (state, versions)
        return params


def _concrete(value: Any) -> Any:
    """A SymInt / SymFloat / SymBool as the plain value it has on this call (a hashable static argument)."""
    for sym, kind in ((torch.SymInt, int), (torch.SymFloat, float), (torch.SymBool, bool)):
        if isinstance(value, sym):
            return kind(value)
    return value


def _rng_bits() -> np.ndarray:
    """Two 32-bit words from torch's default generator: a new JAX key per call that follows torch's seed."""
    return torch.randint(0, 2**31 - 1, (2,), dtype=torch.int64).numpy().astype(np.uint32)


def _forwarded_inputs(graph: Graph, placeholders: list[str]) -> dict[int, int]:
    """Outputs that are a tensor input as it came in: handed back as the same torch tensor, not a copy."""
    tensors = {inp.name for inp in graph.inputs if inp.meta is not None}
    position = {name: i for i, name in enumerate(placeholders) if name in tensors}
    forwarded = {}
    for i, out in enumerate(graph.user_outputs):
        ref = out.value.get("ref") if isinstance(out.value, dict) else None
        if ref in position:
            forwarded[i] = position[ref]
    return forwarded
