"""Encoder-decoders (T5, BART, Whisper) convert with their weights streamed from the safetensors files, as causal LMs
do: the artifact generates what transformers' `generate` does on the same checkpoint, and `torch2jax convert` streams
them by default, verifying a deep one on a slice of its encoder's and decoder's first layers."""

from __future__ import annotations

import numpy as np
import pytest

import torch2jax
from torch2jax.capture.fake_params import is_fake
from torch2jax.hf.verify import check_generation, verify_seq2seq

from ..generate.seq2seqs import load_seq2seq, write_seq2seq
from ..helpers import cli


# streamed BART runs by default through the CLI test below (its slice verified against transformers)
@pytest.mark.parametrize("name", [pytest.param("bart", marks=pytest.mark.slow), pytest.param("t5", marks=pytest.mark.slow),
                                  pytest.param("whisper", marks=pytest.mark.slow)])
def test_a_streamed_encoder_decoder_generates_what_transformers_does(name, tmp_path):
    """BART's `final_logits_bias` is a buffer of the model itself, not of a child module (write_seq2seq draws it
    nonzero): streamed, it must come from the checkpoint, not from the fake model's zeros."""
    directory = write_seq2seq(name, tmp_path)
    g = torch2jax.convert_hf(str(directory), max_cache_len=16, max_batch=2, max_source_len=16, stream_weights=True)
    assert any(hasattr(value, "read") for value in g.encode_model.params.values()), "the params are read when saving"
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
    reference = load_seq2seq(directory)
    check_generation(verify_seq2seq(reference, loaded, tokens=12))
    if name == "bart":
        bias = reference.final_logits_bias.numpy()
        assert np.abs(bias).max() > 0.1
        np.testing.assert_array_equal(np.asarray(loaded.params["final_logits_bias"]), bias)


def test_the_cli_streams_an_encoder_decoder_and_verifies_it_on_a_slice(tmp_path):
    directory = write_seq2seq("bart", tmp_path)
    out = tmp_path / "out"
    result = cli("convert", f"hf:{directory}", "--task", "text2text-generation", "--max-cache-len", "16",
                 "--max-source-len", "16", "--max-batch", "2", "--verify-layers", "1", "--platforms", "cpu", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "weights streamed from the safetensors files" in result.stdout
    assert "verified a slice against transformers: the first 1 of 2 layers" in result.stdout
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate" in result.stdout


def test_a_streamed_encoder_decoder_model_is_built_with_fake_params(tmp_path):
    from torch2jax.hf.source import load_generation_model, resolve_source

    source = load_generation_model(resolve_source(f"hf:{write_seq2seq('t5', tmp_path)}"), stream_weights=True)
    assert all(is_fake(p) for p in source.model.parameters()) and source.weights is not None
