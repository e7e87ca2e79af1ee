"""Quantized causal LMs: the int8 / int4 artifact generates what transformers generates with the same weights
dequantized, token for token; streamed weights are quantized as they are read."""

from __future__ import annotations

import json

import numpy as np
import pytest

import torch2jax
from torch2jax.capture.converter import quantize_like
from torch2jax.hf.verify import check_generation, verify_generation

from ..helpers import cli, cli_convert_int4
from ..serve.lms import load_lm, write_lm


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


def test_a_checkpoint_quantized_by_another_tool_is_refused_naming_the_method(llama, tmp_path):
    import shutil

    source = tmp_path / "gptq"
    shutil.copytree(llama, source)
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(torch2jax.InputSpecError, match="quantized with gptq"):
        torch2jax.convert_hf(source, max_cache_len=16, max_batch=2)
    result = cli("convert", f"hf:{source}", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "quantized with gptq" in result.stderr and not (tmp_path / "out").exists()
