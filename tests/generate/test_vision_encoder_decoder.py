"""Generation from a converted VisionEncoderDecoderModel (TrOCR-like: a ViT encoder, a TrOCR decoder) against
transformers' own generate(pixel_values=...), same random weights: images in, tokens out, torch-free once saved."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.serve.seq2seq_engine import Seq2SeqBatchEngine

from .seq2seqs import CHANNELS, IMAGE_SIZE, PAD, START, build_image_seq2seq

TOKENS = 12


def test_image_encoder_decoder_greedy_tokens_equal_transformers_before_and_after_save(tmp_path):
    """Two random images, 12 greedy tokens each (no end token): equal to transformers' generate(pixel_values=...), the
    task inferred from the directory (image-text-to-text), and again after save + load (the manifest records the
    pixels' shape); token ids, a wrong image size and the server are refused."""
    torch.manual_seed(0)
    model = build_image_seq2seq().eval()
    with torch.no_grad():  # N(0, 0.1) weights and biases (the norms' kept): the small init repeats one token
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.1)
    model.save_pretrained(tmp_path / "trocr")
    g = torch2jax.convert_hf(f"hf:{tmp_path / 'trocr'}", max_cache_len=24, max_batch=2)
    assert type(g).__name__ == "Seq2SeqGenerator" and g.spec.takes_pixels
    assert g.spec.feature_shape == (CHANNELS, IMAGE_SIZE, IMAGE_SIZE) and g.spec.max_source_len == 17

    pixels = np.random.default_rng(3).standard_normal((2, CHANNELS, IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    got = g.generate(pixel_values=pixels, max_new_tokens=TOKENS, eos_token_id=[])
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        want = model.generate(pixel_values=torch.from_numpy(pixels), max_new_tokens=TOKENS, do_sample=False,
                              pad_token_id=PAD).numpy()
    assert got.shape == want.shape == (2, 1 + TOKENS) and (got[:, 0] == START).all()
    np.testing.assert_array_equal(got, want)
    assert len(set(want[:, 1:].ravel().tolist())) > 4, "the reference repeats a few tokens: the comparison proves little"
    assert not np.array_equal(want[0], want[1]), "both images give the same tokens: the encoder would not be tested"

    saved = torch2jax.save(g, tmp_path / "artifact")
    encoder_input = json.loads((saved / "manifest.json").read_text())["generation"]["encoder_input"]
    assert encoder_input == {"name": "pixel_values", "shape": ["batch", CHANNELS, IMAGE_SIZE, IMAGE_SIZE]}
    loaded = torch2jax.load(saved)
    assert loaded.spec.takes_pixels and loaded.spec.feature_shape == g.spec.feature_shape
    np.testing.assert_array_equal(loaded.generate(pixel_values=pixels, max_new_tokens=TOKENS, eos_token_id=[]), got)
    with pytest.raises(InputSpecError, match=r"reads images: pass pixel_values \[batch, 3, 32, 32\]"):
        loaded.generate(np.ones((1, 3), np.int64))
    with pytest.raises(InputSpecError, match=r"pixel_values must be floats of shape \[batch, 3, 32, 32\], got float32\[1, 3, 32, 16\]"):
        loaded.generate(pixel_values=pixels[:1, :, :, :16])
    with pytest.raises(InputSpecError, match=r"reads pixel_values, not text, and the server takes text"):
        Seq2SeqBatchEngine(loaded, rows=2)
