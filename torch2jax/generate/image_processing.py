"""Images to pixel values as transformers' PIL image processors make them (`*ImageProcessorPil`), torch-free.

The settings are the model's own image-processor config (preprocessor_config.json, or the `image_processor`
section of processor_config.json), which travels in the artifact. The steps, in transformers' order:
convert to RGB (transparency composited onto white), pad to a square (LLaVA's `do_pad`), resize with PIL
(shortest edge, or a fixed height and width), center crop, rescale (in float64, then float32), normalize.
PIL is optional (`pip install 'torch2jax-aot[vision]'`) and imported only when an image is read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputSpecError, Torch2JaxError

# the processors whose steps are the ones above (their PIL versions); others are refused by name
SUPPORTED = ("LlavaImageProcessor", "CLIPImageProcessor", "SiglipImageProcessor", "Gemma3ImageProcessor",
             "Qwen2VLImageProcessor", "GotOcr2ImageProcessor", "LlavaNextImageProcessor", "LlavaOnevisionImageProcessor",
             "DeepseekVLImageProcessor", "JanusImageProcessor", "Glm4vImageProcessor", "Glm46VImageProcessor",
             "GlmgaImageProcessor", "PixtralImageProcessor")
# resized to multiples of patch * merge, returned as flattened patches
VARIABLE_RESOLUTION = ("Qwen2VLImageProcessor", "Glm4vImageProcessor", "Glm46VImageProcessor", "GlmgaImageProcessor")
# GLM-4V's: Qwen2-VL's patches, the target size from its own smart_resize (glm_smart_resize)
GLM_RESIZE = ("Glm4vImageProcessor", "Glm46VImageProcessor", "GlmgaImageProcessor")
TILED = ("GotOcr2ImageProcessor",)  # InternVL's: with crop_to_patches, an image is several fixed-size crops (tiles)
# the whole image and a grid of tiles, with the image's size (anyres.py)
ANY_RESOLUTION = ("LlavaNextImageProcessor", "LlavaOnevisionImageProcessor")
# the longest side resized to the square size (the shorter kept at min_size or more), then padded to that square with
# the mean color (DeepSeek-VL's and Janus's processors)
LONGEST_EDGE_PADDED = ("DeepseekVLImageProcessor", "JanusImageProcessor")
# each image at its own size: shrunk to fit the longest edge, rounded up to whole patches, padded with zeros to the
# largest of the batch, with the images' sizes (Mistral3's and LightOnOCR's processors)
NATIVE_RESOLUTION = ("PixtralImageProcessor",)


def pil() -> Any:
    try:
        import PIL.Image
    except ImportError:
        raise Torch2JaxError("reading images needs Pillow: pip install 'torch2jax-aot[vision]'") from None
    return PIL.Image


def open_image(path: str | Path) -> Any:
    """A PNG/JPEG (anything PIL reads) as a PIL image, fully read."""
    Image = pil()
    try:
        with Image.open(path) as image:
            image.load()
            return image.copy()
    except (OSError, ValueError) as err:
        raise InputSpecError(f"{path} is not an image PIL can read: {err}") from None


class ImageProcessor:
    """One model's image preprocessing: `processor(images)` -> pixel values [N, C, H, W] float32."""

    def __init__(self, config: dict):
        kind = str(config.get("image_processor_type", "")).removesuffix("Pil").removesuffix("Fast")
        if kind not in SUPPORTED:
            raise Torch2JaxError(f"image processor {kind or 'of unnamed type'} is not supported (supported: {', '.join(SUPPORTED)})")
        if config.get("do_pan_and_scan"):
            raise Torch2JaxError("Gemma 3's pan-and-scan image crops are not supported: set do_pan_and_scan to false")
        if kind == "GlmgaImageProcessor" and int(config.get("patch_expand_factor") or 1) != 1:
            # its torch backend resizes to multiples of patch * merge * patch_expand_factor, its PIL backend ignores it
            raise Torch2JaxError("GlmgaImageProcessor with a patch_expand_factor other than 1 is not supported (transformers' "
                                 "two backends of it resize differently): pass pixel_values and image_grid_thw")
        self.kind = kind
        self.config = dict(config)

    @staticmethod
    def from_files(files: dict[str, Path]) -> ImageProcessor | None:
        """From preprocessor_config.json, else processor_config.json's `image_processor`; None when neither is there."""
        for name, key in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
            path = files.get(name)
            if path is None or not Path(path).is_file():
                continue
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError) as err:
                raise Torch2JaxError(f"{path} is not readable JSON: {err}") from None
            section = data.get(key) if key else data
            if isinstance(section, dict):
                return ImageProcessor(section)
        return None

    @property
    def variable_resolution(self) -> bool:
        return self.kind in VARIABLE_RESOLUTION

    def __call__(self, images: Sequence[Any]) -> np.ndarray:
        if self.variable_resolution:
            raise Torch2JaxError(f"{self.kind} makes flattened patches and a grid per image: call .patches(images)")
        return self.tiles(images)[0]

    def tiles(self, images: Sequence[Any]) -> tuple[np.ndarray, list[int]]:
        """(pixel values [tiles, C, H, W] float32, each image's number of tiles). One tile an image, but for InternVL's
        processor (GotOcr2ImageProcessorPil) with crop_to_patches: the image resized onto the grid of tiles whose
        aspect ratio is closest to its own (between min_patches and max_patches tiles), cut into those tiles in
        row-major order, and, when that is more than one, the whole image resized to one tile after them."""
        c = self.config
        if self.kind not in TILED or not c.get("crop_to_patches") or int(c.get("max_patches", 12)) <= 1:
            return np.stack([self.one(image) for image in images]), [1] * len(images)
        size = c.get("size") or {}
        tile = (int(size["height"]), int(size["width"]))
        out, counts = [], []
        for image in images:
            array = self._rgb(image)
            columns, rows = optimal_tile_grid(array.shape[1:], tile, int(c.get("min_patches", 1)), int(c.get("max_patches", 12)))
            resized = self._pil_resize(array, (tile[0] * rows, tile[1] * columns))
            crops = [resized[:, r * tile[0]:(r + 1) * tile[0], col * tile[1]:(col + 1) * tile[1]]
                     for r in range(rows) for col in range(columns)]
            if len(crops) != 1:
                crops.append(self._pil_resize(array, tile))
            out += [self._rescaled(crop) for crop in crops]
            counts.append(len(crops))
        return np.stack(out), counts

    def grid_tiles(self, images: Sequence[Any], whole_only: Sequence[bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """LLaVA-NeXT: (pixel_values [N, tiles, C, H, W] float32, image_sizes [N, 2] int64), as
        LlavaNextImageProcessorPil makes them: the image resized to fit the best grid of `image_grid_pinpoints`
        (aspect kept), padded onto it with zeros around the center, cut into tiles row by row, after the whole image
        resized to one tile; each tile resized and center-cropped as configured, rescaled and normalized; images with
        fewer tiles than the most padded with zero tiles (image_sizes says how many are real). LLaVA-OneVision's
        `whole_only` images (one of several in a prompt) are one tile: padded to a square of the mean color, resized."""
        from .anyres import best_resolution, resized_size

        if self.kind not in ANY_RESOLUTION:
            raise Torch2JaxError(f"{self.kind} does not cut images into a grid of tiles: call the processor itself")
        c = self.config
        size, crop = c.get("size") or {}, c.get("crop_size") or {}
        whole = (int(size["height"]), int(size["width"])) if size.get("height") else (int(size["shortest_edge"]),) * 2
        tile = int(crop.get("height") or size.get("height") or size["shortest_edge"])
        out, sizes = [], []
        for image, alone in zip(images, whole_only or [False] * len(images)):
            array = self._rgb(image)
            if alone:
                mean = c.get("image_mean")
                out.append(self.one(_pad_to_square(array, tuple(int(x * 255) for x in mean) if mean else 0), rgb=False)[None])
                sizes.append(array.shape[1:])
                continue
            target = best_resolution(array.shape[1:], c["image_grid_pinpoints"])
            resized = self._pil_resize(array, resized_size(array.shape[1:], target))
            (top, extra_h), (left, extra_w) = (divmod(t - r, 2) for t, r in zip(target, resized.shape[1:]))
            padded = np.pad(resized, ((0, 0), (top, top + extra_h), (left, left + extra_w)))
            crops = [self._pil_resize(array, whole)] + [padded[:, y:y + tile, x:x + tile]
                                                        for y in range(0, target[0], tile) for x in range(0, target[1], tile)]
            out.append(np.stack([self.one(crop, rgb=False) for crop in crops]))
            sizes.append(array.shape[1:])
        most = max(len(tiles) for tiles in out)
        out = [np.pad(tiles, ((0, most - len(tiles)), (0, 0), (0, 0), (0, 0))) for tiles in out]
        return np.stack(out), np.asarray(sizes, np.int64)

    def patches(self, images: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Qwen2-VL: (pixel_values [patches, C * temporal * patch * patch] float32, image_grid_thw [N, 3] int64),
        as Qwen2VLImageProcessorPil makes them: each image resized to multiples of patch * merge (smart_resize),
        rescaled, normalized, cut into patches with every merge x merge block consecutive, each patch repeated
        temporal_patch_size times."""
        if not self.variable_resolution:
            raise Torch2JaxError(f"{self.kind} makes fixed-size images: call the processor itself")
        c = self.config
        patch, merge, temporal = int(c.get("patch_size", 14)), int(c.get("merge_size", 2)), int(c.get("temporal_patch_size", 2))
        out, grids = [], []
        for image in images:
            array = np.asarray(self.one(image), np.float32)
            channels, height, width = array.shape
            gh, gw = height // patch, width // patch
            blocks = array.reshape(channels, gh // merge, merge, patch, gw // merge, merge, patch).transpose(1, 4, 2, 5, 0, 3, 6)
            blocks = np.broadcast_to(blocks[:, :, :, :, :, None], (*blocks.shape[:5], temporal, *blocks.shape[5:]))
            out.append(blocks.reshape(gh * gw, channels * temporal * patch * patch))
            grids.append([1, gh, gw])
        return np.concatenate(out, axis=0), np.asarray(grids, np.int64)

    def native(self, images: Sequence[Any], patch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pixtral: (pixel_values [N, C, H, W] float32, image_sizes [N, 2] int64), as PixtralImageProcessorPil makes
        them: each image shrunk (aspect kept, sides floored) to fit size's longest_edge, its sides rounded up to
        multiples of the patch (`patch`, as a processor passes it, else the config's patch_size), resized with PIL,
        rescaled, normalized, then padded at the bottom and right with zeros to the largest image's size."""
        if self.kind not in NATIVE_RESOLUTION:
            raise Torch2JaxError(f"{self.kind} does not take images at their own size: call the processor itself")
        c = self.config
        size = c.get("size") or {}
        if patch is None:
            given = c.get("patch_size", 16)
            patch = int(given["height"] if isinstance(given, dict) else given)
        out = []
        for image in images:
            array = self._rgb(image)
            if c.get("do_resize", True):
                array = self._pil_resize(array, pixtral_size(array.shape[1:], size, patch))
            out.append(self._rescaled(array))
        sizes = np.asarray([array.shape[1:] for array in out], np.int64)
        if c.get("do_pad", True):
            height, width = sizes.max(axis=0)
            out = [np.pad(array, ((0, 0), (0, height - array.shape[1]), (0, width - array.shape[2]))) for array in out]
        elif len({array.shape for array in out}) > 1:
            raise Torch2JaxError(f"{self.kind} with do_pad false makes images of several sizes, which cannot be one batch")
        return np.stack(out), sizes

    def one(self, image: Any, rgb: bool = True) -> np.ndarray:
        """One PIL image (or a path; with rgb=False, a [C, H, W] uint8 array already converted) -> [C, H, W] float32."""
        c = self.config
        array = self._rgb(image) if rgb else image
        if c.get("do_pad") and self.kind == "LlavaImageProcessor":
            mean = c.get("image_mean")
            array = _pad_to_square(array, tuple(int(x * 255) for x in mean) if mean else 0)
        if self.kind in LONGEST_EDGE_PADDED:
            return self._rescaled(self._longest_edge_padded(array))
        if c.get("do_resize", True):
            array = self._resize(array)
        if c.get("do_center_crop"):
            crop = c.get("crop_size") or {}
            array = _center_crop(array, int(crop["height"]), int(crop["width"]))
        return self._rescaled(array)

    def _longest_edge_padded(self, array: np.ndarray) -> np.ndarray:
        """DeepSeek-VL / Janus: the longest side resized to the square size (each side min_size or more, rounded as
        transformers rounds), then padded to the square around the center with the mean color (127 gray without one)."""
        c = self.config
        if c.get("do_resize", True):
            size = c.get("size") or {}
            if size.get("height") is None or size.get("height") != size.get("width"):
                raise Torch2JaxError(f"{self.kind} needs a square size (height == width), got {size}")
            height, width = array.shape[1:]
            scale, least = int(size["height"]) / max(height, width), int(c.get("min_size", 14))
            array = self._pil_resize(array, (max(round(height * scale), least), max(round(width * scale), least)))
        if c.get("do_pad", True):
            mean = c.get("image_mean")
            array = _pad_to_square(array, tuple(int(x * 255) for x in mean) if mean else (127, 127, 127))
        return array

    def _rgb(self, image: Any) -> np.ndarray:
        """A PIL image (or a path) as the processors start from it: [C, H, W] uint8, RGB unless told otherwise."""
        Image = pil()
        if isinstance(image, (str, Path)):
            image = open_image(image)
        if not isinstance(image, Image.Image):
            raise InputSpecError(f"images are PIL images or file paths, got {type(image).__name__}")
        array = np.array(_to_rgb(image)) if self.config.get("do_convert_rgb", True) else np.array(image)
        array = array[:, :, None] if array.ndim == 2 else array
        return np.ascontiguousarray(array.transpose(2, 0, 1))  # channels first, as the processors work

    def _rescaled(self, array: np.ndarray) -> np.ndarray:
        """Rescaled and normalized as the config says: [C, H, W] float32."""
        c = self.config
        if c.get("do_rescale", True):
            array = (array.astype(np.float64) * float(c.get("rescale_factor", 1 / 255))).astype(np.float32)
        if c.get("do_normalize", True):
            array = array if np.issubdtype(array.dtype, np.floating) else array.astype(np.float32)
            mean = np.array(_per_channel(c["image_mean"], array.shape[0]), dtype=array.dtype)
            std = np.array(_per_channel(c["image_std"], array.shape[0]), dtype=array.dtype)
            array = ((array.T - mean) / std).T
        return array.astype(np.float32)

    def _resize(self, array: np.ndarray) -> np.ndarray:
        size = self.config.get("size") or {}
        height, width = array.shape[1:]
        if self.variable_resolution:
            c = self.config
            factor = int(c.get("patch_size", 14)) * int(c.get("merge_size", 2))
            glm = self.kind in GLM_RESIZE
            low = size.get("shortest_edge") or c.get("min_pixels") or (112 * 112 if glm else 56 * 56)
            high = size.get("longest_edge") or c.get("max_pixels") or (28 * 28 * 15000 if glm else 28 * 28 * 1280)
            if glm:
                new = glm_smart_resize(height, width, factor, int(low), int(high), int(c.get("temporal_patch_size", 2)))
            else:
                new = smart_resize(height, width, factor, int(low), int(high))
        elif size.get("shortest_edge") and not size.get("longest_edge"):
            short_edge = int(size["shortest_edge"])
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = short_edge, int(short_edge * long / short)
            new = (new_long, new_short) if width <= height else (new_short, new_long)
        elif size.get("height") and size.get("width"):
            new = (int(size["height"]), int(size["width"]))
        else:
            raise Torch2JaxError(f"image processor size {size} is not supported (shortest_edge, or height and width)")
        return self._pil_resize(array, new)

    def _pil_resize(self, array: np.ndarray, new: tuple[int, int]) -> np.ndarray:
        """[C, H, W] uint8 resized with PIL to (height, width) by the config's resample filter."""
        Image = pil()
        resample = self.config.get("resample")
        resample = Image.Resampling(int(resample)) if resample is not None else Image.Resampling.BILINEAR
        hwc = array.transpose(1, 2, 0)
        picture = Image.fromarray(hwc[:, :, 0] if hwc.shape[2] == 1 else hwc)
        out = np.array(picture.resize((new[1], new[0]), resample=resample))
        out = out[:, :, None] if out.ndim == 2 else out
        return np.ascontiguousarray(out.transpose(2, 0, 1))


def pixtral_size(size: tuple[int, int], bounds: dict, patch: int) -> tuple[int, int]:
    """The (height, width) Pixtral's image processor resizes an image of `size` to: shrunk to fit the bounds (longest
    edge, or height and width; each side floored), each side then rounded up to a multiple of `patch`."""
    if bounds.get("longest_edge"):
        most = (int(bounds["longest_edge"]),) * 2
    elif bounds.get("height") and bounds.get("width"):
        most = (int(bounds["height"]), int(bounds["width"]))
    else:
        raise Torch2JaxError(f"PixtralImageProcessor size {bounds} is not supported (longest_edge, or height and width)")
    height, width = size
    ratio = max(height / most[0], width / most[1])
    if ratio > 1:
        height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
    return (height - 1) // patch * patch + patch, (width - 1) // patch * patch + patch


def optimal_tile_grid(image_size: tuple[int, int], tile: tuple[int, int], min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(columns, rows) of the tile grid whose aspect ratio is closest to the image's (height, width), between
    `min_tiles` and `max_tiles` tiles; on a tie the grid with more tiles, while the image's area is over half of the
    grid's (transformers' get_optimal_tiled_canvas for GotOcr2 / InternVL)."""
    grids = sorted(((w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if min_tiles <= w * h <= max_tiles),
                   key=lambda grid: grid[0] * grid[1])
    height, width = image_size
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for grid in grids:
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best, best_diff = grid, diff
        elif diff == best_diff and area > 0.5 * tile[0] * tile[1] * grid[0] * grid[1]:
            best = grid
    return best


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size: both sides multiples of `factor`, the area within [min_pixels, max_pixels], the
    aspect ratio kept as closely as that allows (transformers' smart_resize)."""
    if max(height, width) / min(height, width) > 200:
        raise InputSpecError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def glm_smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int,
                     temporal: int) -> tuple[int, int]:
    """GLM-4V's target size (transformers' glm4v smart_resize for one image, num_frames = temporal): Qwen2-VL's, but a
    side under `factor` first scales the image up (truncated), and the area bounds count `temporal` frames."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise InputSpecError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if temporal * h_bar * w_bar > max_pixels:
        beta = math.sqrt((temporal * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif temporal * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (temporal * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _to_rgb(image: Any) -> Any:
    """transformers' convert_to_rgb: transparency composited onto a white background."""
    Image = pil()
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image.convert("RGB")


def _per_channel(value: Any, channels: int) -> list[float]:
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)] * channels


