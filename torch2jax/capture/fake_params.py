"""Build a module whose parameters are fake (shape and dtype, no storage) and whose buffers are real.

Buffers computed at construction (rotary `inv_freq`, masks, position ids) hold values the exported
graph needs; parameters only need their shape and dtype, their values come from the checkpoint
files when the artifact is written (capture/weight_source.py). Each parameter becomes a FakeTensor that
claims device cpu as it is registered: under `torch.device("meta")` or a whole FakeTensorMode the
buffers would be lost (meta) or fail to mix with real tensors. The real tensor a constructor makes
first (`torch.empty`) is never written before it is replaced, so its pages are never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode


@contextmanager
def fake_parameters() -> Iterator[FakeTensorMode]:
    """Within this block every nn.Parameter registered on a module is replaced by a fake one."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    register = torch.nn.Module.register_parameter

    def register_fake(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and not isinstance(param, FakeTensor):
            with mode:
                fake = torch.empty_strided(param.shape, param.stride(), dtype=param.dtype, device="cpu")
            param = torch.nn.Parameter(fake, requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = register_fake
    try:
        yield mode
    finally:
        torch.nn.Module.register_parameter = register


def is_fake(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, FakeTensor) or isinstance(getattr(tensor, "data", None), FakeTensor)


def has_fake_parameters(module: torch.nn.Module) -> bool:
    return any(is_fake(p) for p in module.parameters())


def to_dtype(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`module.to(dtype)` for a module with fake parameters, in place: torch's own `.to` swaps each parameter's
    tensor, which a fake one refuses. Floating params become fake params of `dtype` (of the same fake mode, tied
    ones still one Parameter), floating buffers real ones of `dtype`, as `.to` would make them."""
    converted: dict[int, torch.nn.Parameter] = {}
    for sub in module.modules():
        for name, param in list(sub._parameters.items()):
            if param is None or not param.is_floating_point() or param.dtype == dtype:
                continue
            if id(param) not in converted:
                with param.data.fake_mode if isinstance(param.data, FakeTensor) else FakeTensorMode(allow_non_fake_inputs=True):
                    fake = torch.empty_strided(param.shape, param.stride(), dtype=dtype, device="cpu")
                converted[id(param)] = torch.nn.Parameter(fake, requires_grad=param.requires_grad)
            sub._parameters[name] = converted[id(param)]
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None and buffer.is_floating_point():
                sub._buffers[name] = buffer.to(dtype)
    return module
