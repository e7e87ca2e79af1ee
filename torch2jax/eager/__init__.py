"""Eager PyTorch on JAX: a `jax` device whose ops run the registry's lowerings.

    import torch2jax.eager as te
    te.enable()                              # nothing changes in torch before this call
    x = torch.randn(4, 8, device="jax")

Importing this package changes nothing in torch and imports nothing heavy; `enable()` registers
the device (device.py). `torch.compile(backend="torch2jax")` is compile.py, in this folder.
"""

from __future__ import annotations

from typing import Any

__all__ = ["enable", "is_enabled", "jax_view", "jit", "jit_train_step", "torch_view"]


def enable() -> None:
    """Register the `jax` device with torch (once per process; later calls do nothing)."""
    from .device import enable as _enable

    _enable()


def is_enabled() -> bool:
    from .device import is_enabled as _is_enabled

    return _is_enabled()


def jax_view(tensor: Any) -> Any:
    """The JAX array holding a `jax` tensor's values (no copy for a contiguous tensor)."""
    from . import storage
    from .tensors import DEVICE

    if getattr(getattr(tensor, "device", None), "type", None) != DEVICE:
        raise TypeError(f"jax_view takes a tensor on the jax device, got {type(tensor).__name__} on "
                        f"{getattr(tensor, 'device', 'no device')}; move it with .to('jax') first")
    return storage.read(tensor)


def torch_view(array: Any) -> Any:
    """A tensor on the `jax` device over a JAX array (no copy); `enable()` first."""
    from .device import is_enabled as _is_enabled
    from .tensors import from_jax

    if not _is_enabled():
        raise RuntimeError("call torch2jax.eager.enable() before making jax tensors")
    return from_jax(array)


def jit(model: Any) -> Any:
    """The model's whole forward as one jax.jit-compiled function over jax tensors (module_jit.py)."""
    from .module_jit import jit as _jit

    return _jit(model)


def jit_train_step(model: Any, optimizer: Any, loss_fn: Any) -> Any:
    """`step(*batch) -> loss`: forward, JAX gradients and `optimizer.step()` as one jax.jit program
    (train_step.py); `loss_fn(model, *batch)` returns the scalar loss."""
    from .train_step import jit_train_step as _jit_train_step

    return _jit_train_step(model, optimizer, loss_fn)
