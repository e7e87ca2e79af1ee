"""A two-layer MLP: the smallest model worth converting.

    torch2jax convert sample_models/mlp.py:MLP --out out/mlp
"""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int = 16, hidden: int = 64, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def example_inputs():
    return (torch.randn(4, 16),)


def dynamic_shapes():
    return {"x": {0: "batch"}}
