"""What generation with images needs beyond a causal LM's spec, stored as the manifest's `vision` section: the image
token, the features per image, the pixel shape, and each family's image layout (variable resolution, windows, learned
position tables, tiles, any-resolution grids, images at their own size), with the any-resolution arithmetic over this
model's grids."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InputSpecError, Torch2JaxError
from .omni_positions import OmniTokens


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
    # why processor_inputs cannot build this model's prompts (its processor writes what is not reproduced here: tile
    # markers, its own prompt format); None where it can. Generation from input_ids and pixel_values is unaffected.
    processor_unsupported: str | None = None
    # GLM-4V: the position table (position_table) is resampled bicubically, as grid_sample does (align_corners False,
    # border padding); encode then takes each patch's 16 taps (patch_bicubic) in float32, not 4 bilinear ones
    bicubic_table: bool = False
    # Idefics2/3, SmolVLM: pixel_values come as [prompts, images, C, H, W] with all-zero images as padding, which
    # transformers drops; a pixel_attention_mask may come with them (vision_language.py real_images)
    image_batches: bool = False
    # Pixtral (Mistral3, LightOnOCR): > 0 is the patch side; each image is taken at its own size (image_sizes, the
    # pixels padded to the largest), cut into patches and merged `patch_merge` x `patch_merge` into tokens, row-major
    # (native_patches). pixel_shape is then [C, image_size, image_size], the config's nominal size, not a limit
    patch_size: int = 0
    patch_merge: int = 1
    # Mistral3's PixtralProcessor: an image's tokens are written a row at a time, each row followed by the first token
    # (image break), the last row by the second (image end) instead; images are resized to multiples of
    # patch_size * patch_merge. None: the image tokens alone, resized as the image processor's config says (LightOnOCR)
    image_rows: tuple[str, str] | None = None
    # variable resolution with a text model of plain 1-D positions (EXAONE 4.5): no rope index, the step takes no
    # rope_offsets
    text_positions: bool = False
    # Chameleon, Emu3: the text token id of each of their VQ-VAE's codes. encode_image then gives codes (float32,
    # feature_size 1), which the runtime maps to token ids (image_token_rows) for the step to embed
    image_vocabulary: tuple[int, ...] | None = None
    # Emu3: the token ending each row of an image's codes, patch_size its VQ-VAE's downsampling: an image of (height,
    # width) takes (height // patch_size) rows of (width // patch_size) codes and the row end
    row_end_token: int | None = None
    # variable resolution through another tower than the Qwen2-VL family's (hf/steps/patch_towers.py): the kind of
    # per-patch inputs the runtime makes for it ("raster", "resampled", "windowed", "conv": generate/patch_inputs.py);
    # "" is the Qwen2-VL family's merge-group order
    patch_tower: str = ""
    # the Omni thinkers (Qwen2.5-Omni, Qwen3-Omni-MoE): their own rope index's tokens (omni_positions.py), and audio and
    # video refused; None for every other model
    omni: OmniTokens | None = None

    @property
    def rotary_3d(self) -> bool:
        """Whether the steps take 3-D rotary position offsets (the Qwen2-VL family, GLM-4V; rope_index makes them)."""
        return bool(self.spatial_merge_size) and not self.text_positions

    def native_tokens(self, size: Any) -> int:
        """Pixtral: the image tokens an image of (height, width) pixels takes (whole merge blocks of whole patches);
        Emu3: its rows of codes, each with its row-end token."""
        side = self.patch_size * self.patch_merge
        return (int(size[0]) // side) * (int(size[1]) // side + (self.row_end_token is not None))

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

    def whole_only(self, batch_num_images: Any, images: int) -> list[bool]:
        """Which of `images` are encoded as their whole view alone: OneVision's images among several in one prompt
        (`batch_num_images`: images per prompt, as its processor returns them)."""
        if batch_num_images is None or not self.max_grid_tiles:
            return [False] * images
        counts = [int(n) for n in np.asarray(batch_num_images).reshape(-1)]
        if sum(counts) != images or min(counts, default=1) < 1:
            raise InputSpecError(f"batch_num_images {counts} must count the {images} images, at least one a prompt")
        return [n != 1 for n in counts for _ in range(n)]

    def to_json(self) -> dict:
        return {"image_token_id": self.image_token_id, "tokens_per_image": self.tokens_per_image,
                "feature_size": self.feature_size, "feature_dtype": self.feature_dtype,
                "pixel_shape": list(self.pixel_shape), "max_images": self.max_images,
                "bidirectional_images": self.bidirectional_images, "image_placeholder": self.image_placeholder,
                "image_expansion": self.image_expansion, "prefix_lm": self.prefix_lm, "prompt_format": self.prompt_format,
                "spatial_merge_size": self.spatial_merge_size, "window_size": self.window_size,
                "position_table": self.position_table, "tile_wrap": list(self.tile_wrap) if self.tile_wrap else None,
                "grid_pinpoints": [list(p) for p in self.grid_pinpoints] if self.grid_pinpoints else None,
                "max_grid_tiles": self.max_grid_tiles, "processor_unsupported": self.processor_unsupported,
                "bicubic_table": self.bicubic_table, "image_batches": self.image_batches, "patch_size": self.patch_size,
                "patch_merge": self.patch_merge, "image_rows": list(self.image_rows) if self.image_rows else None,
                "text_positions": self.text_positions,
                "image_vocabulary": list(self.image_vocabulary) if self.image_vocabulary is not None else None,
                "row_end_token": self.row_end_token, "patch_tower": self.patch_tower,
                "omni": self.omni.to_json() if self.omni is not None else None}

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
                              _pinpoints(data.get("grid_pinpoints")), int(data.get("max_grid_tiles", 0)),
                              data.get("processor_unsupported") if isinstance(data.get("processor_unsupported"), str) else None,
                              bool(data.get("bicubic_table", False)), bool(data.get("image_batches", False)),
                              int(data.get("patch_size", 0)), int(data.get("patch_merge", 1)),
                              _pair(data.get("image_rows"), "image_rows"), bool(data.get("text_positions", False)),
                              _ids(data.get("image_vocabulary")),
                              None if data.get("row_end_token") is None else int(data["row_end_token"]),
                              patch_tower=str(data.get("patch_tower") or ""), omni=OmniTokens.from_json(data.get("omni")))
        except (KeyError, TypeError, ValueError) as err:
            raise Torch2JaxError(f"the manifest's vision section is malformed ({type(err).__name__}: {err})") from None


def _pair(value: Any, name: str = "tile_wrap") -> tuple[str, str] | None:
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, str) for v in value)):
        raise TypeError(f"{name} must be two strings, got {value!r}")
    return value[0], value[1]


def _ids(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and all(isinstance(v, int) for v in value)):
        raise TypeError(f"image_vocabulary must be a list of token ids, got {type(value).__name__}")
    return tuple(value)


def image_token_rows(vision: VisionSpec, codes: Any, sizes: Any = None) -> np.ndarray:
    """Chameleon's [images, tokens, 1] or Emu3's [images, H / f, W / f] VQ codes -> the image tokens' ids as float32
    feature rows [tokens, 1], in the order transformers' get_image_features lays them out (Emu3: each image's own
    (height // f, width // f) codes, row by row, each row followed by the row-end token). A code the vocabulary does not
    reach is refused (transformers' lookup fails on it too)."""
    codes = np.asarray(codes).astype(np.int64)
    table = np.asarray(vision.image_vocabulary, np.int64)
    if codes.size and not 0 <= int(codes.min()) <= int(codes.max()) < len(table):
        raise InputSpecError(f"image codes {int(codes.min())}..{int(codes.max())} fall outside the image vocabulary of "
                             f"{len(table)} codes")
    if vision.row_end_token is None:
        return table[codes].reshape(-1, 1).astype(np.float32)
    rows = []
    for grid, (height, width) in zip(codes, np.asarray(sizes)):
        grid = table[grid[:int(height) // vision.patch_size, :int(width) // vision.patch_size]]
        rows.append(np.concatenate([grid, np.full((grid.shape[0], 1), vision.row_end_token)], axis=1).reshape(-1, 1))
    return np.concatenate(rows).astype(np.float32)


def _pinpoints(value: Any) -> tuple[tuple[int, int], ...] | None:
    if value is None:
        return None
    if not (isinstance(value, list) and value and all(isinstance(p, list) and len(p) == 2 for p in value)):
        raise TypeError(f"grid_pinpoints must be [height, width] pairs, got {value!r}")
    return tuple((int(h), int(w)) for h, w in value)
