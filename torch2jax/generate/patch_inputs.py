"""Per-patch encoder inputs, torch-free, for the variable-resolution towers of hf/steps/patch_towers.py whose processor
lays out the patches otherwise than the Qwen2-VL family's (vision_spec.patch_tower):

    "raster"  PaddleOCR-VL: pixel_values [patches, C, p, p], each image's patches row by row. The encoder takes them in
              merge groups (each merge x merge block's patches consecutive, row-major), the order its projector joins
              them in; every other part of the tower is per patch or attends within the image, which the order does
              not change. Its learned position table is resampled to each image's grid by bilinear taps at half-pixel
              centres (transformers' get_vision_interpolation_indices_and_weights, align_corners False). Kimi K2.5
              the same, its table's taps bicubic (the spec's bicubic_table: 16 taps, in float32).
    "resampled"  Cosmos3-Edge: the Qwen2-VL family's merge-group order, and a learned side x side position table resized
              to each image's grid by F.interpolate(bilinear, antialias=True): each patch's weights on every table row
              (antialias_weights), which the encoder multiplies with the table.
    "windowed"  Muse Glimmer: raster patches like "raster", its table's taps bilinear with zero padding over the grid
              as its embedder passes it (height and width swapped), its rotary positions (column, row) + 1, and each
              patch's attention window (patch_windows with no merge; the spec's window_size, in patches).
    "conv"    LFM3-VL: the Qwen2-VL family's merge-group order and rotary positions, and each patch's k x k neighbours
              in its image's grid (conv_neighbors; the spec's position_table holds k) for the tower's depthwise
              convolutions.
    "naflex"  LFM2-VL: SigLIP2 NaFlex's raster patches (generate/naflex_inputs.py cuts them from its processor's padded
              batch) taken in merge groups, each patch's weights on its resized position table (antialias_weights, as Cosmos3-Edge's).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError
from ..ir import dtypes
from .image_positions import patch_positions, patch_windows, table_taps


def merge_order(grids: np.ndarray, merge: int) -> np.ndarray:
    """[patches] int64: the raster index of each patch in merge-group order (each image's merge x merge blocks
    row-major, the patches of a block row-major), images and frames in order."""
    out, start = [], 0
    for t, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist():
        frame = np.arange(h * w).reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3).reshape(-1)
        out.append(start + (np.arange(t)[:, None] * h * w + frame[None]).reshape(-1))
        start += t * h * w
    return np.concatenate(out).astype(np.int64)


def half_pixel_taps(positions: np.ndarray, sizes: np.ndarray, side: int, bicubic: bool = False,
                    zeros: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """([patches, n] int64, [patches, n] float32): each patch's taps into a side x side table resampled to its image's
    (h, w) grid with half-pixel centres (align_corners False), taps clamped to the border: bilinear (n = 4) or bicubic
    (Keys, a = -0.75; n = 16); `positions` [patches, 2] each patch's (row, column), `sizes` [patches, 2] its image's
    (h, w). `zeros`: a tap outside the table weighs 0 (grid_sample's zero padding) instead. As transformers'
    _interpolation_axis_taps_weights computes them, in float32."""
    offsets = np.arange(-1, 3) if bicubic else np.arange(2)
    taps = []
    for axis in (0, 1):
        index, size = positions[:, axis].astype(np.float32), sizes[:, axis].astype(np.float32)
        source = (index + np.float32(0.5)) * np.float32(side) / size - np.float32(0.5)
        floor = np.floor(source)
        raw = floor.astype(np.int64)[:, None] + offsets
        tap = np.clip(raw, 0, side - 1)
        distance = np.abs(source[:, None] - floor[:, None] - offsets.astype(np.float32))
        if bicubic:
            a = np.float32(-0.75)
            near = ((a + np.float32(2)) * distance - (a + np.float32(3))) * distance * distance + np.float32(1)
            far = ((a * distance - np.float32(5) * a) * distance + np.float32(8) * a) * distance - np.float32(4) * a
            weight = np.where(distance <= 1, near, far)
        else:
            weight = np.clip(np.float32(1) - distance, 0, None)
        if zeros:
            weight = weight * ((raw >= 0) & (raw <= side - 1))
        taps.append((tap, weight.astype(np.float32)))
    return table_taps(taps, side)


def antialias_axis(size: int, side: int) -> np.ndarray:
    """[size, side] float64: the weights of each of `size` outputs on the `side` inputs of an antialiased bilinear
    resize along one axis (align_corners False), as PyTorch's _upsample_bilinear2d_aa computes them: a triangle filter
    widened by the scale when shrinking, its taps cut at the edges and renormalized."""
    scale = side / size
    support = scale if scale >= 1 else 1.0  # interp_size 2, half of it, times the scale when shrinking
    inverse = 1 / scale if scale >= 1 else 1.0
    out = np.zeros((size, side))
    for i in range(size):
        center = scale * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), side)
        taps = np.arange(low, high)
        weights = np.clip(1 - np.abs((taps - center + 0.5) * inverse), 0, None)
        total = weights.sum()
        out[i, low:high] = weights / total if total else weights
    return out


def antialias_weights(grids: np.ndarray, merge: int, side: int) -> np.ndarray:
    """[patches, side * side] float32: each patch's weights on the flat rows of a side x side table resized to its
    image's (h, w) grid (antialias_axis along each axis), in merge-group order."""
    out = []
    for t, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist():
        rows, cols = antialias_axis(h, side), antialias_axis(w, side)
        grid = (rows[:, None, :, None] * cols[None, :, None, :]).reshape(h, w, side * side)
        order = grid.reshape(h // merge, merge, w // merge, merge, -1).transpose(0, 2, 1, 3, 4).reshape(h * w, -1)
        out.append(np.tile(order, (t, 1)))
    return np.concatenate(out).astype(np.float32)


def conv_neighbors(grids: np.ndarray, merge: int, kernel: int) -> np.ndarray:
    """[patches, kernel * kernel] int64: for each patch (merge-group order), the flat index of the patch under each tap
    of a kernel x kernel convolution centred on it (taps row-major, padding kernel // 2), -1 outside its image."""
    out, start, pad = [], 0, kernel // 2
    for t, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist():
        for _ in range(t):  # each frame convolved on its own
            at = np.empty((h, w), np.int64)  # the flat index of the patch at each (row, column)
            at.reshape(h // merge, merge, w // merge, merge).transpose(0, 2, 1, 3)[...] = (
                start + np.arange(h * w).reshape(h // merge, w // merge, merge, merge))
            padded = np.full((h + 2 * pad, w + 2 * pad), -1, np.int64)
            padded[pad:pad + h, pad:pad + w] = at
            taps = np.stack([padded[dy:dy + h, dx:dx + w] for dy in range(kernel) for dx in range(kernel)], axis=-1)
            order = taps.reshape(h // merge, merge, w // merge, merge, -1).transpose(0, 2, 1, 3, 4)
            out.append(order.reshape(h * w, -1))
            start += h * w
    return np.concatenate(out).astype(np.int64)


def windowed_inputs(vision: Any, pixels: np.ndarray, grids: np.ndarray, order: np.ndarray, image_ids: np.ndarray,
                    id_dtype: Any) -> tuple:
    """Muse Glimmer's encoder inputs (module docstring "windowed"), patches in merge groups (`order`)."""
    group = vision.spatial_merge_size ** 2
    rows = len(order) // group
    raster = patch_positions(grids, 1)
    swapped = grids[:, [0, 2, 1]]  # transformers' embedder reads each raster index over a (w, h) grid
    positions = patch_positions(swapped, 1)
    sizes = np.concatenate([np.repeat([[h, w]], t * h * w, axis=0) for t, h, w in swapped.reshape(-1, 3).tolist()])
    indices, weights = half_pixel_taps(positions, sizes, vision.position_table, zeros=True)
    windows = patch_windows(grids, 1, vision.window_size)
    dtype = dtypes.jax_dtype(vision.feature_dtype)
    return (jnp.asarray(pixels.reshape(len(order), -1)[order].reshape(rows, group, -1), dtype),
            jnp.asarray((raster[:, ::-1] + 1)[order].reshape(rows, group, 2), id_dtype), jnp.asarray(image_ids, id_dtype),
            jnp.asarray(windows[order].reshape(rows, group), id_dtype),
            jnp.asarray(indices[order].reshape(rows, group, -1), id_dtype),
            jnp.asarray(weights[order].reshape(rows, group, -1), dtype))


def encoder_inputs(vision: Any, pixel_values: Any, grids: np.ndarray, id_dtype: Any) -> tuple:
    """The encode_image inputs of a patch tower (module docstring) from its processor's pixel_values and
    image_grid_thw, M the image tokens, patches in merge groups: "raster", (pixel_values [M, merge^2, patch_dim],
    position_ids [M, merge^2, 2], image_ids [M], interp_indices, interp_weights [M, merge^2, 4]); "resampled",
    (pixel_values, image_ids, resample [M, merge^2, side^2] float32); "conv", (pixel_values, position_ids, image_ids,
    neighbors [M, merge^2, k * k])."""
    if vision.patch_tower not in ("raster", "resampled", "conv", "windowed", "naflex"):
        raise InputSpecError(f"this artifact's patch tower {vision.patch_tower!r} is not one this runtime knows: "
                             "update torch2jax")
    merge, pixels = vision.spatial_merge_size, np.asarray(pixel_values)
    total = int(np.prod(grids, axis=1).sum())
    if pixels.shape != (total, *vision.pixel_shape):
        raise InputSpecError(f"pixel_values must be [patches, {', '.join(map(str, vision.pixel_shape))}], {total} "
                             f"patches for image_grid_thw {grids.tolist()} (as the processor makes them); got "
                             f"{list(pixels.shape)}")
    group = merge * merge
    rows = total // group
    if rows > vision.max_images:
        raise InputSpecError(f"{rows} image tokens: this artifact takes at most {vision.max_images} per call")
    image_ids = np.repeat(np.arange(len(grids)), np.prod(grids, axis=1) // group)
    dtype = dtypes.jax_dtype(vision.feature_dtype)
    if vision.patch_tower == "resampled":  # patches already in merge groups
        resample = antialias_weights(grids, merge, vision.position_table)
        return (jnp.asarray(pixels.reshape(rows, group, -1), dtype), jnp.asarray(image_ids, id_dtype),
                jnp.asarray(resample.reshape(rows, group, -1), jnp.float32))
    if vision.patch_tower == "conv":
        neighbors = conv_neighbors(grids, merge, vision.position_table)
        positions = patch_positions(grids, merge)
        return (jnp.asarray(pixels.reshape(rows, group, -1), dtype), jnp.asarray(positions.reshape(rows, group, 2), id_dtype),
                jnp.asarray(image_ids, id_dtype), jnp.asarray(neighbors.reshape(rows, group, -1), id_dtype))
    order = merge_order(grids, merge)
    raster = patch_positions(grids, 1)  # each raster patch's (row, column)
    if vision.patch_tower == "windowed":
        return windowed_inputs(vision, pixels, grids, order, image_ids, id_dtype)
    if vision.patch_tower == "naflex":  # LFM2-VL: raster patches in merge groups, its table resized as Cosmos3-Edge's
        resample = antialias_weights(grids, merge, vision.position_table)
        return (jnp.asarray(pixels.reshape(total, -1)[order].reshape(rows, group, -1), dtype),
                jnp.asarray(image_ids, id_dtype), jnp.asarray(resample.reshape(rows, group, -1), jnp.float32))
    sizes = np.concatenate([np.repeat([[h, w]], t * h * w, axis=0) for t, h, w in grids.reshape(-1, 3).tolist()])
    indices, weights = half_pixel_taps(raster, sizes, vision.position_table, vision.bicubic_table)
    return (jnp.asarray(pixels.reshape(total, -1)[order].reshape(rows, group, -1), dtype),
            jnp.asarray(raster[order].reshape(rows, group, 2), id_dtype), jnp.asarray(image_ids, id_dtype),
            jnp.asarray(indices[order].reshape(rows, group, -1), id_dtype),
            jnp.asarray(weights[order].reshape(rows, group, -1), jnp.float32 if vision.bicubic_table else dtype))
