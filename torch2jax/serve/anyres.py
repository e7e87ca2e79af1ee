"""LLaVA-NeXT's "anyres" images, torch-free: which grid of tiles an image is cut into, and how the tiles' features are
packed into the image's tokens.

The processor resizes an image onto the grid (of `image_grid_pinpoints`) that keeps most of its resolution, cuts it
into tiles of the vision tower's size, and puts the whole image, resized to one tile, first. The model encodes every
tile, lays the grid tiles' feature maps out as one map, crops the rows (or columns) that are padding, appends the
`image_newline` vector after each row, flattens it, and puts the whole image's features first. transformers does
that packing in Python per image (pack_image_features); here it is a row index into the encoded tiles' features
(`packed_rows`), so the artifact's encoder stays one batched call.
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


def tokens_per_image(size: Sequence[int], pinpoints: Sequence[Sequence[int]], tile: int, side: int) -> int:
    """How many image tokens the processor writes for an image of (height, width) (_get_number_of_features)."""
    rows, columns = grid_shape(size, pinpoints, tile)
    _, height, _, width = unpadded_span(size, rows * side, columns * side)
    return side * side + height * (width + 1)
