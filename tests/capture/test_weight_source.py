"""Streamed weights: a checkpoint's tensors fused and transposed as transformers' load-time conversions make them."""

from __future__ import annotations

import numpy as np
import torch

from torch2jax.capture.checkpoint_files import Checkpoint, write
from torch2jax.capture.weight_source import Fuse, WeightSource


def _source(tmp_path, tensors: dict, fuse: Fuse) -> WeightSource:
    write(tmp_path / "model.safetensors", tensors)
    return WeightSource(Checkpoint.open(tmp_path), fuses=(fuse,))


def test_a_swap_exchanges_the_axes_of_the_stored_tensor(tmp_path):
    """Transpose(1, 2) (experts stored as [experts, in, out] for a module holding [experts, out, in]): read swapped."""
    stored = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    weights = _source(tmp_path, {"experts.w": stored}, Fuse(("experts.w",), "experts.w", None, None, (1, 2)))
    resolved = weights.resolve({"experts.w": torch.zeros(2, 4, 3)}, {})
    np.testing.assert_array_equal(resolved["experts.w"].read(), stored.swapaxes(1, 2))


def test_a_swap_of_square_axes_still_exchanges_them(tmp_path):
    """A transpose whose two axes have one length leaves the shape as it was: the values are swapped all the same."""
    stored = np.arange(18, dtype=np.float32).reshape(2, 3, 3)
    weights = _source(tmp_path, {"experts.w": stored}, Fuse(("experts.w",), "experts.w", None, None, (1, 2)))
    resolved = weights.resolve({"experts.w": torch.zeros(2, 3, 3)}, {})
    np.testing.assert_array_equal(resolved["experts.w"].read(), stored.swapaxes(1, 2))


def test_a_swap_if_needed_keeps_a_tensor_stored_as_the_module_holds_it(tmp_path):
    """Transpose(check_dims=True): the stored layout is kept where it is already the module's, swapped where not."""
    stored = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    fuse = Fuse(("experts.w",), "experts.w", None, None, (1, 2), swap_if_needed=True)
    as_module = _source(tmp_path, {"experts.w": stored}, fuse).resolve({"experts.w": torch.zeros(2, 3, 4)}, {})
    np.testing.assert_array_equal(as_module["experts.w"].read(), stored)
    swapped = _source(tmp_path, {"experts.w": stored}, fuse).resolve({"experts.w": torch.zeros(2, 4, 3)}, {})
    np.testing.assert_array_equal(swapped["experts.w"].read(), stored.swapaxes(1, 2))
