"""Generation with images, torch-free: a vision-language artifact's three entry points over one params tree.

    g = torch2jax.load("out/vlm")                              # a VisionLanguageGenerator
    ids = g.generate(input_ids, pixel_values=pixels, attention_mask=mask, max_new_tokens=32)
    ids, pixels = g.processor_inputs("What is in the picture?", "cat.png")   # as the model's processor makes them

`encode_image` turns pixel values into image features; `prefill` is the causal-LM step over text embeddings
with each image token's embedding replaced by its feature row; `decode` is the causal-LM decode step. Which
feature row each image token takes is computed here from the ids, as transformers does (`image_index`): the
image tokens in row-major order take the images' features in order. Everything else (the donated cache, the
left-padded batch, the length buckets, sampling) is the causal LM's (generate/generator.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError, Torch2JaxError
from ..ir import dtypes
from ..runtime.model import Model
from ..runtime.sharding import ShardingPlan
from .generator import GenerationSpec, Generator
from .loop import call_entry, finish
from .text import ChatTemplate


@dataclass(frozen=True)
class VisionSpec:
    """What generation with images needs beyond a causal LM's spec; the manifest's `vision` section."""

    image_token_id: int
    tokens_per_image: int  # image tokens (feature rows) per image
    feature_size: int
    feature_dtype: str
    pixel_shape: tuple[int, ...]  # one image's pixel values, [C, H, W]
    max_images: int
    bidirectional_images: bool = False  # an image's tokens attend to each other both ways (Gemma 3)
    image_placeholder: str | None = None  # what the chat template writes for an image (default: the image token)
    image_expansion: str | None = None  # what the processor puts there (default: the image token, tokens_per_image times)
    prefix_lm: bool = False  # the prompt attends both ways (PaliGemma)
    prompt_format: str | None = None  # a processor without a chat template: its text, "{prompt}" the user's (PaliGemma)
    # variable resolution (Qwen2-VL): > 0 is the spatial merge; pixel_shape is then one flattened patch, an image
    # takes grid_t*grid_h*grid_w / merge^2 tokens, and the positions are 3-D (rope_index)
    spatial_merge_size: int = 0
    # Qwen2.5-VL: > 0 is the side, in merged tokens, of the windows its windowed vision blocks attend within; encode
    # then takes each merged token's window (patch_windows)
    window_size: int = 0
    # Qwen3-VL: > 0 is the side of its learned position table, resampled to each image's grid; encode then takes each
    # patch's bilinear taps (patch_interpolation)
    position_table: int = 0
    # InternVL: the tokens its processor writes before and after an image's tokens, which number tokens_per_image for
    # each of the image's tiles (its image processor cuts an image into tiles, each an image of the model)
    tile_wrap: tuple[str, str] | None = None
    # LLaVA-NeXT: the grids (height, width in pixels) an image is resized onto and cut into tiles of pixel_shape; an
    # image then takes its whole view's tokens_per_image and its grid's unpadded map with a newline per row (anyres.py)
    grid_pinpoints: tuple[tuple[int, int], ...] | None = None
    # LLaVA-OneVision ("anyres_max_N": N > 0): a grid's map of over about N tiles' features is shrunk bilinearly, and an
    # image among several in a prompt is its whole view alone (anyres.packed_taps)
    max_grid_tiles: int = 0

    # -- any resolution (grid_pinpoints): anyres.py with this model's grids, tile and feature map -------------------
    def grid_tiles(self, size: Any, alone: bool = False) -> int:
        """The tiles an image of (height, width) is encoded as (its whole view alone: 1)."""
        from .anyres import tiles_per_image

        return 1 if alone else tiles_per_image(size, self.grid_pinpoints, self.pixel_shape[1])

    def grid_tokens(self, size: Any, alone: bool = False) -> int:
        """The image tokens an image of (height, width) takes."""
        from .anyres import tokens_per_image

        return tokens_per_image(size, self.grid_pinpoints, self.pixel_shape[1], math.isqrt(self.tokens_per_image),
                                self.max_grid_tiles, alone)

    def grid_taps(self, size: Any, first: int, newline: int, alone: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """anyres.packed_taps of an image of (height, width) whose tiles' feature rows start at `first`."""
        from .anyres import packed_taps

        return packed_taps(size, self.grid_pinpoints, self.pixel_shape[1], math.isqrt(self.tokens_per_image), first,
                           newline, self.max_grid_tiles, alone)

    def to_json(self) -> dict:
        return {"image_token_id": self.image_token_id, "tokens_per_image": self.tokens_per_image,
                "feature_size": self.feature_size, "feature_dtype": self.feature_dtype,
                "pixel_shape": list(self.pixel_shape), "max_images": self.max_images,
                "bidirectional_images": self.bidirectional_images, "image_placeholder": self.image_placeholder,
                "image_expansion": self.image_expansion, "prefix_lm": self.prefix_lm, "prompt_format": self.prompt_format,
                "spatial_merge_size": self.spatial_merge_size, "window_size": self.window_size,
                "position_table": self.position_table, "tile_wrap": list(self.tile_wrap) if self.tile_wrap else None,
                "grid_pinpoints": [list(p) for p in self.grid_pinpoints] if self.grid_pinpoints else None,
                "max_grid_tiles": self.max_grid_tiles}

    @staticmethod
    def from_json(data: Any) -> VisionSpec:
        try:
            text = [data.get(k) if isinstance(data.get(k), str) else None for k in ("image_placeholder", "image_expansion")]
            prompt = data.get("prompt_format") if isinstance(data.get("prompt_format"), str) else None
            return VisionSpec(int(data["image_token_id"]), int(data["tokens_per_image"]), int(data["feature_size"]),
                              str(data["feature_dtype"]), tuple(int(d) for d in data["pixel_shape"]), int(data["max_images"]),
                              bool(data.get("bidirectional_images", False)), *text, bool(data.get("prefix_lm", False)), prompt,
                              int(data.get("spatial_merge_size", 0)), int(data.get("window_size", 0)),
                              int(data.get("position_table", 0)), _pair(data.get("tile_wrap")),
                              _pinpoints(data.get("grid_pinpoints")), int(data.get("max_grid_tiles", 0)))
        except (KeyError, TypeError, ValueError) as err:
            raise Torch2JaxError(f"the manifest's vision section is malformed ({type(err).__name__}: {err})") from None


