"""A UNet-style network: strided and dilated convs, GroupNorm and BatchNorm, a transposed conv,
bilinear upsampling, average pooling and a skip connection.

    torch2jax convert sample_models/unet.py:TinyUNet --out out/unet
"""

import torch
import torch.nn.functional as F
from torch import nn


class TinyUNet(nn.Module):
    def __init__(self, channels: int = 8, out_channels: int = 2):
        super().__init__()
        c = channels
        self.down1 = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.GroupNorm(2, c), nn.SiLU())
        self.down2 = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU())
        self.mid = nn.Conv2d(2 * c, 2 * c, 3, padding=2, dilation=2)
        self.up = nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1)
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.out = nn.Conv2d(2 * c, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d1 = self.down1(x)
        d2 = self.down2(d1)
        u = self.up(self.mid(d2))
        skip = F.avg_pool2d(self.up2(d1), 2)
        return self.out(torch.cat([u, skip], dim=1))


def example_inputs():
    return (torch.randn(2, 3, 16, 16),)


def dynamic_shapes():
    return {"x": {0: "batch"}}
