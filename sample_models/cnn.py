"""A small CNN with BatchNorm (eval mode), max pooling and a linear head.

    torch2jax convert sample_models/cnn.py:SmallCNN --out out/cnn
"""

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, kernel_size=3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(32, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(images), 1))


def make_model() -> SmallCNN:
    """Give BatchNorm non-trivial running statistics, as a trained model would have."""
    torch.manual_seed(0)
    model = SmallCNN()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model


def example_inputs():
    return (torch.randn(2, 3, 32, 32),)


def dynamic_shapes():
    return {"images": {0: "batch"}}