def _pair(value: Any) -> tuple[str, str] | None:
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise TypeError(f"tile_wrap must be two strings, got {value!r}")
    return value[0], value[1]


def _pinpoints(value: Any) -> tuple[tuple[int, int], ...] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and value and all(isinstance(p, list) and len(p) == 2 for p in value)):
        raise TypeError(f"grid_pinpoints must be [height, width] pairs, got {value!r}")
    return tuple((int(h), int(w)) for h, w in value)


def image_index(ids: np.ndarray, image_token_id: int) -> np.ndarray:
    """[B, L] -> [B, L] int64: the feature row each image token takes (its rank among the image tokens in row-major
    order, as transformers' masked_scatter fills them), -1 for every other token."""
    is_image = np.asarray(ids) == image_token_id
    return np.where(is_image, np.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1, -1).astype(np.int64)


def rope_index(ids: np.ndarray, mask: np.ndarray, grids: np.ndarray, image_token_id: int,
               merge: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2-VL's multimodal rotary positions, as transformers' `get_rope_index`: ([3, B, L] int64, deltas [B]).
    Over each row's real tokens: a text token's three positions are its running position; a run of image tokens
    takes the next grid (t, h, w) of `grids` (row-major over the batch) and gets (t, row, column) of its merged
    grid, each plus the running position, which then moves on by max(h, w) / merge. Pads are 0; delta is the
    row's largest position + 1 minus its length (decode continues from there)."""
    ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
    positions = np.zeros((3, *ids.shape), np.int64)
    deltas = np.zeros(ids.shape[0], np.int64)
    grids = iter(np.asarray(grids, np.int64).reshape(-1, 3).tolist() if grids is not None else [])
    for b in range(ids.shape[0]):
        row = ids[b][mask[b]]
        is_image = row == image_token_id
        parts, current, start = [], 0, 0
        while start < len(row):
            end = start
            while end < len(row) and is_image[end] == is_image[start]:
                end += 1
            if not is_image[start]:
                parts.append(np.broadcast_to(np.arange(end - start) + current, (3, end - start)))
                current += end - start
            else:
                try:
                    t, h, w = next(grids)
                except StopIteration:
                    raise InputSpecError("the prompts hold more runs of image tokens than image_grid_thw has images") from None
                tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h // merge), np.arange(w // merge), indexing="ij")
                parts.append(np.stack([tt, hh, ww]).reshape(3, -1) + current)
                current += max(h, w) // merge
            start = end
        row_positions = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), np.int64)
        positions[:, b, mask[b]] = row_positions
        deltas[b] = (row_positions.max() + 1 if row_positions.size else 0) - len(row)
    return positions, deltas


