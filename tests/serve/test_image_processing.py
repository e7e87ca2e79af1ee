"""The torch-free image preprocessing (serve/image_processing.py) against transformers' PIL image processors, on
three images of different sizes and aspect ratios (a wide RGB, a tall RGBA, a small grayscale), each with its
settings as save_pretrained writes them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from torch2jax.errors import Torch2JaxError
from torch2jax.serve.image_processing import ImageProcessor

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
    with pytest.raises(Torch2JaxError, match="image processor Qwen2VLImageProcessor is not supported"):
        ImageProcessor(tf.Qwen2VLImageProcessorPil().to_dict())
    with pytest.raises(Torch2JaxError, match="pan-and-scan"):
        ImageProcessor({**processors()["gemma3"].to_dict(), "do_pan_and_scan": True})
