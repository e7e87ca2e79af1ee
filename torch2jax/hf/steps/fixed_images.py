"""Vision-language families whose images are fixed-size (or tiled fixed-size) and whose features go to image-token
positions, each through hf/steps/vision_language.py's three entry points with what it needs of its own:

    Qianfan-OCR     InternVL's layout: an InternViT-like tower, a pixel shuffle and a projector over GotOcr2's tiles
                    (get_image_features); its processor writes each image's tokens between start and end tokens, as
                    InternVL's does, where its chat template wrote `image_placeholder_token` (image_placeholder).
    Inkling         each image cut by its processor into patches [patches, temporal, p, p, C] (channels last, each
                    frame repeated), each patch one image token: an "image" of the entry points is a patch
                    (pixel_shape, TOKEN_PER_IMAGE); its audio inputs are refused at generate (the runtime takes none).
    DeepSeek-VL     hybrid: each image at two resolutions (TWO_RESOLUTIONS), converted in hf/steps/two_resolutions.py.
    Step3p7         its global views (GLOBAL_VIEWS: step3p7_tower, its rotary positions from the fixed grid).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# models whose every "image" (a patch of their processor's) is one image token: the most images a call takes is the
# most image tokens, every one in a prompt (max_batch * max_cache_len)
TOKEN_PER_IMAGE = ("InklingForConditionalGeneration",)


# families of this file whose forward embeds the input ids as they are, image tokens included, before replacing them
EMBEDS_IMAGE_TOKENS = ("QianfanOCRForConditionalGeneration", "InklingForConditionalGeneration",
                       "DeepseekVLHybridForConditionalGeneration", "Step3p7ForConditionalGeneration",
                       "UnlimitedOcrForConditionalGeneration")


def pixel_shape(vlm: Any) -> tuple[int, ...] | None:
    """The shape of one image of `vlm`'s pixel_values where it is not [C, image_size, image_size]: Inkling's patch
    [temporal_patch_size, patch_size, patch_size, C] (its processor's layout, channels last); None otherwise."""
    if type(vlm).__name__ == "UnlimitedOcrForConditionalGeneration":  # its SAM tower's size (hf/steps/newline_views.py)
        sam = vlm.config.vision_config.sam_config
        return int(sam.num_channels), int(sam.image_size), int(sam.image_size)
    if type(vlm).__name__ not in TOKEN_PER_IMAGE:
        return None
    vision = vlm.config.vision_config
    patch = int(vision.patch_size)
    return int(vision.temporal_patch_size), patch, patch, int(vision.num_channels)


def image_placeholder(directory: Path) -> str | None:
    """What the model's chat template writes for an image, where its processor names a placeholder other than the
    image token (QianfanOCRProcessor's image_placeholder_token, "<image>" by default, replaced by the start token,
    the image tokens and the end token); None otherwise (InternVL: the image token itself)."""
    try:
        config = json.loads((directory / "processor_config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or config.get("processor_class") != "QianfanOCRProcessor":
        return None
    placeholder = config.get("image_placeholder_token", "<image>")
    return placeholder if isinstance(placeholder, str) else None


# models whose every image comes at two resolutions, each through its own tower (DeepSeek-VL hybrid: a SigLIP tower on
# pixel_values, a SAM tower on high_res_pixel_values), their features joined by the aligner: one token per low-res patch
TWO_RESOLUTIONS = ("DeepseekVLHybridForConditionalGeneration",)


# models whose image is a global view and optional local patches (Step3p7: pixel_values, pixel_values_local,
# num_local_patches); the global views are taken, local patches refused at generate (an unknown input)
GLOBAL_VIEWS = ("Step3p7ForConditionalGeneration",)


def global_view_features(vlm: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """Step3p7's get_image_features for images without local patches (num_local_patches all 0), as one tensor
    [N, tokens_per_image, hidden] (transformers' is a list of per-image tensors, which torch.export would specialize
    to the traced image count): the tower (its downsampling convolutions included), projected."""
    model = vlm.model
    return model.multi_modal_projector(step3p7_tower(model.vision_model, pixel_values))


def step3p7_tower(tower: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """Step3p7VisionModel.forward with its (row, column) rotary positions built from the image's (fixed) grid as
    Python ints: transformers reads them from a grid tensor (.tolist()), which torch.export cannot trace."""
    batch, _, height, width = pixel_values.shape
    patch = tower.embeddings.patch_size
    rows, cols = int(height) // patch, int(width) // patch
    hidden = tower.pre_layernorm(tower.embeddings(pixel_values, interpolate_pos_encoding=True))
    grid_h, grid_w = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    positions = torch.stack([grid_h.reshape(-1), grid_w.reshape(-1)], dim=-1).to(hidden.device)
    embeddings = tower.rotary_emb(hidden, positions)
    for layer in tower.layers:
        hidden = layer(hidden, position_embeddings=embeddings)
    hidden = hidden.permute(0, 2, 1).reshape(batch, hidden.shape[-1], rows, cols)
    hidden = tower.downsampler2(tower.downsampler1(hidden))
    return hidden.flatten(2).permute(0, 2, 1)
