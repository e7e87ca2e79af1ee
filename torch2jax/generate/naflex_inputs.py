"""SigLIP2 NaFlex images (LFM2-VL), torch-free: its processor's padded patch batches made into the patch towers' input
(vision_spec.patch_tower "naflex", hf/steps/naflex_towers.py).

Lfm2VlProcessor gives pixel_values [images, max_patches, C*p*p] (each image's patches row by row, then zero padding),
pixel_attention_mask [images, max_patches] (its real patches first) and spatial_shapes [images, 2] (each image's patch
grid, rows and columns). The tower attends within each image's real patches (the mask's keys); its projector joins each
merge x merge block of patches (pixel unshuffle, blocks row-major). So the real patches are cut out (`naflex_patches`:
the Qwen2-VL layout, [patches, C*p*p] with image_grid_thw [images, 3], t = 1) and taken in merge groups, each patch
with its weights on the learned side x side position table as transformers resizes it to the image's grid
(`naflex_resample`: an antialiased bilinear resize, its weights computed as Siglip2VisionEmbeddings'
resize_positional_embeddings computes them, in float32).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import InputSpecError
from ..ir import dtypes


def naflex_patches(vision: Any, pixel_values: Any, spatial_shapes: Any,
                   pixel_attention_mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(pixel_values [patches, C*p*p] each image's real patches in order, image_grid_thw [images, 3]) from the
    processor's padded batch (module docstring). InputSpecError where the inputs are not as its processor makes them:
    a grid whose sides are not multiples of the merge (transformers would drop the patches past the last whole block
    from the features while they still attend), or a mask that is not each image's first h*w patches."""
    if spatial_shapes is None:
        raise InputSpecError("this model takes SigLIP2 NaFlex images: give spatial_shapes [images, 2] (each image's "
                             "patch rows and columns) and pixel_attention_mask with pixel_values, as its processor "
                             "makes them")
    shapes, pixels = np.asarray(spatial_shapes), np.asarray(pixel_values)
    if shapes.ndim != 2 or shapes.shape[1] != 2 or not np.issubdtype(shapes.dtype, np.integer) or (shapes < 1).any():
        raise InputSpecError(f"spatial_shapes must be [images, 2] positive integers (patch rows, columns), got "
                             f"{shapes.dtype}{list(shapes.shape)}")
    dim = vision.pixel_shape[0]
    if pixels.ndim != 3 or pixels.shape[0] != len(shapes) or pixels.shape[2] != dim:
        raise InputSpecError(f"pixel_values must be [{len(shapes)} images, patches, {dim}] (each image's patches, "
                             f"padded to the most, as the processor makes them), got {list(pixels.shape)}")
    merge = vision.spatial_merge_size
    if (shapes % merge).any():
        raise InputSpecError(f"spatial_shapes {shapes.tolist()}: each image's patch rows and columns must be multiples "
                             f"of {merge} (the projector's blocks), as the processor resizes images")
    counts = shapes.prod(axis=1)
    if (counts > pixels.shape[1]).any():
        raise InputSpecError(f"spatial_shapes {shapes.tolist()} name more patches than pixel_values' {pixels.shape[1]}")
    if pixel_attention_mask is not None:
        given = np.asarray(pixel_attention_mask).astype(bool)
        expected = np.arange(pixels.shape[1])[None] < counts[:, None]
        if given.shape != expected.shape or (given != expected).any():
            raise InputSpecError("pixel_attention_mask must mark each image's first h*w patches real and the rest "
                                 "padding (h, w its spatial_shapes), as the processor makes it")
    flat = np.concatenate([image[:count] for image, count in zip(pixels, counts)])
    grids = np.concatenate([np.ones((len(shapes), 1), np.int64), shapes.astype(np.int64)], axis=1)
    return flat, grids


def naflex_axis(size: int, side: int) -> np.ndarray:
    """[size, side] float32: each of `size` outputs' weights on `side` table entries along one axis, as transformers'
    resize_positional_embeddings computes them (antialiased bilinear, align_corners False), in float32."""
    scale = np.float32(side) / np.float32(size)
    support = max(scale, np.float32(1))
    center = (np.arange(size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    source = np.arange(side, dtype=np.float32)
    weights = np.clip(np.float32(1) - np.abs(source[None] - center[:, None]) / support, np.float32(0), None)
    return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


def naflex_resample(grids: np.ndarray, merge: int, side: int) -> np.ndarray:
    """[patches, side * side] float32: each patch's weights on the flat side x side table (row weight times column
    weight), images in order, each image's patches in merge groups."""
    out = []
    for _, h, w in np.asarray(grids, np.int64).reshape(-1, 3).tolist():
        rows, cols = naflex_axis(h, side), naflex_axis(w, side)
        grid = (rows[:, None, :, None] * cols[None, :, None, :]).reshape(h, w, side * side)
        out.append(grid.reshape(h // merge, merge, w // merge, merge, -1).transpose(0, 2, 1, 3, 4).reshape(h * w, -1))
    return np.concatenate(out).astype(np.float32)


def naflex_encoder_inputs(vision: Any, pixels: np.ndarray, grids: np.ndarray, order: np.ndarray, image_ids: np.ndarray,
                          id_dtype: Any) -> tuple:
    """The "naflex" encoder's inputs: (pixel_values [M, merge^2, C*p*p] in merge groups (`order`, the raster index of
    each), image_ids [M], resample [M, merge^2, side^2] float32)."""
    group = vision.spatial_merge_size ** 2
    rows = len(order) // group
    resample = naflex_resample(grids, vision.spatial_merge_size, vision.position_table)
    return (jnp.asarray(pixels.reshape(len(order), -1)[order].reshape(rows, group, -1), dtypes.jax_dtype(vision.feature_dtype)),
            jnp.asarray(image_ids, id_dtype), jnp.asarray(resample.reshape(rows, group, -1), jnp.float32))
