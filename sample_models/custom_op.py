"""A model that uses its own torch.library custom op, and the JAX lowering that converts it.

    torch2jax convert sample_models/custom_op.py:SoftClipNet --lowerings sample_models/custom_op_lowerings.py --out out/softclip
"""

import torch
from torch import nn


@torch.library.custom_op("samples::soft_clip", mutates_args=())
def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
    """Smoothly limit values to (-limit, limit)."""
    return limit * torch.tanh(x / limit)


@soft_clip.register_fake
def _(x, limit):
    return torch.empty_like(x)


class SoftClipNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.samples.soft_clip(self.fc(x), 2.0)


def example_inputs():
    return (torch.randn(4, 8) * 3,)


def dynamic_shapes():
    return {"x": {0: "batch"}}