def _pad_to_square(array: np.ndarray, background: Any) -> np.ndarray:
    channels, height, width = array.shape
    if height == width:
        return array
    size = max(height, width)
    colors = [background] * channels if isinstance(background, int) else list(background)
    out = np.zeros((channels, size, size), dtype=array.dtype)
    for i, color in enumerate(colors):
        out[i] = color
    if width > height:
        start = (size - height) // 2
        out[:, start:start + height, :] = array
    else:
        start = (size - width) // 2
        out[:, :, start:start + width] = array
    return out


def _center_crop(array: np.ndarray, crop_height: int, crop_width: int) -> np.ndarray:
    """transformers' numpy center_crop: zero-padded first where the image is smaller than the crop."""
    height, width = array.shape[1:]
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    if top >= 0 and left >= 0:
        return array[:, top:top + crop_height, left:left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    padded = np.zeros((array.shape[0], new_height, new_width), dtype=array.dtype)
    top_pad, left_pad = -(-(new_height - height) // 2), -(-(new_width - width) // 2)
    padded[:, top_pad:top_pad + height, left_pad:left_pad + width] = array
    top, left = top + top_pad, left + left_pad
    return padded[:, max(0, top):min(new_height, top + crop_height), max(0, left):min(new_width, left + crop_width)]
