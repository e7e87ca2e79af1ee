"""DeepSeek-VL hybrid's images (fixed_images.TWO_RESOLUTIONS): each image at two resolutions (pixel_values and
high_res_pixel_values, as its processor makes them), a SigLIP tower and a SAM tower joined by the aligner
(TwoResolutionEncoder). encode_image takes both; the runtime passes generate's high_res_pixel_values as its second
input; the step is the fixed-size path's (hf/steps/vision_language.py)."""

from __future__ import annotations

from typing import Any

import torch

from ...capture.converter import StageTimer, model_from, trace
from ...capture.fx import dtype_name
from ...errors import InputSpecError
from ...generate.vision_language import VisionLanguageGenerator
from ...generate.vision_spec import VisionSpec
from ...runtime.quantize import DEFAULT_GROUP_SIZE
from .kv_cache import adopt_parts
from .vision_language import (
    IMAGES_PER_PROMPT,
    PROCESSOR_UNSUPPORTED,
    _entry_points,
    check_image_token,
    example_image_inputs,
    language_cache,
    prepared,
)


class TwoResolutionEncoder(torch.nn.Module):
    """forward(pixel_values [N, C, h, w], high_res_pixel_values [N, C, H, W]) -> features [N, tokens_per_image, hidden]:
    DeepSeek-VL hybrid's get_image_features (the low-res tower's last hidden states and the high-res tower's, its
    global-attention layer's neck added by high_res_vision_alpha, joined by the aligner)."""

    def __init__(self, vlm: torch.nn.Module):
        super().__init__()
        adopt_parts(self, vlm)  # params keep the model's own state_dict names
        object.__setattr__(self, "vlm", vlm)

    def forward(self, pixel_values: torch.Tensor, high_res_pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vlm.model.get_image_features(pixel_values, high_res_pixel_values).pooler_output


def convert_two_resolutions(vlm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None,
                            progress: Any = None, weights: Any = None, quantize: str | None = None,
                            group_size: int = DEFAULT_GROUP_SIZE) -> VisionLanguageGenerator:
    """DeepSeek-VL hybrid: encode_image over both resolutions of each image (TwoResolutionEncoder, its second input
    the high-res pixels), the causal-LM step with the features at the image tokens, as the fixed-size path
    (vision_language.convert_vision_language) builds it; the options as convert_vision_language's."""
    vlm = prepared(vlm, max_cache_len, max_batch, dtype, weights, quantize, group_size)
    config, name = vlm.config, type(vlm).__name__
    check_image_token(vlm)  # its forward embeds the image tokens
    shapes = [(int(c.num_channels), int(c.image_size), int(c.image_size))
              for c in (config.vision_config, config.high_res_vision_config)]
    dtype = next(vlm.parameters()).dtype
    encoder = TwoResolutionEncoder(vlm).eval()
    with torch.no_grad():
        probe = encoder(*(torch.zeros((1, *shape), dtype=dtype) for shape in shapes))
    tokens_per_image, feature_size = int(probe.shape[1]), int(probe.shape[2])
    hidden = int(config.get_text_config().hidden_size)
    if feature_size != hidden:
        raise InputSpecError(f"{name}'s aligner makes features of {feature_size}, its text model's hidden size is "
                             f"{hidden}: the config is inconsistent")
    language = language_cache(vlm, max_cache_len)
    timer = StageTimer(progress)
    max_images = IMAGES_PER_PROMPT * max_batch
    images = {"name": "images", "min": 1, "max": max_images}
    example = tuple(torch.zeros((2, *shape), dtype=dtype) for shape in shapes)
    encode_captured, _ = trace(encoder, example, None, ({0: images}, {0: images}), timer, what=" of the image encoder")
    encode = model_from(encode_captured, timer, weights)

    _, step_args, features, index = example_image_inputs(language.layout, max_batch, feature_size, dtype)
    rows = {"name": "image_rows", "min": 1, "max": max_images * tokens_per_image}
    dims = language.dynamic_shapes(max_batch)
    captured, _ = trace(language.step(vlm).eval(), (*step_args, features, index), None, (*dims, {0: rows}, dims[0]), timer,
                        what=" of the multimodal step")
    encode, prefill, decode = _entry_points(encode, captured, timer, weights, quantize, group_size)
    spec = language.spec(vlm, max_batch)
    vision = VisionSpec(image_token_id=int(config.image_token_id), tokens_per_image=tokens_per_image,
                        feature_size=feature_size, feature_dtype=dtype_name(dtype), pixel_shape=shapes[0],
                        max_images=max_images, processor_unsupported=PROCESSOR_UNSUPPORTED.get(name))
    return VisionLanguageGenerator(encode, prefill, decode, spec, vision)
