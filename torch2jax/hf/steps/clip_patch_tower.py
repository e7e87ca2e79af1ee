"""MiniMax M3 VL's image encoder, one of the patch towers (hf/steps/patch_towers.py, kind "": the Qwen2-VL family's
flattened patches), then LLaVA's merge into the prompt.

    tower      Qwen2.5-VL's 3-D patch convolution (temporal_patch_size frames a patch), a pre-layernorm, CLIP encoder
               layers whose attention rotates the first 3 * 2 * (head_dim // 6) dims of each head by the patch's
               (t, h, w) positions (transformers' get_vision_position_ids with include_temporal: t is 0 for an image)
               and attends within each image (cu_seqlens; here a mask from `image_ids`), no post-layernorm.
    projector  each patch through a GELU MLP to the text width, then each merge x merge group of patches (consecutive in
               the processor's merge-group order) side by side through a second GELU MLP: one image token a group.
    text       a MiniMax M3 text model called with transformers' plain 1-D positions (no rope index): the step takes
               no rope_offsets (TEXT_POSITIONS).

The encoder takes what the Qwen2-VL family's does (generate/vision_language.py encode_patches): pixel_values
[M, merge^2, patch_dim], position_ids [M, merge^2, 2] (row, column) and image_ids [M] -> features [M, hidden].
"""

from __future__ import annotations

import sys

import torch

from ...errors import InputSpecError
from .image_attention import image_mask, within_image_layers
from .kv_cache import adopt_parts


class ClipPatchEncoder(torch.nn.Module):
    """MiniMax M3 VL's tower and projector over merge groups of patches (module docstring): each patch attends to its
    own image's patches through a mask from `image_ids` (transformers attends per image over cu_seqlens), with the
    tower's own projections, rotary embedding (its (t, h, w) positions, t = 0) and layer norms."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values: torch.Tensor, position_ids: torch.Tensor, image_ids: torch.Tensor) -> torch.Tensor:
        visual = self.vlm.model.vision_tower
        rotate = sys.modules[type(visual).__module__].apply_rotary_pos_emb_vision
        group = pixel_values.shape[1]
        weight = visual.embeddings.proj.weight
        hidden = visual.embeddings(pixel_values.reshape(-1, pixel_values.shape[-1]).to(weight.dtype))
        hidden = hidden.to(visual.pre_layrnorm.weight.dtype)
        spatial = position_ids.reshape(-1, 2)
        positions = torch.cat([torch.zeros_like(spatial[:, :1]), spatial], dim=-1)  # (t, h, w), t = 0 for an image
        cos, sin = visual.rotary_emb(hidden, positions)
        hidden = within_image_layers(visual.layers, visual.pre_layrnorm(hidden), image_mask(image_ids, group),
                                     lambda q, k: rotate(q, k, cos, sin))
        return self.vlm.model.multi_modal_projector(hidden)  # each group of merge^2 patches one token


def check_dense_attention(vlm: torch.nn.Module) -> None:
    """InputSpecError where MiniMax M3's text model has sparse layers ("minimax_m3_sparse": a lightning indexer picks
    key blocks, over a cache layer of its own): those are not lowered, and a wrong path is worse than a refusal."""
    types = list(getattr(vlm.config.get_text_config(), "layer_types", None) or [])
    sparse = sorted({t for t in types if t != "full_attention"})
    if sparse:
        raise InputSpecError(f"{type(vlm).__name__} with {', '.join(sparse)} layers (layer_types {types}): its "
                             "block-sparse attention (a lightning indexer choosing key blocks, kept in a cache layer of "
                             "its own) is not lowered yet; only full_attention layers are taken")
