"""Unlimited-OCR's images as global views whose every row of features ends with a learned newline (hf/steps/
vision_language.py's fixed-size path):

    pixel_values [N, C, S, S] -> a SAM tower (windowed attention, relative positions, two stride-2 convolutions), a
    CLIP-like encoder over its output and the projector -> [N, q * q, hidden]; each image's q x q grid gets
    image_newline after every row and view_separator at the end -> [N, q * (q + 1) + 1, hidden]

transformers' get_image_features returns a list of per-image tensors (and reads q from the shape in Python), which
torch.export would specialize to the traced image count: this is the same computation as one tensor. Local patches
(pixel_values_local, num_local_patches, patches_grid) are refused by the runtime, as Step3p7's are.

Its text model's reference sliding-window attention (R-SWA) keeps every prompt position and a window over decoded
ones; the converted step attends causally over the whole cache, the same while the cache is no longer than the window
(hf/steps/kv_cache.py check_reference_window).
"""

from __future__ import annotations

import torch

NEWLINE_VIEWS = ("UnlimitedOcrForConditionalGeneration",)


def newline_view_features(vlm: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """UnlimitedOcrModel.get_image_features for global views alone (no local patches), as one tensor
    [N, q * (q + 1) + 1, hidden]: each row of the projected q x q grid followed by image_newline, then view_separator."""
    model = vlm.model
    features = model.multi_modal_projector(model.vision_tower(pixel_values).last_hidden_state)
    images, tokens, hidden = features.shape
    side = int(round(int(tokens) ** 0.5))
    grid = features.reshape(images, side, side, hidden)
    newline = model.image_newline.to(features.dtype)[None, None, None, :].expand(images, side, 1, hidden)
    rows = torch.cat([grid, newline], dim=2).reshape(images, side * (side + 1), hidden)
    separator = model.view_separator.to(features.dtype)[None, None, :].expand(images, 1, hidden)
    return torch.cat([rows, separator], dim=1)
