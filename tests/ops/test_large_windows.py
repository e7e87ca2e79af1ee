"""A pooling window larger than its (padded) input, as EfficientNet's `AvgPool2d(hidden_dim, ceil_mode=True)` takes one
over an 8x8 map: torch clips the window to the input; the lowering must not pad the input out to the window."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
import torch

import torch2jax


@pytest.mark.parametrize("pool", [torch.nn.AvgPool2d(2560, ceil_mode=True), torch.nn.MaxPool2d(300, ceil_mode=True),
                                  torch.nn.AvgPool2d(300, padding=1, ceil_mode=True, count_include_pad=False)], ids=repr)
def test_a_window_larger_than_the_input_pools_the_whole_input(pool):
    x = torch.randn(3, 16, 8, 8)
    model = torch2jax.convert(pool, (x,))
    np.testing.assert_allclose(np.asarray(model(x.numpy())), pool(x).numpy(), rtol=1e-5, atol=1e-6)
    text = jax.jit(lambda p, v: model.apply(p, v)).lower(model.params, x.numpy()).as_text()
    windows = re.findall(r"(?:window_dimensions = array<i64: ([\d, ]+)>|padding = dense<([^>]+)>)", text)
    sizes = [int(v) for groups in windows for group in groups for v in re.findall(r"\d+", group)]
    assert max(sizes, default=0) <= 10  # no window, nor padding, the size of the kernel: the 8x8 input (+1) at most
