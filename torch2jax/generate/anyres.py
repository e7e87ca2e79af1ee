"""LLaVA-NeXT's "anyres" images, torch-free: which grid of tiles an image is cut into, and how the tiles' features are
packed into the image's tokens.

The processor resizes an image onto the grid (of `image_grid_pinpoints`) that keeps most of its resolution, cuts it
into tiles of the vision tower's size, and puts the whole image, resized to one tile, first. The model encodes every
tile, lays the grid tiles' feature maps out as one map, crops the rows (or columns) that are padding, appends the
`image_newline` vector after each row, flattens it, and puts the whole image's features first. transformers does
that packing in Python per image (pack_image_features); here it is a row index into the encoded tiles' features
(`packed_rows`), so the artifact's encoder stays one batched call.

LLaVA-OneVision ("anyres_max_N") then shrinks a map of more than about N tiles' features bilinearly (torch's
interpolate, align_corners=False) before the newlines: each of its rows is a weighted sum of four rows of the map
(`packed_taps`). An image among several in one prompt is not cut at all: its whole view and a newline.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def best_resolution(size: Sequence[int], pinpoints: Sequence[Sequence[int]]) -> tuple[int, int]:
    """(height, width) of the pinpoint that keeps most of the image's (height, width) resolution, then wastes least
    (transformers' select_best_resolution)."""
    height, width = int(size[0]), int(size[1])
    best, most, least = None, 0, math.inf
    for target_height, target_width in pinpoints:
        scale = min(target_width / width, target_height / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = target_width * target_height - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (int(target_height), int(target_width)), effective, wasted
    if best is None:
        raise ValueError(f"no resolution among {list(pinpoints)} fits an image of {height}x{width}")
    return best


def grid_shape(size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile: int) -> tuple[int, int]:
    """(rows, columns) of tiles an image of (height, width) is cut into (get_anyres_image_grid_shape)."""
    height, width = best_resolution(size, pinpoints)
    return height // tile, width // tile


def tiles_per_image(size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile: int) -> int:
    """The whole image's tile and the grid's (image_size_to_num_patches)."""
    rows, columns = grid_shape(size, pinpoints, tile)
    return 1 + rows * columns


def resized_size(size: Sequence[int], target: Sequence[int]) -> tuple[int, int]:
    """(height, width) an image is resized to before it is padded onto `target` (get_patch_output_size)."""
    height, width = int(size[0]), int(size[1])
    target_height, target_width = int(target[0]), int(target[1])
    scale_w, scale_h = target_width / width, target_height / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_height), target_width
    return target_height, min(math.ceil(width * scale_h), target_width)


def unpadded_span(size: Sequence[int], rows: int, columns: int) -> tuple[int, int, int, int]:
    """(first row, row count, first column, column count) of a rows x columns feature map that is the image, not the
    padding around it (unpad_image: the side the aspect ratio left short loses `padding` at each end)."""
    height, width = int(size[0]), int(size[1])
    if width / height > columns / rows:
        new_height = int(round(height * (columns / width), 7))
        padding = (rows - new_height) // 2
        return padding, rows - 2 * padding, 0, columns
    new_width = int(round(width * (rows / height), 7))
    padding = (columns - new_width) // 2
    return 0, rows, padding, columns - 2 * padding


def packed_rows(size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile: int, side: int, first: int,
                newline: int) -> np.ndarray:
    """The rows of one image's features, in the order of its tokens: indices into the encoded tiles' features
    flattened to [tiles * side * side, hidden], this image's tiles starting at row `first`, and `newline` for the
    image_newline vector. The whole image's side*side rows come first; then the grid's map row by row, each row
    followed by a newline."""
    rows, columns = grid_shape(size, pinpoints, tile)
    base = first + np.arange(side * side)
    if rows * columns == 0:
        return np.concatenate([base, [newline]]).astype(np.int64)
    y = np.arange(rows * side)[:, None]  # the position on the grid's map
    x = np.arange(columns * side)[None, :]
    tile_of = 1 + (y // side) * columns + x // side  # the whole image is tile 0
    row = first + tile_of * side * side + (y % side) * side + x % side
    top, height, left, width = unpadded_span(size, rows * side, columns * side)
    row = row[top:top + height, left:left + width]
    row = np.concatenate([row, np.full((height, 1), newline)], axis=1)
    return np.concatenate([base, row.reshape(-1)]).astype(np.int64)


def packed_taps(size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile: int, side: int, first: int, newline: int,
                max_tiles: int = 0, whole_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(index [tokens, 4], weight [tokens, 4] float32): each of one image's tokens as a weighted sum of four feature
    rows (indexed as in packed_rows). A map over max_tiles * side^2 by more than 1.1^2 is shrunk by 1 / ratio per
    side, as LLaVA-OneVision's pack_image_features does (max_tiles 0: never); `whole_only` (an image among several in
    a prompt): the whole view's rows and a newline."""
    if whole_only:
        index = np.concatenate([first + np.arange(side * side), [newline]]).astype(np.int64)
        return _single(index)
    rows = packed_rows(size, pinpoints, tile, side, first, newline)
    grid_rows, grid_columns = grid_shape(size, pinpoints, tile)
    _, height, _, width = unpadded_span(size, grid_rows * side, grid_columns * side)
    shrunk = _shrunk(height, width, side, max_tiles)
    if shrunk is None:
        return _single(rows)
    base, grid = rows[:side * side], rows[side * side:].reshape(height, width + 1)[:, :width]
    (y0, y1, wy0, wy1), (x0, x1, wx0, wx1) = (_bilinear(n, m) for n, m in zip((height, width), shrunk))
    index = np.stack([grid[y0][:, x0], grid[y0][:, x1], grid[y1][:, x0], grid[y1][:, x1]], axis=-1)
    weight = np.stack([np.outer(wy0, wx0), np.outer(wy0, wx1), np.outer(wy1, wx0), np.outer(wy1, wx1)], axis=-1)
    index = np.concatenate([index, np.full((shrunk[0], 1, 4), newline)], axis=1).reshape(-1, 4)
    weight = np.concatenate([weight, np.tile(np.float32([1, 0, 0, 0]), (shrunk[0], 1, 1))], axis=1).reshape(-1, 4)
    base_index, base_weight = _single(base)
    return np.concatenate([base_index, index]).astype(np.int64), np.concatenate([base_weight, weight]).astype(np.float32)


def tokens_per_image(size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile: int, side: int, max_tiles: int = 0,
                     whole_only: bool = False) -> int:
    """How many image tokens the processor writes for an image of (height, width) (_get_number_of_features)."""
    if whole_only:
        return side * side + 1
    rows, columns = grid_shape(size, pinpoints, tile)
    _, height, _, width = unpadded_span(size, rows * side, columns * side)
    height, width = _shrunk(height, width, side, max_tiles) or (height, width)
    return side * side + height * (width + 1)


def _shrunk(height: int, width: int, side: int, max_tiles: int) -> tuple[int, int] | None:
    """The (height, width) LLaVA-OneVision shrinks a height x width map to, or None where it keeps it."""
    if not max_tiles:
        return None
    ratio = math.sqrt(height * width / (max_tiles * side**2))
    return (int(height // ratio), int(width // ratio)) if ratio > 1.1 else None


def _bilinear(size: int, out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lower, upper, lower's weight, upper's weight) along one axis of torch's bilinear interpolate from `size` to
    `out` points (align_corners=False), computed in float32 as torch does."""
    scale = np.float32(size) / np.float32(out)
    source = np.maximum(scale * (np.arange(out, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5), np.float32(0))
    lower = source.astype(np.int64)
    upper = np.minimum(lower + 1, size - 1)
    high = (source - lower).astype(np.float32)
    return lower, upper, (np.float32(1) - high).astype(np.float32), high


def _single(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each token one row, as four taps of which the first weighs 1."""
    weight = np.zeros((len(index), 4), np.float32)
    weight[:, 0] = 1
    return np.repeat(index[:, None], 4, axis=1).astype(np.int64), weight