def patch_positions(grids: np.ndarray, merge: int) -> np.ndarray:
    """[patches, 2] int64: each patch's (row, column) in its image, merge x merge blocks consecutive, as
    transformers' get_vision_position_ids orders them (and the processor the patches)."""
    out = []
    for t, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist():
        hpos, wpos = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        pairs = np.stack([hpos.reshape(shape).transpose(0, 2, 1, 3).reshape(-1),
                          wpos.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)], axis=-1)
        out.append(np.tile(pairs, (t, 1)))
    return np.concatenate(out).astype(np.int64)


def patch_windows(grids: np.ndarray, merge: int, window: int) -> np.ndarray:
    """[merged tokens] int64: the attention window of each merged token, in the processor's order (row-major over each
    image's merged grid): windows tile each image's merged grid in squares of `window` (the last row and column of
    tiles cut short), numbered across frames and images, as transformers' get_vision_window_index groups the tokens."""
    out, first = [], 0
    for t, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist():
        rows, cols = np.meshgrid(np.arange(h // merge) // window, np.arange(w // merge) // window, indexing="ij")
        across = -(-(w // merge) // window)  # tiles per row of tiles
        per_frame = -(-(h // merge) // window) * across
        out.append((first + np.arange(t)[:, None] * per_frame + (rows * across + cols).reshape(1, -1)).reshape(-1))
        first += t * per_frame
    return np.concatenate(out).astype(np.int64)


def patch_interpolation(grids: np.ndarray, merge: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """([patches, 4] int64, [patches, 4] float32): each patch's bilinear taps into a learned side x side position table
    resampled to its image's grid (align_corners, taps clamped to the border), the flat table rows and their weights,
    in the processor's patch order; as transformers' get_vision_interpolation_indices_and_weights makes them."""
    positions = patch_positions(grids, merge)
    sizes = np.concatenate([np.repeat([[h, w]], t * h * w, axis=0) for t, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist()])
    taps = []
    for axis in (0, 1):
        source = positions[:, axis].astype(np.float32) * np.float32(side - 1) / np.maximum(sizes[:, axis] - 1, 1).astype(np.float32)
        floor = np.floor(source)
        offsets = np.arange(2)
        tap = np.clip(floor.astype(np.int64)[:, None] + offsets, 0, side - 1)
        weight = np.clip(1 - np.abs(source[:, None] - floor[:, None] - offsets), 0, None).astype(np.float32)
        taps.append((tap, weight))
    (rows, row_weights), (cols, col_weights) = taps
    indices = (rows[:, :, None] * side + cols[:, None, :]).reshape(-1, 4)
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
    return indices.astype(np.int64), weights.astype(np.float32)


class VisionLanguageGenerator(Generator):
    """A vision-language model's encode_image, prefill and decode over one params tree, with `generate`."""

    TASK = "image-text-to-text"
    ENTRY_POINTS = ("prefill", "decode", "encode_image")

    def __init__(self, encode: Model, prefill: Model, decode: Model, spec: GenerationSpec, vision: VisionSpec,
                 manifest: dict | None = None, tokenizer_files: dict[str, Path] | None = None,
                 sharding: ShardingPlan | None = None):
        super().__init__(prefill, decode, spec, manifest, tokenizer_files, sharding=sharding)
        self.encode_model = encode
        self.vision = vision
        self._encode = jax.jit(lambda params, *inputs: call_entry(self.encode_model, params, *inputs))

    def entries(self) -> dict[str, Model]:
        return {"prefill": self.prefill_model, "decode": self.decode_model, "encode_image": self.encode_model}

    def encode_images(self, pixel_values: Any) -> jax.Array:
        """[N, C, H, W] pixel values -> [N, tokens_per_image, feature_size] image features (LLaVA-NeXT: N tiles ->
        their feature rows [N * tokens_per_image + 1, feature_size], the image_newline vector last)."""
        pixels = np.asarray(pixel_values)
        if pixels.ndim == 3:
            pixels = pixels[None]
        if pixels.ndim != 4 or tuple(pixels.shape[1:]) != self.vision.pixel_shape:
            raise InputSpecError(f"pixel_values must be [images, {', '.join(map(str, self.vision.pixel_shape))}] "
                                 f"(as the model's processor makes them), got {list(pixels.shape)}")
        if not 1 <= pixels.shape[0] <= self.vision.max_images:
            raise InputSpecError(f"{pixels.shape[0]} images: this artifact takes 1 to {self.vision.max_images} per call")
        return self._encode(self.params, jnp.asarray(pixels, dtypes.jax_dtype(self.vision.feature_dtype)))

    def encode_grids(self, pixel_values: Any, image_sizes: Any, batch_num_images: Any = None) -> jax.Array:
        """LLaVA-NeXT / OneVision: [images, tiles, C, H, W] pixel values (each image's whole view and grid tiles, then
        zero tiles up to the most) and image_sizes [images, 2] (height, width), as their processors make them -> the
        images' tokens' features [rows, feature_size] in order: each image's tiles encoded, then packed
        (anyres.packed_taps). OneVision's `batch_num_images` (images per prompt, as its processor returns it): an image
        among several in a prompt is its whole view alone."""
        sizes, pixels = np.asarray(image_sizes), np.asarray(pixel_values)
        if sizes.ndim != 2 or sizes.shape[1] != 2 or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 1).any():
            raise InputSpecError(f"image_sizes must be [images, 2] positive integers (height, width), got "
                                 f"{sizes.dtype}{list(sizes.shape)}")
        if pixels.ndim != 5 or pixels.shape[0] != len(sizes) or tuple(pixels.shape[2:]) != self.vision.pixel_shape:
            raise InputSpecError(f"pixel_values must be [{len(sizes)} images, tiles, {', '.join(map(str, self.vision.pixel_shape))}]"
                                 f" (as the model's processor makes them), got {list(pixels.shape)}")
        whole = self._whole_only(batch_num_images, len(sizes))
        counts = [self.vision.grid_tiles(size, alone) for size, alone in zip(sizes, whole)]
        if max(counts) > pixels.shape[1]:
            raise InputSpecError(f"image_sizes {sizes.tolist()} need {counts} tiles, pixel_values has {pixels.shape[1]} per image")
        rows = self.encode_images(np.concatenate([image[:count] for image, count in zip(pixels, counts)]))
        starts = np.cumsum([0, *counts]) * self.vision.tokens_per_image
        taps = [self.vision.grid_taps(size, int(first), rows.shape[0] - 1, alone) for size, first, alone in zip(sizes, starts, whole)]
        index, weight = (np.concatenate(parts) for parts in zip(*taps))
        if not weight[:, 1:].any():  # every token one row (LLaVA-NeXT; OneVision's maps not shrunk)
            return jnp.take(rows, jnp.asarray(index[:, 0]), axis=0)
        picked = jnp.take(rows, jnp.asarray(index.reshape(-1)), axis=0).reshape(*index.shape, rows.shape[-1])
        return (picked * jnp.asarray(weight, rows.dtype)[..., None]).sum(axis=1)

    def _whole_only(self, batch_num_images: Any, images: int) -> list[bool]:
        """Which images are their whole view alone: OneVision's images among several in one prompt."""
        if batch_num_images is None or not self.vision.max_grid_tiles:
            return [False] * images
        counts = [int(n) for n in np.asarray(batch_num_images).reshape(-1)]
        if sum(counts) != images or min(counts, default=1) < 1:
            raise InputSpecError(f"batch_num_images {counts} must count the {images} images, at least one a prompt")
        return [n != 1 for n in counts for _ in range(n)]

    def encode_patches(self, pixel_values: Any, image_grid_thw: Any) -> jax.Array:
        """Variable resolution (Qwen2-VL): [patches, patch_dim] flattened patches and [images, 3] grids, as the
        processor makes them -> [patches / merge^2, feature_size] image features, the images' in order."""
        merge = self.vision.spatial_merge_size
        grids = np.asarray(image_grid_thw)
        pixels = np.asarray(pixel_values)
        if grids.ndim != 2 or grids.shape[1] != 3 or not np.issubdtype(grids.dtype, np.integer) or (grids < 1).any():
            raise InputSpecError(f"image_grid_thw must be [images, 3] positive integers (t, h, w), got {grids.dtype}{list(grids.shape)}")
        if (grids[:, 0] != 1).any() or (grids[:, 1:] % merge).any():
            raise InputSpecError(f"image_grid_thw: each image has t = 1 (video is not supported) and h, w multiples of {merge}")
        total = int(np.prod(grids, axis=1).sum())
        if pixels.ndim != 2 or pixels.shape != (total, self.vision.pixel_shape[0]):
            raise InputSpecError(f"pixel_values must be [patches, {self.vision.pixel_shape[0]}] flattened patches, "
                                 f"{total} of them for image_grid_thw {grids.tolist()}; got {list(pixels.shape)}")
        rows = total // (merge * merge)
        if rows > self.vision.max_images:
            raise InputSpecError(f"{rows} image tokens: this artifact takes at most {self.vision.max_images} per call")
        group = merge * merge
        positions = patch_positions(grids, merge).reshape(rows, group, 2)
        image_ids = np.repeat(np.arange(len(grids)), np.prod(grids, axis=1) // group)
        dtype = dtypes.jax_dtype(self.vision.feature_dtype)
        ids = [positions, image_ids]
        if self.vision.window_size:
            ids.append(patch_windows(grids, merge, self.vision.window_size))
        taps = []
        if self.vision.position_table:
            indices, weights = patch_interpolation(grids, merge, self.vision.position_table)
            ids.append(indices.reshape(rows, group, -1))
            taps = [jnp.asarray(weights.reshape(rows, group, -1), dtype)]
        return self._encode(self.params, jnp.asarray(pixels.reshape(rows, group, -1), dtype),
                            *(jnp.asarray(i, self._id_dtype) for i in ids), *taps)

    def generate(self, input_ids: Any, attention_mask: Any = None, *, pixel_values: Any = None, image_grid_thw: Any = None,
                 image_sizes: Any = None, batch_num_images: Any = None, pixel_values_videos: Any = None,
                 token_type_ids: Any = None,
                 max_new_tokens: int = 32, do_sample: bool = False, temperature: Any = 1.0, top_k: Any = 0, top_p: Any = 1.0,
                 rng: jax.Array | None = None, eos_token_id: int | list[int] | None = None,
                 pad_token_id: int | None = None, stream: bool = False) -> np.ndarray | Iterator[np.ndarray]:
        """As transformers' generate: [B, L] ids (left-padded, with `attention_mask`) holding the image tokens the
        processor expanded, and `pixel_values` [images, C, H, W] for them in order -> [B, L + new] ids (Qwen2-VL: with
        image_grid_thw; LLaVA-NeXT and OneVision: [images, tiles, C, H, W] with image_sizes, OneVision's
        batch_num_images too for several images in a prompt). `token_type_ids` (Gemma 3's processor output) is accepted
        and not needed: the image tokens are found in the ids."""
        if pixel_values_videos is not None:
            raise InputSpecError("video inputs are not supported: give images (pixel_values)")
        merge = self.vision.spatial_merge_size
        if image_grid_thw is not None and not merge:
            raise InputSpecError("image_grid_thw is for variable-resolution models (Qwen2-VL); this model takes fixed-size images")
        if merge and pixel_values is not None and image_grid_thw is None:
            raise InputSpecError("this model takes variable-resolution images: give image_grid_thw with pixel_values, "
                                 "as its processor makes them")
        grids = self.vision.grid_pinpoints
        if (image_sizes is not None) != bool(grids and pixel_values is not None):
            raise InputSpecError("this model cuts images into grids of tiles: give image_sizes with pixel_values (its "
                                 "processor makes both), and neither without images" if grids else
                                 "image_sizes are for LLaVA-NeXT's and OneVision's images; this model takes none")
        ids, mask = self._check_prompt(input_ids, attention_mask, max_new_tokens)
        index = image_index(np.where(mask, ids, -1), self.vision.image_token_id)
        tokens = int((index >= 0).sum())
        dtype = dtypes.jax_dtype(self.vision.feature_dtype)
        if pixel_values is None:
            if tokens:
                raise InputSpecError(f"the prompts hold {tokens} image tokens but no pixel_values were given")
            features = jnp.zeros((1, self.vision.feature_size), dtype)  # one unused row: the step's input is never empty
        elif merge or grids:
            features = (self.encode_patches(pixel_values, image_grid_thw) if merge else
                        self.encode_grids(pixel_values, image_sizes, batch_num_images))
            if features.shape[0] != tokens:
                raise InputSpecError(f"image features and image tokens do not match: the images make {features.shape[0]} "
                                     f"features, the prompts hold {tokens} image tokens (id {self.vision.image_token_id})")
        else:
            encoded = self.encode_images(pixel_values)
            if encoded.shape[0] * encoded.shape[1] != tokens:
                raise InputSpecError(f"image features and image tokens do not match: {encoded.shape[0]} images make "
                                     f"{encoded.shape[0] * encoded.shape[1]} features, the prompts hold {tokens} image tokens "
                                     f"(id {self.vision.image_token_id}); expand each image's token to "
                                     f"{self.vision.tokens_per_image} as the processor does")
            features = encoded.reshape(-1, encoded.shape[-1])
        request = self._request(ids.shape[0], do_sample, temperature, top_k, top_p, rng, eos_token_id, pad_token_id)

        delta = None
        if merge:
            rope, delta = rope_index(ids, mask, image_grid_thw, self.vision.image_token_id, merge)

        def prefill_inputs(width: int) -> tuple:
            padded = np.full((ids.shape[0], width), -1, np.int64)
            padded[:, width - ids.shape[1]:] = index
            if not merge:
                return features, jnp.asarray(padded, self._id_dtype)
            padded_mask = np.zeros((ids.shape[0], width), bool)
            padded_mask[:, width - ids.shape[1]:] = mask
            offsets = np.zeros((3, ids.shape[0], width), np.int64)  # 3-D positions minus the text positions
            offsets[:, :, width - ids.shape[1]:] = rope
            offsets -= np.maximum(np.cumsum(padded_mask, axis=1) - 1, 0)[None]
            return features, jnp.asarray(padded, self._id_dtype), jnp.asarray(offsets, self._id_dtype)

        # fixed-size images: every row's image tokens stay out of the length bucket (only the text is padded to it);
        # where their count varies with the image's size (Qwen2-VL, LLaVA-NeXT), the bucket covers them (fewer prefills)
        unbucketed = 0 if merge or grids else int((index >= 0).sum(axis=1).min())
        return finish(ids, self._steps(ids, mask, max_new_tokens, request, prefill_inputs, delta, unbucketed), stream)

    def _decode_inputs(self, batch: int) -> tuple:
        """One unused feature row and no image token: decode is the prefill step with one token."""
        inputs = (jnp.zeros((1, self.vision.feature_size), dtypes.jax_dtype(self.vision.feature_dtype)),
                  jnp.full((batch, 1), -1, self._id_dtype))
        if self.vision.spatial_merge_size:  # decode's three positions are all the text position (+ the row's delta)
            inputs = (*inputs, jnp.zeros((3, batch, 1), self._id_dtype))
        return inputs

    # -- the processor, torch-free ----------------------------------------------------------
    @property
    def image_processor(self) -> Any:
        from .image_processing import ImageProcessor

        processor = ImageProcessor.from_files(self.tokenizer_files)
        if processor is None:
            raise Torch2JaxError("this artifact has no image-processor config (its model directory had no "
                                 "processor_config.json or preprocessor_config.json): pass pixel_values instead")
        return processor

    def chat_template(self) -> ChatTemplate:
        """The processor's chat template (chat_template.jinja / .json), else the tokenizer's."""
        override = self.tokenizer_files.get("chat_template.jinja")
        if override is None and "chat_template.json" in self.tokenizer_files:
            try:
                source = json.loads(Path(self.tokenizer_files["chat_template.json"]).read_text()).get("chat_template")
            except (OSError, ValueError) as err:
                raise Torch2JaxError(f"chat_template.json is not readable JSON: {err}") from None
            template = ChatTemplate.from_files(self.tokenizer_files.get("tokenizer_config.json"))
            if isinstance(source, str):
                return ChatTemplate(source, template.special_tokens if template else {})
        template = ChatTemplate.from_files(self.tokenizer_files.get("tokenizer_config.json"), override)
        if template is None:
            raise Torch2JaxError("this artifact has no chat template (no chat_template.jinja, and tokenizer_config.json "
                                 "has none): pass input_ids instead")
        return template

    def processor_inputs(self, prompt: str, image: Any) -> tuple[np.ndarray, ...]:
        """(input_ids [1, L], pixel_values [tiles, C, H, W]) for one user turn of `image` (one image, or a list of them
        in order) and `prompt`, as the model's processor makes them: the chat template (the images, the text, the
        generation prompt), each image's placeholder expanded to its tokens (`tokens_per_image`; InternVL: that many
        per tile, between its start and end tokens), tokenized; the images preprocessed as the model's image
        processor does (one tile each, but InternVL's crops).
        Variable resolution (Qwen2-VL): (input_ids, pixel_values [patches, patch_dim], image_grid_thw [images, 3]),
        each image's token repeated grid_t*grid_h*grid_w / merge^2 times, as Qwen2VLProcessor does. LLaVA-NeXT:
        (input_ids, pixel_values [images, tiles, C, H, W], image_sizes [images, 2]), each image's token repeated as
        many times as its packed features (anyres.tokens_per_image), as LlavaNextProcessor does; OneVision adds
        batch_num_images [1] (the images of this prompt)."""
        images = list(image) if isinstance(image, (list, tuple)) else [image]
        if not images:
            raise InputSpecError("processor_inputs needs at least one image")
        tokenizer = self.tokenizer
        image_token = tokenizer.id_to_token(self.vision.image_token_id)
        placeholder = self.vision.image_placeholder or image_token
        if self.vision.prompt_format is not None:  # the processor's own format, no chat template (PaliGemma)
            text = self.vision.prompt_format.replace(placeholder, placeholder * len(images)).replace("{prompt}", prompt)
        else:
            content = [{"type": "image"}] * len(images) + [{"type": "text", "text": prompt}]
            text = self.chat_template().render([{"role": "user", "content": content}], add_generation_prompt=True)
        if placeholder is None or text.count(placeholder) != len(images):
            raise Torch2JaxError(f"the chat template did not place {len(images)} image placeholder(s) ({placeholder!r}) for "
                                 f"the image(s)")
        merge, pins = self.vision.spatial_merge_size, self.vision.grid_pinpoints
        if merge:
            pixels, grids = self.image_processor.patches(images)
            counts = [int(np.prod(grid)) // (merge * merge) for grid in grids]
            expansions = [image_token * count for count in counts]
        elif pins:
            whole = self._whole_only([len(images)], len(images))
            pixels, grids = self.image_processor.grid_tiles(images, whole)
            counts = [self.vision.grid_tokens(size, alone) for size, alone in zip(grids, whole)]
            expansions = [image_token * count for count in counts]
        else:
            pixels, tiles = self.image_processor.tiles(images)
            counts = [self.vision.tokens_per_image * n for n in tiles]
            if self.vision.tile_wrap:  # InternVL: start, the image tokens of every tile, end
                expansions = [self.vision.tile_wrap[0] + image_token * count + self.vision.tile_wrap[1] for count in counts]
            else:
                expansions = [self.vision.image_expansion or image_token * count for count in counts]
        parts = text.split(placeholder)
        ids = tokenizer.encode(parts[0] + "".join(e + part for e, part in zip(expansions, parts[1:]))).ids
        if ids.count(self.vision.image_token_id) != sum(counts):
            raise Torch2JaxError("the tokenizer did not keep the image tokens whole")
        if pins and self.vision.max_grid_tiles:  # OneVision: how many images the prompt has decides their packing
            return np.asarray([ids], np.int64), pixels, grids, np.asarray([len(images)], np.int64)
        if merge or pins:
            return np.asarray([ids], np.int64), pixels, grids
        return np.asarray([ids], np.int64), pixels
