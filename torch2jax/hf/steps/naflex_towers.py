"""LFM2-VL's image encoder over merge groups of patches: a SigLIP2 NaFlex tower (variable patch counts) and its pixel
unshuffle projector, one of the patch towers (hf/steps/patch_towers.py, kind "naflex"):

    forward(pixel_values [M, merge^2, C*p*p], image_ids [M], resample [M, merge^2, side^2]) -> [M, hidden]

transformers takes each image as a padded row of patches (pixel_values [images, max_patches, C*p*p] with
pixel_attention_mask and spatial_shapes), resizes its learned side x side position table to each image's grid (an
antialiased bilinear resize: each patch's weights on every table row, a matrix product in float32), attends within each
image's real patches, then joins each downsample_factor x downsample_factor block of patches (row-major, blocks
row-major: its pixel unshuffle) before a layer norm and a two-layer MLP. Here the runtime cuts the real patches out and
orders them in those blocks (generate/naflex_inputs.py), gives each patch its row of the resize (`resample`), and the
tower attends within each image through a mask from `image_ids`; the blocks' patches sit side by side for the projector.
The text model (LFM2: short convolutions that keep a recurrent state, and attention) takes plain 1-D positions.
"""

from __future__ import annotations

import torch

from .image_attention import image_mask, resampled_patches, within_image_layers
from .kv_cache import adopt_parts


class NaflexPatchEncoder(torch.nn.Module):
    """LFM2-VL's SigLIP2 tower and projector over merge groups of patches (module docstring)."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values, image_ids, resample):
        tower = self.vlm.model.vision_tower
        group = pixel_values.shape[1]
        hidden = resampled_patches(tower.embeddings, pixel_values, resample)
        hidden = tower.post_layernorm(within_image_layers(tower.encoder.layers, hidden, image_mask(image_ids, group)))
        projector = self.vlm.model.multi_modal_projector
        blocks = hidden.reshape(-1, group * hidden.shape[-1])  # each block's patches row-major, as pixel_unshuffle joins
        if projector.use_layer_norm:
            blocks = projector.layer_norm(blocks)
        return projector.linear_2(projector.act(projector.linear_1(blocks)))


def naflex_sizes(vlm: torch.nn.Module) -> tuple[int, int, int]:
    """(merge, patch_dim, position table side) of LFM2-VL's images: its downsample_factor, C*p*p, the table's side."""
    vision = vlm.config.vision_config
    patch_dim = int(vision.num_channels) * int(vision.patch_size) ** 2
    side = int(vlm.model.vision_tower.embeddings.position_embedding_size)
    return int(vlm.config.downsample_factor), patch_dim, side
