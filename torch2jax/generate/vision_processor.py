"""The model's processor, torch-free: its image processor, its chat template, and one user turn's inputs built as the
processor builds them (the template over the images and the text, each image's placeholder expanded to its tokens,
the images preprocessed). Each reads the generator's vision spec and tokenizer files when called."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputSpecError, Torch2JaxError
from .image_processing import ImageProcessor
from .text import ChatTemplate
from .vision_spec import VisionSpec


def image_processor(tokenizer_files: dict[str, Path]) -> ImageProcessor:
    """The model's image processor, from its processor_config.json or preprocessor_config.json."""
    processor = ImageProcessor.from_files(tokenizer_files)
    if processor is None:
        raise Torch2JaxError("this artifact has no image-processor config (its model directory had no "
                             "processor_config.json or preprocessor_config.json): pass pixel_values instead")
    return processor


def chat_template(tokenizer_files: dict[str, Path]) -> ChatTemplate:
    """The processor's chat template (chat_template.jinja / .json), else the tokenizer's."""
    override = tokenizer_files.get("chat_template.jinja")
    if override is None and "chat_template.json" in tokenizer_files:
        try:
            source = json.loads(Path(tokenizer_files["chat_template.json"]).read_text()).get("chat_template")
        except (OSError, ValueError) as err:
            raise Torch2JaxError(f"chat_template.json is not readable JSON: {err}") from None
        template = ChatTemplate.from_files(tokenizer_files.get("tokenizer_config.json"))
        if isinstance(source, str):
            return ChatTemplate(source, template.special_tokens if template else {})
    template = ChatTemplate.from_files(tokenizer_files.get("tokenizer_config.json"), override)
    if template is None:
        raise Torch2JaxError("this artifact has no chat template (no chat_template.jinja, and tokenizer_config.json "
                             "has none): pass input_ids instead")
    return template


def check_reproduced(vision: VisionSpec) -> None:
    """Refuses, saying why, where the model's processor writes prompts that are not reproduced here."""
    if vision.processor_unsupported:
        raise Torch2JaxError(f"torch2jax cannot build this model's prompts: {vision.processor_unsupported}; "
                             "pass input_ids and pixel_values made by its processor instead")


def processor_inputs(vision: VisionSpec, tokenizer_files: dict[str, Path], tokenizer: Any, prompt: str,
                     image: Any) -> tuple[np.ndarray, ...]:
    """(input_ids [1, L], pixel_values [tiles, C, H, W]) for one user turn of `image` (one image, or a list of them
    in order) and `prompt`, as the model's processor makes them: the chat template (the images, the text, the
    generation prompt), each image's placeholder expanded to its tokens (`tokens_per_image`; InternVL: that many
    per tile, between its start and end tokens), tokenized; the images preprocessed as the model's image
    processor does (one tile each, but InternVL's crops).
    Mistral3, LightOnOCR: (input_ids, pixel_values [images, C, H, W] padded to the largest, image_sizes [images, 2]),
    as their processors make them (native_expansion).
    Variable resolution (Qwen2-VL): (input_ids, pixel_values [patches, patch_dim], image_grid_thw [images, 3]),
    each image's token repeated grid_t*grid_h*grid_w / merge^2 times, as Qwen2VLProcessor does. LLaVA-NeXT:
    (input_ids, pixel_values [images, tiles, C, H, W], image_sizes [images, 2]), each image's token repeated as
    many times as its packed features (anyres.tokens_per_image), as LlavaNextProcessor does; OneVision adds
    batch_num_images [1] (the images of this prompt)."""
    check_reproduced(vision)
    images = list(image) if isinstance(image, (list, tuple)) else [image]
    if not images:
        raise InputSpecError("processor_inputs needs at least one image")
    if vision.prompt_format is not None:  # the processor's own format, no chat template (PaliGemma)
        placeholder = vision.image_placeholder or tokenizer.id_to_token(vision.image_token_id)
        text = vision.prompt_format.replace(placeholder, placeholder * len(images)).replace("{prompt}", prompt)
    else:
        content = [{"type": "image"}] * len(images) + [{"type": "text", "text": prompt}]
        text = chat_template(tokenizer_files).render([{"role": "user", "content": content}], add_generation_prompt=True)
    return expand_images(vision, tokenizer_files, tokenizer, text, images)


def expand_images(vision: VisionSpec, tokenizer_files: dict[str, Path], tokenizer: Any, text: str,
                  images: list[Any]) -> tuple[np.ndarray, ...]:
    """processor_inputs' outputs for a prompt `text` already rendered, holding one image placeholder per image in order
    (a chat template's rendering of messages with {"type": "image"} parts)."""
    check_reproduced(vision)
    image_token = tokenizer.id_to_token(vision.image_token_id)
    placeholder = vision.image_placeholder or image_token
    if placeholder is None or text.count(placeholder) != len(images):
        raise Torch2JaxError(f"the chat template did not place {len(images)} image placeholder(s) ({placeholder!r}) for "
                             f"the image(s)")
    merge, pins, native = vision.spatial_merge_size, vision.grid_pinpoints, vision.patch_size
    if native:  # Pixtral: each image at its own size; PixtralProcessor resizes to multiples of the merged patch
        side = vision.patch_size * vision.patch_merge
        pixels, grids = image_processor(tokenizer_files).native(images, side if vision.image_rows else None)
        counts = [vision.native_tokens(size) for size in grids]
        expansions = [native_expansion(image_token, size, side, vision.image_rows) for size in grids]
    elif merge:
        pixels, grids = image_processor(tokenizer_files).patches(images)
        counts = [int(np.prod(grid)) // (merge * merge) for grid in grids]
        expansions = [image_token * count for count in counts]
    elif pins:
        whole = vision.whole_only([len(images)], len(images))
        pixels, grids = image_processor(tokenizer_files).grid_tiles(images, whole)
        counts = [vision.grid_tokens(size, alone) for size, alone in zip(grids, whole)]
        expansions = [image_token * count for count in counts]
    else:
        pixels, tiles = image_processor(tokenizer_files).tiles(images)
        counts = [vision.tokens_per_image * n for n in tiles]
        if vision.tile_wrap:  # InternVL: start, the image tokens of every tile, end
            expansions = [vision.tile_wrap[0] + image_token * count + vision.tile_wrap[1] for count in counts]
        else:
            expansions = [vision.image_expansion or image_token * count for count in counts]
    parts = text.split(placeholder)
    ids = tokenizer.encode(parts[0] + "".join(e + part for e, part in zip(expansions, parts[1:]))).ids
    if ids.count(vision.image_token_id) != sum(counts):
        raise Torch2JaxError("the tokenizer did not keep the image tokens whole")
    if pins and vision.max_grid_tiles:  # OneVision: how many images the prompt has decides their packing
        return np.asarray([ids], np.int64), pixels, grids, np.asarray([len(images)], np.int64)
    if merge or pins or native:
        return np.asarray([ids], np.int64), pixels, grids
    return np.asarray([ids], np.int64), pixels


def native_expansion(image_token: str, size: Any, side: int, rows: tuple[str, str] | None) -> str:
    """What a Pixtral-tower processor writes for an image of (height, width) pixels, `side` pixels a token: its image
    tokens, row by row; with `rows` (Mistral3's PixtralProcessor: image break, image end) each row followed by the
    break token, the last by the end token instead."""
    height, width = int(size[0]) // side, int(size[1]) // side
    if rows is None:
        return image_token * (height * width)
    return rows[0].join([image_token * width] * height) + rows[1]
