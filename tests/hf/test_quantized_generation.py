"""Quantized causal LMs and encoder-decoders: the int8 / int4 artifact generates what transformers generates with the
same weights dequantized, token for token; streamed weights are quantized as they are read."""

from __future__ import annotations

import json

import numpy as np
import pytest

import torch2jax
from torch2jax.capture.converter import quantize_like
from torch2jax.hf.verify import check_generation, verify_generation, verify_seq2seq

from ..generate.lms import load_lm, write_lm
from ..helpers import cli, cli_convert_int4


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write_lm("llama", tmp_path_factory.mktemp("quantized"))


def test_int8_generates_as_transformers_does_with_the_weights_dequantized(llama):
    g = torch2jax.convert_hf(llama, max_cache_len=48, max_batch=2, quantize="int8")
    quantized = g.prefill_model.quantization
    names = quantized["params"]
    assert len(names) == 2 * 7 + 1 and names[-1] == "lm_head.weight"  # 7 projections per layer, and the head
    assert all(g.params[name].dtype == np.int8 and g.params[f"{name}_scale"].shape == g.params[name].shape[:1] for name in names)
    check_generation(verify_generation(quantize_like(load_lm(llama), quantized), g, tokens=16))


def test_int4_streamed_through_the_cli_is_verified_and_inspected(llama, tmp_path):
    out = tmp_path / "int4"
    quantized = cli_convert_int4(llama, out, "quantize the matmul weights")
    assert len(quantized["params"]) == 15
    manifest = json.loads((out / "manifest.json").read_text())
    tree = manifest["params"]["tree"]
    up = "model.layers.0.mlp.up_proj.weight"
    assert tree[up] == {"dtype": "uint8", "shape": [128, 32]} and tree[f"{up}_scale"] == {"dtype": "float32", "shape": [128, 2]}
    inspected = cli("inspect", str(out))
    assert "quantized int4 weight-only, groups of 32 input columns: 15 matmul weights" in inspected.stdout


def test_int8_t5_quantizes_the_encoder_and_the_decoder_and_generates_as_transformers_does(tmp_path):
    """encode (which also runs the decoder once, as dead code, to fill the cross-attention cache) and decode are
    quantized over one params tree: each weight once, where the entry point that computes with it reads it."""
    from ..generate.seq2seqs import load_seq2seq, write_seq2seq

    source = write_seq2seq("t5", tmp_path)
    g = torch2jax.convert_hf(source, max_cache_len=24, max_batch=2, max_source_len=16, quantize="int8")
    quantized = g.entries()["encode"].quantization
    assert g.entries()["decode"].quantization == quantized
    names = quantized["params"]
    for name in ("encoder.block.0.layer.0.SelfAttention.q.weight", "encoder.block.1.layer.1.DenseReluDense.wo.weight",
                 "decoder.block.0.layer.1.EncDecAttention.k.weight", "decoder.block.1.layer.0.SelfAttention.o.weight"):
        assert name in names and g.params[name].dtype == np.int8, name
    assert len(names) == len(set(names)) == 2 * 7 + 2 * 11  # encoder layers: q k v o + 3 MLP; decoder: + cross q k v o
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
    check_generation(verify_seq2seq(quantize_like(load_seq2seq(source), quantized), loaded, tokens=16))


@pytest.mark.slow(reason="int4 through the CLI is the Llama test's, a quantized encoder and decoder T5's; Whisper's "
                        "audio encoder quantized adds ~30 s on 2 cores")
def test_int4_whisper_through_the_cli_is_verified(tmp_path):
    from ..generate.seq2seqs import write_seq2seq

    source = write_seq2seq("whisper", tmp_path)
    quantized = cli_convert_int4(source, tmp_path / "out", "quantize the encoder's and decoder's matmul weights",
                                 "--max-cache-len", "32", "--max-batch", "2")
    assert any(name.startswith("model.encoder.") for name in quantized["params"])
    assert any(name.startswith("model.decoder.") for name in quantized["params"])


def test_a_checkpoint_quantized_by_another_tool_is_refused_naming_the_method(llama, tmp_path):
    import shutil

    source = tmp_path / "bnb"
    shutil.copytree(llama, source)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(torch2jax.InputSpecError, match="quantized with bitsandbytes"):
        torch2jax.convert_hf(source, max_cache_len=16, max_batch=2)
    result = cli("convert", f"hf:{source}", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "quantized with bitsandbytes" in result.stderr and not (tmp_path / "out").exists()
