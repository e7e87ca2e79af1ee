"""Multimodal rotary positions (M-RoPE) of the Qwen2-VL family, in a form torch.export can capture.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, GLM-4V, GLM-OCR, ERNIE-4.5-VL, PaddleOCR-VL and their relatives compute
3-D positions in `get_rope_index` by walking each row's token types in Python (`itertools.groupby` over
`mm_token_type_ids.tolist()`): a run of text tokens counts on from the current position in all three dims; an
image or video run takes (time, row, column) positions over its merged patch grid, offset by the current
position, and moves it on by max(height, width) / merge. torch.export stops at the `.tolist()`.

The stand-in here computes the same positions with tensor ops over the whole batch: runs are found by comparing
each valid token's type with the previous valid token's, and the text before a token and the vision runs before it
are running sums. What it needs in Python are only the grids (`image_grid_thw`, `video_grid_thw`), which the
exporter fixes to their example values when the vision tower reads them (capture/specialize.py), so an artifact
refuses other image sizes but takes any placement of the image tokens in the prompt, any padding and any batch.

It assumes what the processors produce: each image or video is one run of its tokens (two images touching with no
token between them would be one run; transformers would then fail on a size mismatch).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ...capture import trace_forwards

TEXT, IMAGE, VIDEO = 0, 1, 2


@dataclass(frozen=True)
class Variant:
    """How a model's get_rope_index differs from Qwen2-VL's."""

    split_video_frames: bool = False  # each video frame is its own run (timestamps between frames)
    seconds_per_grid: bool = False  # Qwen2.5-VL: video time positions spaced by tokens_per_second * seconds per grid
    temporal_merge: bool = False  # ERNIE-4.5-VL: video frames merged in time by vision_config.temporal_merge_size


_FRAMES = Variant(split_video_frames=True)
VARIANTS: dict[str, Variant] = {
    "qwen2_vl.modeling_qwen2_vl.Qwen2VLModel": Variant(),
    "paddleocr_vl.modeling_paddleocr_vl.PaddleOCRVLModel": Variant(),
    "qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLModel": Variant(seconds_per_grid=True),
    "ernie4_5_vl_moe.modeling_ernie4_5_vl_moe.Ernie4_5_VLMoeModel": Variant(temporal_merge=True),
    "qwen3_vl.modeling_qwen3_vl.Qwen3VLModel": _FRAMES,
    "qwen3_vl_moe.modeling_qwen3_vl_moe.Qwen3VLMoeModel": _FRAMES,
    "qwen3_5.modeling_qwen3_5.Qwen3_5Model": _FRAMES,
    "qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeModel": _FRAMES,
    "glm4v.modeling_glm4v.Glm4vModel": _FRAMES,
    "glm46v.modeling_glm46v.Glm46VModel": _FRAMES,
    "glm4v_moe.modeling_glm4v_moe.Glm4vMoeModel": _FRAMES,
    "glm_ocr.modeling_glm_ocr.GlmOcrModel": _FRAMES,
    "cohere_compass.modeling_cohere_compass.CohereCompassModel": _FRAMES,
    "cosmos3_edge.modeling_cosmos3_edge.Cosmos3EdgeModel": _FRAMES,
    "cosmos3_omni.modeling_cosmos3_omni.Cosmos3OmniModel": _FRAMES,
    "qwen4_exp.modeling_qwen4_exp.Qwen4ExpModel": _FRAMES,
}


def _grid_items(grid: torch.Tensor | None, merge: int, temporal_merge: int, intervals: list[float] | None,
                split_frames: bool) -> list[tuple[int, int, int, int, float]]:
    """(t, h, w, advance, time interval) of each image or video in the order the runs take them."""
    if grid is None:
        return []
    rows = [[int(v) for v in row] for row in grid.tolist()]
    if split_frames:
        rows = [[1, h, w] for t, h, w in rows for _ in range(t)]
    intervals = intervals or [1] * len(rows)
    return [(t // temporal_merge, h // merge, w // merge, max(h, w) // merge, interval)
            for (t, h, w), interval in zip(rows, intervals)]


def _table(items: list[tuple], column: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    values = [item[column] for item in items] or [1]  # one placeholder row where a modality has no items
    return torch.tensor(values, dtype=dtype, device=device)


def mrope_positions(mm_token_type_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    images: list[tuple], videos: list[tuple], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids [3, B, T] and mrope_position_deltas [B, 1], as the Qwen2-VL family's get_rope_index makes them,
    for the image and video items of _grid_items."""
    types = mm_token_type_ids.long()
    batch, length = types.shape
    device = types.device
    valid = torch.ones_like(types, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    index = torch.arange(length, device=device).expand(batch, length)
    # runs of one type over the valid tokens: a run starts where a token's type differs from the previous valid token's
    last_valid = torch.cummax(torch.where(valid, index, -1), dim=1).values
    previous = torch.cat([torch.full_like(last_valid[:, :1], -1), last_valid[:, :-1]], dim=1)
    previous_type = types.gather(1, previous.clamp(min=0))
    start = valid & ((previous < 0) | (previous_type != types))
    run_start = torch.cummax(torch.where(start, index, 0), dim=1).values
    compact = torch.cumsum(valid.long(), dim=1) - 1  # each token's index among its row's valid tokens
    within = compact - compact.gather(1, run_start)  # a token's index within its run

    is_text = valid & (types == TEXT)
    text_before = torch.cumsum(is_text.long(), dim=1) - is_text.long()
    fields = {}
    for modality, items in ((IMAGE, images), (VIDEO, videos)):
        # the k-th run of this modality, counted in row-major order over the batch, takes the k-th item
        starts = (start & (types == modality)).long().reshape(-1)
        item = (torch.cumsum(starts, dim=0).reshape(batch, length).gather(1, run_start) - 1).clamp(0, max(len(items) - 1, 0))
        fields[modality] = [_table(items, c, torch.long, device)[item] for c in range(4)]
        fields[modality].append(_table(items, 4, torch.float32, device)[item])
    is_video = types == VIDEO
    t, h, w, advance, interval = (torch.where(is_video, v, i) for i, v in zip(fields[IMAGE], fields[VIDEO]))
    is_vision = valid & ((types == IMAGE) | is_video)
    advanced = torch.cumsum(torch.where(start & is_vision, advance, 0), dim=1)  # by vision runs so far, this one too
    base = text_before + advanced - torch.where(is_vision, advance, 0)
    plane = h * w
    t_index, h_index, w_index = within // plane, (within % plane) // w, within % w
    time = (t_index.to(torch.float32) * interval).long() + base
    positions = torch.stack([torch.where(is_vision, time, base), torch.where(is_vision, h_index + base, base),
                             torch.where(is_vision, w_index + base, base)])
    positions = torch.where(valid, positions, 0)
    deltas = positions.amax(dim=(0, 2)) + 1 - valid.long().sum(dim=1)
    return positions.to(dtype), deltas[:, None]


def get_rope_index(self: Any, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor | None = None,
                   image_grid_thw: torch.Tensor | None = None, video_grid_thw: torch.Tensor | None = None,
                   attention_mask: torch.Tensor | None = None, second_per_grid_ts: torch.Tensor | None = None,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for the model's own get_rope_index while torch.export traces it (same arguments, same result)."""
    variant = VARIANTS[_key(type(self))]
    if mm_token_type_ids is None or kwargs:
        return type(self).get_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw=image_grid_thw,
                                         video_grid_thw=video_grid_thw, attention_mask=attention_mask, **kwargs)
    vision = self.config.vision_config
    merge = vision.spatial_merge_size
    images = _grid_items(image_grid_thw, merge, 1, None, split_frames=False)
    intervals = None
    if variant.seconds_per_grid and video_grid_thw is not None:
        seconds = second_per_grid_ts.tolist() if second_per_grid_ts is not None else [1] * len(video_grid_thw)
        intervals = [vision.tokens_per_second * s for s in seconds]
    temporal = vision.temporal_merge_size if variant.temporal_merge else 1
    videos = _grid_items(video_grid_thw, merge, temporal, intervals, split_frames=variant.split_video_frames)
    return mrope_positions(mm_token_type_ids, attention_mask, images, videos, input_ids.dtype)


def _key(cls: type) -> str:
    return cls.__module__.removeprefix("transformers.models.") + "." + cls.__qualname__


def _takes_token_types(cls: type) -> bool:
    """The stand-in follows the signature of transformers 5 (token types in, `mm_token_type_ids`)."""
    return "mm_token_type_ids" in inspect.signature(cls.get_rope_index).parameters


for _name in VARIANTS:
    trace_forwards.register(f"transformers.models.{_name}", get_rope_index, method="get_rope_index",
                            applies=_takes_token_types)
