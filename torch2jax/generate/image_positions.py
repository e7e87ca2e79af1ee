"""Where image features go and the positions images take, computed in NumPy from the ids and image grids as
transformers computes them: the feature row of each image token (`image_index`), Qwen2-VL's 3-D rotary positions
(`rope_index`), and its vision encoder's per-patch inputs (`patch_positions`, Qwen2.5-VL's `patch_windows`, Qwen3-VL's
`patch_interpolation`, GLM-4V's `patch_bicubic`)."""

from __future__ import annotations

import numpy as np

from ..errors import InputSpecError


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


def table_taps(axis_taps: list, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-axis taps [(rows [patches, n], their weights), (columns, their weights)] into a side x side table -> the
    flat table rows [patches, n * n] int64 and their weights (the product of the row's and the column's) float32."""
    (rows, row_weights), (cols, col_weights) = axis_taps
    n = rows.shape[1]
    indices = (rows[:, :, None] * side + cols[:, None, :]).reshape(-1, n * n)
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, n * n)
    return indices.astype(np.int64), weights.astype(np.float32)


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
    return table_taps(taps, side)


def patch_bicubic(grids: np.ndarray, merge: int, side: int) -> tuple[np.ndarray, np.ndarray]:
    """([patches, 16] int64, [patches, 16] float32): GLM-4V's resampling of its side x side position table to each
    image's grid, as transformers' Glm4vVisionEmbeddings does it with grid_sample (bicubic, A = -0.75, align_corners
    False, border padding: each of the 4 x 4 taps clamped to the table), the flat table rows and their weights, in the
    processor's patch order. The sample points are computed in float32 as torch computes them."""
    positions = patch_positions(grids, merge)
    sizes = np.concatenate([np.repeat([[h, w]], t * h * w, axis=0) for t, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist()])
    one, half, two, a = np.float32(1), np.float32(0.5), np.float32(2), np.float32(-0.75)
    taps = []
    for axis in (0, 1):
        normed = (positions[:, axis].astype(np.float32) + half) / sizes[:, axis].astype(np.float32) * two - one
        source = ((normed + one) * np.float32(side) - one) / two  # grid_sampler_unnormalize, align_corners False
        floor = np.floor(source)
        t = (source - floor)[:, None]
        near, far = np.concatenate([t + one, t], axis=1), np.concatenate([one - t, two - t], axis=1)
        inner = lambda x: ((a + two) * x - (a + np.float32(3))) * x * x + one  # noqa: E731 |x| <= 1
        outer = lambda x: ((a * x - np.float32(5) * a) * x + np.float32(8) * a) * x - np.float32(4) * a  # noqa: E731 1 < |x| < 2
        weight = np.stack([outer(near[:, 0]), inner(near[:, 1]), inner(far[:, 0]), outer(far[:, 1])], axis=1)
        tap = np.clip(floor.astype(np.int64)[:, None] + np.arange(-1, 3), 0, side - 1)
        taps.append((tap, weight.astype(np.float32)))
    return table_taps(taps, side)
