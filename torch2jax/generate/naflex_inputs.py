"""SigLIP2 NaFlex images (LFM2-VL), torch-free: its processor's padded patch batches made into the patch towers' input
(vision_spec.patch_tower "naflex", hf/steps/naflex_towers.py).

Lfm2VlProcessor gives pixel_values [images, max_patches, C*p*p] (each image's patches row by row, then zero padding),
pixel_attention_mask [images, max_patches] (its real patches first) and spatial_shapes [images, 2] (each image's patch
grid, rows and columns). The tower attends within each image's real patches (the mask's keys); its projector joins each
merge x merge block of patches (pixel unshuffle, blocks row-major). So the real patches are cut out (`naflex_patches`:
the Qwen2-VL layout, [patches, C*p*p] with image_grid_thw [images, 3], t = 1); generate/patch_inputs.py then takes them
in merge groups, each patch with its weights on the learned side x side position table as transformers resizes it to
the image's grid (an antialiased bilinear resize: antialias_weights, Cosmos3-Edge's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InputSpecError


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
