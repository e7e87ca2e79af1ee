"""`jit_train_step(model, optimizer, loss_fn)`: forward, gradients and optimizer step as one jax.jit program.

torch's autograd cannot run inside a JAX trace: its engine runs a non-CPU device's backward on a
worker thread, and JAX's tracing context is per thread. So the gradients are JAX's: the traced
forward (every op a lowering) is differentiated with `jax.value_and_grad`, the gradients are
given to the parameters as `.grad`, and the torch optimizer's `step()` runs in the same trace
(its ops are lowerings too). Every tensor the step reads or writes (parameters, buffers, grads,
the optimizer's state) is an input and an output of the compiled function: its storage holder
carries a tracer during the trace and the new array after each call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import torch
import torch.utils._pytree as pytree

from . import rng, storage
from .tensors import is_jax, tracing, wrap


class JittedTrainStep:
    """`step(*batch) -> loss`: one compiled training step (compiled once per batch signature)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self._compiled: dict[Any, Callable] = {}  # one jitted function per signature
        self._after: dict[Any, list[torch.Tensor]] = {}

    def _state(self) -> list[torch.Tensor]:
        """Every tensor the step reads or writes, in a fixed order."""
        params = list(self.model.parameters())
        tensors = params + list(self.model.buffers()) + [p.grad for p in params if p.grad is not None]
        for p in params:
            for value in self.optimizer.state.get(p, {}).values():
                if isinstance(value, torch.Tensor):
                    if not is_jax(value):
                        raise ValueError(
                            f"the optimizer keeps a {value.device} tensor in its state ({type(self.optimizer).__name__}"
                            "'s step counter): create it with capturable=True so that its state lives on the jax "
                            "device and can be part of the compiled step")
                    tensors.append(value)
        return tensors

    def _run(self, signature: Any, arrays: list, leaves: list, key: jax.Array):
        with tracing():
            return self._traced_step(signature, arrays, leaves, key)

    def _traced_step(self, signature: Any, arrays: list, leaves: list, key: jax.Array):
        before = self._state()
        for tensor, array in zip(before, arrays):
            storage.storage_of(tensor).array = array
        params = list(self.model.parameters())
        buffers = list(self.model.buffers())
        spec = signature[0]

        def loss_of(param_arrays):
            for p, a in zip(params, param_arrays):
                storage.storage_of(p).array = a
            args = pytree.tree_unflatten([wrap(a) if isinstance(a, jax.Array) else a for a in leaves], spec)
            with torch.no_grad():
                loss = self.loss_fn(self.model, *args)
            return storage.read(loss), [storage.storage_of(b).materialized() for b in buffers]

        param_arrays = [storage.storage_of(p).materialized() for p in params]
        with rng.traced(key):
            (loss, new_buffers), grads = jax.value_and_grad(loss_of, has_aux=True)(param_arrays)
        for p, a in zip(params, param_arrays):
            storage.storage_of(p).array = a
        for b, a in zip(buffers, new_buffers):
            storage.storage_of(b).array = a
        for p, g in zip(params, grads):
            if p.grad is None:
                p.grad = wrap(g)
            else:
                storage.write(p.grad, g.astype(storage.numpy_dtype(p.grad.dtype)))
        with rng.traced(jax.random.fold_in(key, 1)), torch.no_grad():
            self.optimizer.step()
        after = self._state()
        self._after[signature] = after
        return loss, [storage.storage_of(t).materialized() for t in after]

    def __call__(self, *batch: Any) -> torch.Tensor:
        flat, spec = pytree.tree_flatten(batch)
        if any(isinstance(a, torch.Tensor) and not is_jax(a) for a in flat):
            raise ValueError("jit_train_step takes tensors on the jax device: move the batch with .to('jax')")
        leaves = [storage.read(a) if is_jax(a) else a for a in flat]
        before = self._state()
        signature = (spec, tuple((a.shape, str(a.dtype)) if isinstance(a, jax.Array) else repr(a) for a in leaves),
                     tuple((tuple(t.shape), t.dtype) for t in before))
        key, index = rng.next_key()
        grads = [p.grad for p in self.model.parameters()]
        state = {p: dict(s) for p, s in self.optimizer.state.items()}
        with jax.enable_x64(True):
            arrays = [storage.read(t) for t in before]
            if signature not in self._compiled:
                self._compiled[signature] = jax.jit(functools.partial(self._run, signature))
            try:
                loss, new = self._compiled[signature](arrays, leaves, jax.random.fold_in(key, index))
            except Exception:  # a failed trace leaves tracers behind: put the step's state back as it was
                self._compiled.pop(signature, None)
                for tensor, array in zip(before, arrays):
                    storage.storage_of(tensor).array = array
                for p, grad in zip(self.model.parameters(), grads):
                    p.grad = grad
                self.optimizer.state.clear()
                self.optimizer.state.update(state)
                raise
        for tensor, array in zip(self._after[signature], new):
            storage.storage_of(tensor).array = array
        return wrap(loss)


def jit_train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable) -> JittedTrainStep:
    if not isinstance(model, torch.nn.Module) or not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("jit_train_step(model, optimizer, loss_fn) takes an nn.Module and a torch.optim optimizer")
    off = [name for name, p in model.named_parameters() if not is_jax(p)]
    if off:
        raise ValueError(f"jit_train_step needs the model on the jax device (model.to('jax')); {off[0]} is on the CPU")
    return JittedTrainStep(model, optimizer, loss_fn)
