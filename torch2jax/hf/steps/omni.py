"""The Omni thinkers' text + image generation: Qwen2.5-Omni's (Qwen2_5OmniThinkerForConditionalGeneration) and
Qwen3-Omni-MoE's (Qwen3OmniMoeThinkerForConditionalGeneration) thinker, the part that reads the prompt and writes text.

Their vision towers are Qwen2.5-VL's (windowed blocks; separate query, key and value projections) and Qwen3-VL's (a
learned position table, deepstack features), their text models Qwen2-VL's and Qwen3-VL-MoE's with 3-D rotary positions:
the variable-resolution path as it is (vision_language.convert_variable_resolution: PatchEncoder, the multimodal step
over `model.language_model`), with their own rope index at run time (generate/omni_positions.py: images are counted by
their vision-start tokens, not by runs of image tokens).

The audio encoder (`model.audio_tower`) reads only audio features, which the text + image path never takes: it is
left out of the traces, so the artifact holds no audio weights. Audio and video are refused at run time (their inputs,
and prompts holding their tokens)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from ...errors import InputSpecError
from ...generate.omni_positions import OmniTokens
from ...generate.vision_language import VisionLanguageGenerator
from ...runtime.quantize import DEFAULT_GROUP_SIZE
from .vision_language import convert_variable_resolution, prepared

# class name -> the rope-index variant (generate/omni_positions.py)
OMNI_VARIANTS = {"Qwen2_5OmniThinkerForConditionalGeneration": "qwen2_5_omni",
                 "Qwen3OmniMoeThinkerForConditionalGeneration": "qwen3_omni"}


def omni_tokens(vlm: torch.nn.Module) -> OmniTokens:
    """The thinker's rope-index tokens from its config; InputSpecError where one is missing (transformers' own
    get_rope_index reads each, and fails on a prompt with images without it)."""
    config, name = vlm.config, type(vlm).__name__
    names = ("vision_start_token_id", "video_token_id", "audio_token_id", "audio_start_token_id", "position_id_per_seconds")
    values = {key: getattr(config, key, None) for key in names}
    missing = [key for key, value in values.items() if value is None]
    if missing:
        raise InputSpecError(f"{name}'s config has no {', '.join(missing)}, which its rope index reads (transformers' "
                             "get_rope_index fails on a prompt with images without them): set them in the thinker "
                             "config as the checkpoint's config.json does")
    return OmniTokens(OMNI_VARIANTS[name], *(int(values[key]) for key in names))


@contextlib.contextmanager
def without_audio_tower(vlm: torch.nn.Module) -> Iterator[None]:
    """For the conversion, the thinker's inner model without its audio encoder (so no trace lifts its weights);
    restored after, in its place among the children."""
    inner = vlm.model
    children = dict(inner._modules)
    inner._modules.pop("audio_tower", None)
    try:
        yield
    finally:
        inner._modules.clear()
        inner._modules.update(children)


def convert_omni_thinker(vlm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None,
                         progress: Any = None, weights: Any = None, quantize: str | None = None,
                         group_size: int = DEFAULT_GROUP_SIZE) -> VisionLanguageGenerator:
    """An Omni thinker -> its text + image VisionLanguageGenerator: the variable-resolution conversion
    (vision_language.convert_variable_resolution) without the audio encoder, the vision spec naming the thinker's rope
    index. The options as vision_language.convert_vision_language's."""
    vlm = prepared(vlm, max_cache_len, max_batch, dtype, weights, quantize, group_size)
    omni = omni_tokens(vlm)
    with without_audio_tower(vlm):
        generator = convert_variable_resolution(vlm, max_cache_len=max_cache_len, max_batch=max_batch, progress=progress,
                                                weights=weights, quantize=quantize, group_size=group_size)
    generator.vision = dataclasses.replace(generator.vision, omni=omni)
    return generator
