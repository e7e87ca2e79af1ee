"""Quantized vision-language models: the language model's projections and head stored int8 / int4, the vision tower
in the model's dtype; greedy tokens equal transformers' generate with the same weights dequantized, on the same images."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torch2jax
from torch2jax.capture.converter import quantize_like
from torch2jax.hf.verify import check_generation, verify_vision_language

from ..helpers import cli, cli_convert_int4
from . import vlms

PROBE = Path(__file__).with_name("vlm_mesh_probe.py")


def reference(source):
    import transformers

    return transformers.AutoModelForImageTextToText.from_pretrained(source, local_files_only=True).eval()


@pytest.fixture(scope="module")
def llava_int8(tmp_path_factory):
    """(model directory, the int8 generator, its saved artifact)."""
    root = tmp_path_factory.mktemp("vlm-int8")
    source = vlms.write("llava", root)
    g = torch2jax.convert_hf(f"hf:{source}", max_cache_len=96, max_batch=2, quantize="int8")
    return source, g, torch2jax.save(g, root / "out")


def test_int8_llava_generates_as_transformers_does_with_the_language_weights_dequantized(llava_int8):
    source, g, out = llava_int8
    quantized = g.prefill_model.quantization
    names = quantized["params"]
    assert len(names) == 2 * 7 + 1 and names[-1] == "lm_head.weight"  # 7 projections per layer, and the head
    assert all(name.startswith("model.language_model.") for name in names[:-1])
    assert g.params["model.vision_tower.encoder.layers.0.mlp.fc1.weight"].dtype == np.float32
    assert g.params["model.multi_modal_projector.linear_1.weight"].dtype == np.float32
    encoder_graph = json.loads((out / "entries" / "encode_image" / "graph.json").read_text())
    placeholders = {inp["target"]: inp["meta"] for inp in encoder_graph["inputs"] if inp["kind"] == "parameter"}
    assert placeholders["lm_head.weight"]["dtype"] == "int8"  # the encoder's graph describes the params it is given
    loaded = torch2jax.load(out)
    assert loaded.prefill_model.quantization["scheme"] == "int8"
    check_generation(verify_vision_language(quantize_like(reference(source), quantized), loaded, tokens=16))


def test_mesh_load_splits_the_scales_with_their_weights(llava_int8, tmp_path):
    _, _, out = llava_int8
    target = tmp_path / "probe.json"
    result = subprocess.run([sys.executable, str(PROBE), str(target), str(out)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(target.read_text())["artifacts"][str(out)]
    assert report["equal"]  # the same greedy tokens as the unsharded load
    specs, q = report["specs"], "model.language_model.layers.0.self_attn.q_proj.weight"
    assert specs[q] == "P('model', None)" and specs[f"{q}_scale"] == "P('model',)"


@pytest.mark.slow  # ~34 s: int4 streamed through the CLI is tested on a causal LM, Qwen2-VL's int4 step in-process
def test_int4_qwen2_vl_streamed_through_the_cli_is_verified_and_inspected(tmp_path):
    """Qwen2-VL (variable resolution, its own step inputs): the CLI streams the weights, quantizes them as it reads
    them and verifies the artifact against transformers running the same weights dequantized."""
    source = vlms.write("qwen2_vl", tmp_path)
    out = tmp_path / "int4"
    quantized = cli_convert_int4(source, out, "quantize the language model's matmul weights")
    assert not any("visual" in name for name in quantized["params"])
    inspected = cli("inspect", str(out))
    assert f"quantized int4 weight-only, groups of 32 input columns: {len(quantized['params'])} matmul weights" in inspected.stdout


@pytest.mark.slow(reason="int8 LLaVA's tokens are checked in Python above and a quantized VLM through the CLI by the "
                        "Qwen2-VL test; this one adds `generate --image` on it (~25 s on 2 cores)")
def test_quantized_image_generation_from_the_cli(tmp_path):
    """`generate --image` on an int8 LLaVA artifact equals transformers' generate with the weights dequantized."""
    source = vlms.write("llava", tmp_path)
    out = tmp_path / "int8"
    converted = cli("convert", f"hf:{source}", "--max-cache-len", "96", "--max-batch", "1", "--quantize", "int8",
                    "--out", str(out))
    assert converted.returncode == 0, converted.stderr
    image = tmp_path / "picture.png"
    vlms.images()[1].save(image)
    shown = cli("generate", str(out), "--image", str(image), "--prompt", "w8 w9", "--max-new-tokens", "8")
    assert shown.returncode == 0, shown.stderr
    import torch

    from torch2jax.hf.verify import transformers_greedy

    g = torch2jax.load(out)
    ids, pixels = g.processor_inputs("w8 w9", image)[:2]
    model = quantize_like(reference(source), g.prefill_model.quantization)
    want = transformers_greedy(model, ids, 8, vlms.PAD, np.ones_like(ids), eos_token_id=vlms.EOS,
                               pixel_values=torch.from_numpy(pixels))
    _, parts = vlms.build("llava")
    assert shown.stdout.strip() == parts.tokenizer.decode(want[0, ids.shape[1]:], skip_special_tokens=True)
