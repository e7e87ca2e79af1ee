"""The torch-free image preprocessing (generate/image_processing.py) against transformers' PIL image processors, on
three images of different sizes and aspect ratios (a wide RGB, a tall RGBA, a small grayscale), each with its
settings as save_pretrained writes them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torch2jax.errors import Torch2JaxError
from torch2jax.generate.image_processing import ImageProcessor

from ..hf import vlms


def processors():
    import transformers as tf

    return {
        "llava": tf.LlavaImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}),
        "llava-pad": tf.LlavaImageProcessorPil(size={"shortest_edge": 30}, crop_size={"height": 28, "width": 28}, do_pad=True),
        "clip-crop-larger": tf.CLIPImageProcessorPil(size={"shortest_edge": 24}, crop_size={"height": 40, "width": 36}),
        "siglip": tf.SiglipImageProcessorPil(size={"height": 28, "width": 36}),
        "gemma3": tf.Gemma3ImageProcessorPil(size={"height": 32, "width": 32}),
    }


@pytest.mark.parametrize("name", ["llava", "llava-pad", "clip-crop-larger", "siglip", "gemma3"])
def test_equals_the_transformers_pil_processor(name, tmp_path):
    theirs = processors()[name]
    theirs.save_pretrained(tmp_path)
    ours = ImageProcessor.from_files({"preprocessor_config.json": tmp_path / "preprocessor_config.json"})
    for image in vlms.images():
        want = theirs(images=image, return_tensors="np")["pixel_values"]
        got = ours([image])
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_reads_the_processor_config_and_refuses_what_it_does_not_know(tmp_path):
    import transformers as tf

    path = tmp_path / "processor_config.json"
    path.write_text(json.dumps({"image_processor": processors()["llava"].to_dict()}))
    assert ImageProcessor.from_files({"processor_config.json": path}).kind == "LlavaImageProcessor"
    assert ImageProcessor.from_files({}) is None
    with pytest.raises(Torch2JaxError, match="image processor Idefics3ImageProcessor is not supported"):
        ImageProcessor({"image_processor_type": "Idefics3ImageProcessorPil"})
    with pytest.raises(Torch2JaxError, match="call .patches"):
        ImageProcessor(tf.Qwen2VLImageProcessorPil().to_dict())(vlms.images())
    with pytest.raises(Torch2JaxError, match="pan-and-scan"):
        ImageProcessor({**processors()["gemma3"].to_dict(), "do_pan_and_scan": True})


@pytest.mark.parametrize("size", [{"shortest_edge": 16 * 16 * 4, "longest_edge": 16 * 16 * 24}, None])
def test_qwen2_vl_patches_equal_the_transformers_pil_processor(size, tmp_path):
    """Qwen2VLImageProcessorPil: smart_resize to multiples of patch * merge (up and down to the pixel bounds), rescale,
    normalize, the patches flattened with each merge x merge block consecutive, and the grid, on three images of
    different sizes and aspect ratios; its default settings (14-pixel patches) and small ones (8-pixel)."""
    import transformers as tf

    theirs = tf.Qwen2VLImageProcessorPil(**({"size": size, "patch_size": 8} if size else {}))
    theirs.save_pretrained(tmp_path)
    ours = ImageProcessor.from_files({"preprocessor_config.json": tmp_path / "preprocessor_config.json"})
    want = theirs(images=vlms.images(), return_tensors="np")
    pixels, grids = ours.patches(vlms.images())
    assert pixels.dtype == np.float32 and grids.dtype == np.int64
    np.testing.assert_array_equal(grids, want["image_grid_thw"])
    np.testing.assert_array_equal(pixels, want["pixel_values"])
    assert len({tuple(g) for g in grids.tolist()}) == (3 if size else 2)  # the defaults scale the small images up alike


@pytest.mark.parametrize("crop", [True, False])
def test_gotocr2_tiles_equal_the_transformers_pil_processor(crop, tmp_path):
    """InternVL's GotOcr2ImageProcessorPil: with crop_to_patches, each image resized onto its best grid of tiles, cut
    into them and followed by a thumbnail (3, 3 and 1 tiles for the three images); without, one resized tile each."""
    import transformers as tf

    theirs = tf.GotOcr2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=crop, min_patches=1, max_patches=6)
    theirs.save_pretrained(tmp_path)
    ours = ImageProcessor.from_files({"preprocessor_config.json": tmp_path / "preprocessor_config.json"})
    want = theirs(images=vlms.images(), return_tensors="np")
    pixels, tiles = ours.tiles(vlms.images())
    assert tiles == list(want["num_patches"]) == ([3, 3, 1] if crop else [1, 1, 1])
    np.testing.assert_array_equal(pixels, want["pixel_values"])


def test_tile_grid_equals_transformers_choice():
    """The grid of tiles for many image sizes and tile counts, ties included, as get_optimal_tiled_canvas picks it."""
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import get_optimal_tiled_canvas

    from torch2jax.generate.image_processing import optimal_tile_grid

    sizes = [(h, w) for h in (20, 32, 48, 64, 100, 448, 900) for w in (20, 32, 64, 96, 448, 1280)]
    for size in sizes:
        for low, high in ((1, 6), (1, 12), (2, 4)):
            assert optimal_tile_grid(size, (32, 32), low, high) == get_optimal_tiled_canvas(size, (32, 32), low, high), size
