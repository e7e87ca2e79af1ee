"""transformers' vision helpers over image grids (`transformers.vision_utils`), run eagerly while tracing a model whose
grid input is fixed to its example value.

Qwen2.5-VL, GLM-4V, Video-LLaMA-3 and other variable-resolution vision towers compute their attention segments,
window order and patch positions from `image_grid_thw` with Python loops, `torch.arange` and `.tolist()`. Once the
exporter has fixed the grid (capture/specialize.py) its values are known, but torch.export treats what `torch.arange`
makes as unknown data: a window index built from it, then `unique_consecutive`, then `.tolist()` for split sizes,
stops at a data-dependent guard. The stand-ins here call the helper itself on the fixed values outside the trace and
hand its results to the graph as constants; with an unfixed grid they call it as it is (and the exporter's guard
handling fixes the grid). ERNIE-4.5-VL's resampler, which builds its frame offsets the same way in a method of its
own, gets a stand-in for that method.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...capture import trace_forwards

HELPERS = ("get_vision_cu_seqlens", "get_vision_attention_seqlens", "get_vision_position_ids", "get_vision_window_index",
           "get_vision_interpolation_indices_and_weights", "get_vision_bilinear_indices_and_weights",
           "get_vision_nearest_position_ids", "get_vision_merged_shape")


def _constant(value: Any) -> torch.Tensor | None:
    """A traced tensor's known value (a fixed input or what was computed from one), or None."""
    from torch._subclasses.fake_tensor import FakeTensor

    return value.constant if isinstance(value, FakeTensor) else None


def eager_on_fixed_grids(helper: Callable) -> Callable:
    @functools.wraps(helper)
    def stand_in(*args: Any, **kwargs: Any) -> Any:
        tensors = [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        values = [_constant(t) for t in tensors]
        if not tensors or any(v is None for v in values):
            return helper(*args, **kwargs)  # not traced, not fixed, or precomputed values passed in `kwargs`
        real = dict(zip(map(id, tensors), values))
        from torch.utils._python_dispatch import _disable_current_modes

        with _disable_current_modes():  # real tensors and real compute, unseen by the trace
            args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: real[id(t)].clone(), (args, kwargs))
            result = helper(*args, **kwargs)
            result = pytree.tree_map_only(torch.Tensor, lambda t: (t.tolist(), t.dtype), result)
        return pytree.tree_map(lambda leaf: torch.tensor(leaf[0], dtype=leaf[1]) if _is_listed(leaf) else leaf, result,
                               is_leaf=_is_listed)

    return stand_in


def _is_listed(leaf: Any) -> bool:
    return isinstance(leaf, tuple) and len(leaf) == 2 and isinstance(leaf[1], torch.dtype)


for _name in HELPERS:
    trace_forwards.register_function(f"transformers.vision_utils.{_name}", eager_on_fixed_grids)


def ernie_temporal_slicing(self: Any, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
    """ERNIE-4.5-VL's resampler pairs each video's even frames with its odd ones (an image with itself) by gathering
    rows at offsets it builds from the grid with `torch.arange`; here the offsets are Python ints from the fixed grid,
    so the gathers have static sizes."""
    merge = self.spatial_merge_size ** 2
    first, second, offset = [], [], 0
    for t, h, w in grid_thw.tolist():
        spatial = h * w // merge
        for even, odd in zip(range(0, t, 2), range(1 if t > 1 else 0, t, 2)):
            first.extend(range(offset + even * spatial, offset + (even + 1) * spatial))
            second.extend(range(offset + odd * spatial, offset + (odd + 1) * spatial))
        offset += t * h * w // merge
    first_rows = torch.tensor(first, device=hidden_states.device)
    second_rows = torch.tensor(second, device=hidden_states.device)
    return torch.cat([hidden_states.index_select(0, first_rows), hidden_states.index_select(0, second_rows)], dim=-1)


trace_forwards.register("transformers.models.ernie4_5_vl_moe.modeling_ernie4_5_vl_moe."
                        "Ernie4_5_VLMoeVariableResolutionResamplerModel", ernie_temporal_slicing, method="_temporal_slicing")
