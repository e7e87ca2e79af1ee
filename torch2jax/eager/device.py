"""Registering the `jax` device with torch: PrivateUse1 renamed, hooks, a device guard, kernels.

Nothing happens at import: `enable()` does it once per process, when the user asks.
torch registers a Python backend's hooks and device guard through
`_setup_privateuseone_for_python_backend`, which is what keeps `torch.accelerator` and
`torch.compile` healthy beside a renamed PrivateUse1.
"""

from __future__ import annotations

import torch

from . import kernels, rng
from .tensors import DEVICE

_LIBRARIES: list = []  # torch.library registrations live as long as these objects


class _Module:
    """torch.jax: what torch asks of a device module."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        rng.manual_seed(seed)

    @staticmethod
    def manual_seed(seed: int) -> None:
        rng.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: object = None) -> tuple:
        return rng.get_state()

    @staticmethod
    def set_rng_state(state: tuple, device: object = None) -> None:
        rng.set_state(state)


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def is_enabled() -> bool:
    return bool(_LIBRARIES)


def enable() -> None:
    """Make `jax` a torch device (idempotent)."""
    if _LIBRARIES:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE):
        raise RuntimeError(
            f"torch's PrivateUse1 backend is already named {current!r} by another library; "
            "the jax device needs it (one process can have one PrivateUse1 backend)"
        )
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(DEVICE, backend_module=_Module(), hook=_Hooks(), device_guard=_Guard())
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(kernels.fallback, "PrivateUse1")
    own = torch.library.Library("aten", "IMPL")
    for name in kernels.OWN_KERNELS:
        own.impl(name, kernels.kernel_for(getattr(torch.ops.aten, name).default), "PrivateUse1")
    for op in kernels.directly_registered_ops():
        own.impl(op, kernels.kernel_for(op), "PrivateUse1")
    _LIBRARIES.extend([fallback, own])
    rng.manual_seed(torch.initial_seed())
    _check_autograd_sees_the_device()


def _check_autograd_sees_the_device() -> None:
    """torch's autograd engine sizes its per-device queues once, at the first backward pass in the process; if
    that ran before enable(), every backward through a jax tensor would hit an internal assertion later. A
    one-element backward here finds out now and says what to do."""
    probe = torch.ones(1, device=DEVICE, requires_grad=True)
    try:
        (probe * 2).sum().backward()
    except RuntimeError as err:
        if "device_ready_queues_" not in str(err):
            raise
        raise RuntimeError(
            "torch2jax.eager.enable() was called after this process ran a backward pass: torch's autograd engine "
            "set up its devices then, without jax, so loss.backward() cannot run on jax tensors in this process "
            "(forward ops still work). Call te.enable() at the start of the program, before any backward()."
        ) from None

