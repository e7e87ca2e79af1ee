"""Streamed weights: a checkpoint's tensors fused and transposed as transformers' load-time conversions make them."""

from __future__ import annotations

import numpy as np
import torch

from torch2jax.capture.checkpoint_files import Checkpoint, write
from torch2jax.capture.weight_source import LISTED, Fuse, WeightSource, mismatch_report


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


def test_the_mismatch_report_lists_the_first_names_and_counts_the_rest():
    """One report for a streamed checkpoint and one transformers loads (hf/directory.py): the unused tensors are named
    only beside a param that lacks one (alone they are harmless), and long lists are cut."""
    missing = [f"layers.{i}.w" for i in range(LISTED + 3)]
    report = mismatch_report(missing, ["layers.0.ww"], ["norm.w: 8 vs 64"], subject="S", differ="shape", closing="C")
    assert report.splitlines() == [
        "S:",
        f"  {LISTED + 3} param(s) have no tensor in the checkpoint: {', '.join(missing[:LISTED])} (and 3 more)",
        "  checkpoint tensors no param took: layers.0.ww",
        "  1 tensor(s) differ in shape:",
        "    norm.w: 8 vs 64",
        "C",
    ]
    assert "no param took" not in mismatch_report([], ["layers.0.ww"], ["norm.w: 8 vs 64"])
