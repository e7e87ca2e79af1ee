"""`jit(model)`: a module's whole forward as one jax.jit-compiled function.

The forward runs once under jax.jit with its parameters, buffers and inputs as `jax` tensors
over tracers: every op's kernel calls its lowering on tracers, so the trace is the model's JAX
program. Later calls with the same input shapes run the compiled program, with no torch op
dispatched. Buffers the forward writes (BatchNorm's running statistics) come back as outputs and
are written into the module's buffers; random ops draw from a key passed in per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import torch
import torch.utils._pytree as pytree

from . import rng, storage
from .tensors import DEVICE, is_jax, tracing, wrap


class JittedModule:
    """Call it like the module; it runs the compiled forward (one compile per input signature)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self._structure: dict[Any, Any] = {}
        self._compiled = jax.jit(self._run, static_argnums=(0,))

    def _state(self) -> dict[str, torch.Tensor]:
        state = {**dict(self.module.named_parameters()), **dict(self.module.named_buffers())}
        off = [name for name, value in state.items() if not is_jax(value)]
        if off:
            raise ValueError(f"jit needs the module on the jax device (model.to('jax')); {off[0]} is on "
                             f"{state[off[0]].device}")
        return state

    def _run(self, signature: Any, state: dict, leaves: list, key: jax.Array):
        names = list(state)
        tensors = {name: wrap(state[name]) for name in names}
        spec = self._structure[signature][0]
        args, kwargs = pytree.tree_unflatten([wrap(a) if isinstance(a, jax.Array) else a for a in leaves], spec)
        with tracing(), rng.traced(key), torch.no_grad():
            out = torch.func.functional_call(self.module, tensors, args, kwargs)
        flat, out_spec = pytree.tree_flatten(out)
        self._structure[signature] = (spec, out_spec, [isinstance(o, torch.Tensor) for o in flat])
        updates = {name: storage.read(t) for name, t in tensors.items()
                   if storage.storage_of(t).array is not state[name] and name in dict(self.module.named_buffers())}
        return [storage.read(o) if isinstance(o, torch.Tensor) else None for o in flat], updates

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self._state()
        flat, spec = pytree.tree_flatten((args, kwargs))
        leaves = [storage.read(a) if is_jax(a) else a for a in flat]
        if any(isinstance(a, torch.Tensor) for a in leaves):
            raise ValueError("jit takes tensors on the jax device: move the inputs with .to('jax')")
        signature = (str(spec), tuple((a.shape, str(a.dtype)) if isinstance(a, jax.Array) else repr(a) for a in leaves))
        self._structure.setdefault(signature, (spec, None, None))
        key, index = rng.next_key()
        with jax.enable_x64(True):
            arrays = {name: storage.read(t) for name, t in state.items()}
            outputs, updates = self._compiled(signature, arrays, leaves, jax.random.fold_in(key, index))
            for name, value in updates.items():
                storage.write(state[name], value)
        _, out_spec, is_tensor = self._structure[signature]
        return pytree.tree_unflatten([wrap(o) if t else o for o, t in zip(outputs, is_tensor)], out_spec)


def jit(module: torch.nn.Module) -> Callable:
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"jit takes a torch.nn.Module, got {type(module).__name__}")
    if not any(p.device.type == DEVICE for p in module.parameters()) and any(True for _ in module.parameters()):
        raise ValueError("jit needs the module on the jax device: call model.to('jax') first")
    return JittedModule(module)
