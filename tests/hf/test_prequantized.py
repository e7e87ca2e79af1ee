"""Checkpoints another tool stored quantized convert as they are stored (hf/prequantized.py): the artifact keeps the
stored values and scales, computes what transformers computes on that checkpoint, generates the same tokens, and keeps
the checkpoint's size on disk.

The checkpoints are written here from a random Llama: block-FP8 as DeepSeek-V3 and Qwen3-FP8 publish it (transformers
only writes it on a GPU, so its format is written directly: float8_e4m3fn weights, a float32 `weight_scale_inv` per
128x128 block, `quantization_config` with quant_method fp8), and compressed-tensors' formats with the compressed-tensors
library itself (pack-quantized int4 / int8, float-quantized FP8). The reference is transformers' own load of each
checkpoint on CPU, which dequantizes the weights into the float model: the artifact runs the same dequantized weights in
float32, so its logits differ only by the order of float32 sums (measured below 3e-7 on logits of about 0.5); LOGITS_ATOL
is 1e-5, far below what one wrong scale or zero point moves a logit (1e-2 and more).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.hf.directory import load_quietly
from torch2jax.hf.verify import check_generation, verify_generation
from torch2jax.runtime.quantize import quantize_model

from ..helpers import cli

LOGITS_ATOL = 1e-5
SIZE_RATIO = 1.10  # the artifact's params on disk against the checkpoint's safetensors
FP8_BLOCK = 128
VOCAB = 128
# hidden 256 and one kv head: the key and value projections are [64, 256], half a 128-row block (a partial block)
CONFIG = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=1, max_position_embeddings=256, eos_token_id=2, bos_token_id=1, pad_token_id=0)
# compressed-tensors weight schemes (QuantizationArgs), by test id
COMPRESSED = {
    "int4-symmetric": dict(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32),
    "int4-zero-points": dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32),
    "int8-channel": dict(num_bits=8, type="int", symmetric=True, strategy="channel"),
    "fp8-channel": dict(num_bits=8, type="float", symmetric=True, strategy="channel"),
}
PROJECTIONS = 2 * 7  # q k v o gate up down per layer; the LM head and embeddings stay float


def _random_llama():
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def write_block_fp8(out: Path) -> Path:
    """A random Llama in the block-FP8 format: per 128x128 block of a projection, scale = max|w| / 448 (float8_e4m3fn's
    largest), values = w / scale in float8_e4m3fn, the scale stored as `weight_scale_inv` (what multiplies them back)."""
    from safetensors.torch import load_file, save_file

    _random_llama().save_pretrained(out)
    tensors = {}
    for name, w in load_file(out / "model.safetensors").items():
        if not name.endswith("_proj.weight"):
            tensors[name] = w
            continue
        rows, cols = w.shape
        grid = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
        padded = torch.zeros(grid[0] * FP8_BLOCK, grid[1] * FP8_BLOCK)
        padded[:rows, :cols] = w
        blocks = padded.reshape(grid[0], FP8_BLOCK, grid[1], FP8_BLOCK)
        scale = blocks.abs().amax(dim=(1, 3)) / torch.finfo(torch.float8_e4m3fn).max
        values = (blocks / scale[:, None, :, None]).reshape(padded.shape)[:rows, :cols]
        tensors[name] = values.to(torch.float8_e4m3fn)
        tensors[name.replace(".weight", ".weight_scale_inv")] = scale.float()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                     "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    (out / "config.json").write_text(json.dumps(config))
    return out


def write_compressed(out: Path, weights: dict) -> Path:
    """A random Llama quantized and saved by compressed-tensors (its projections; the LM head ignored): scales and zero
    points from each weight's range (compressed-tensors' calculate_qparams, as a min-max observer gives them)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    fmt = "float-quantized" if weights["type"] == "float" else "pack-quantized"
    model = _random_llama()
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weights))
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"], format=fmt))
    with torch.no_grad():
        for module in model.modules():
            args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
            if args is None:
                continue
            w = module.weight
            grouped = w.reshape(w.shape[0], -1, args.group_size) if args.strategy == "group" else w.reshape(w.shape[0], 1, -1)
            scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
            module.weight_scale.data = scale.reshape(module.weight_scale.shape).to(module.weight_scale.dtype)
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data = zero.reshape(module.weight_zero_point.shape).to(module.weight_zero_point.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, fmt)
    compressor.compress_model(model)
    model.save_pretrained(out)
    compressor.update_config(out)
    return out


def _reference(directory: Path):
    """transformers' own load of the checkpoint (what `torch2jax convert` verifies against)."""
    import transformers

    return load_quietly(transformers.AutoModelForCausalLM, directory)


def _check_against_transformers(directory: Path, artifact: Path) -> None:
    """The loaded artifact's last-position logits on two prompts and its greedy tokens equal transformers' on the same
    checkpoint; its params on disk are within SIZE_RATIO of the checkpoint's file."""
    g = torch2jax.load(artifact)
    lm = _reference(directory)
    ids = np.random.default_rng(0).integers(3, VOCAB, (2, 9))
    positions = np.broadcast_to(np.arange(9), ids.shape)
    logits, _ = g.prefill(g.new_cache(2), jnp.asarray(ids), jnp.asarray(positions), jnp.arange(9), jnp.ones(ids.shape, bool))
    with torch.no_grad():
        want = lm(torch.from_numpy(ids)).logits[:, -1].numpy()
    np.testing.assert_allclose(np.asarray(logits), want, rtol=0, atol=LOGITS_ATOL)
    check_generation(verify_generation(lm, g, tokens=12))
    params = sum(f.stat().st_size for f in (artifact / "params").rglob("*") if f.is_file())
    stored = os.path.getsize(directory / "model.safetensors")
    assert params <= SIZE_RATIO * stored, f"params {params} bytes on disk, the checkpoint {stored}"


@pytest.fixture(scope="module")
def block_fp8(tmp_path_factory):
    return write_block_fp8(tmp_path_factory.mktemp("prequantized") / "fp8")


def test_block_fp8_converts_through_the_cli_verified_and_keeps_its_stored_form(block_fp8, tmp_path):
    out = tmp_path / "out"
    """Verified by the CLI on a one-layer slice (converted the same way, its weights stored alike) as a deep model is;
    the whole model against transformers below."""
    result = cli("convert", f"hf:{block_fp8}", "--max-cache-len", "32", "--max-batch", "2", "--platforms", "cpu",
                 "--verify-layers", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "weights streamed from the safetensors files" in result.stdout
    assert "verified a slice against transformers: the first 1 of 2 layers" in result.stdout
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    quantized, tree = manifest["params"]["quantization"], manifest["params"]["tree"]
    assert quantized["stored_by"] == "checkpoint" and quantized["formats"] == ["fp8 blocks of 128x128"]
    assert len(quantized["params"]) == PROJECTIONS and "lm_head.weight" not in quantized["params"]
    up, k = "model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.k_proj.weight"
    assert tree[up] == {"dtype": "float8_e4m3fn", "shape": [512, 256]} and tree[f"{up}_scale"] == {"dtype": "float32", "shape": [4, 2]}
    assert tree[k] == {"dtype": "float8_e4m3fn", "shape": [64, 256]} and tree[f"{k}_scale"]["shape"] == [1, 2]
    assert tree["lm_head.weight"]["dtype"] == "float32"
    assert "quantized as the checkpoint stores them (fp8 blocks of 128x128): 14 matmul weights" in cli("inspect", str(out)).stdout
    _check_against_transformers(block_fp8, out)


# symmetric int4 in the slow tier: the zero-point case runs the same unpacking and group scales, and its zero points
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "int4-symmetric" else k for k in COMPRESSED])
def test_compressed_tensors_converts_streamed_and_computes_what_transformers_does(kind, tmp_path):
    directory = write_compressed(tmp_path / kind, COMPRESSED[kind])
    g = torch2jax.convert_hf(directory, max_cache_len=32, max_batch=2, stream_weights=True)
    quantized = g.prefill_model.quantization
    assert quantized["stored_by"] == "checkpoint" and len(quantized["params"]) == PROJECTIONS
    q = "model.layers.0.self_attn.q_proj.weight"
    stored = {"int4-symmetric": ("int32", (256, 32)), "int4-zero-points": ("int32", (256, 32)),
              "int8-channel": ("int32", (256, 64)), "fp8-channel": ("float8_e4m3fn", (256, 256))}[kind]
    assert (str(g.params[q].dtype), g.params[q].shape) == stored
    assert (f"{q}_zero_point" in g.params) == (kind == "int4-zero-points")
    with pytest.raises(torch2jax.InputSpecError, match="stored quantized .* convert it without quantize='int8'"):
        quantize_model(g.prefill_model, "int8")
    _check_against_transformers(directory, torch2jax.save(g, tmp_path / "out"))


def test_packed_values_unpack_as_compressed_tensors_packs_them():
    """unpack_int32 (NumPy and the lowering) against compressed-tensors' own packer, for each width that tiles a word,
    on a width that is not a whole number of words."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    from torch2jax.ops.quantized import unpack_int32 as unpack_jax
    from torch2jax.runtime.quantize import unpack_int32

    rng = np.random.default_rng(0)
    for bits in (2, 4, 8):
        values = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (6, 40)).astype(np.int8)
        packed = pack_to_int32(torch.from_numpy(values), bits).numpy()
        np.testing.assert_array_equal(unpack_int32(packed, bits, 40), values)
        np.testing.assert_array_equal(np.asarray(unpack_jax(jnp.asarray(packed), bits, 40)), values)


def test_float8_values_equal_the_float8_conversion_on_every_code():
    import ml_dtypes

    from torch2jax.ops.quantized import float8_values

    codes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(np.asarray(float8_values(jnp.asarray(codes))), codes.astype(np.float32))


@pytest.mark.parametrize("rows", [1, 8, 80])
def test_fused_products_equal_the_dequantized_weights_product(rows):
    """blocks_linear and packed_int_linear (the product passes.quantized_products makes of a stored weight and its Linear)
    against linear() of the weight dequantize_stored gives in NumPy: at one row (fused), 8 (a block of rows at a time on
    CPU) and 80 rows (whole); a 192-row weight in 128-row blocks (a partial block, and 64-row blocks of the product that
    cut a scale block), a packed weight with zero points, and a bias."""
    import ml_dtypes

    from torch2jax.ops.linalg import linear
    from torch2jax.ops.quantized import blocks_linear, packed_int_linear
    from torch2jax.runtime.quantize import dequantize_stored

    rng = np.random.default_rng(rows)
    x = jnp.asarray(rng.standard_normal((rows, 320)).astype(np.float32))
    bias = jnp.asarray(rng.standard_normal(192).astype(np.float32))
    values = rng.standard_normal((192, 320)).astype(ml_dtypes.float8_e4m3fn)
    scale = rng.random((2, 3)).astype(np.float32)
    want = linear(x, jnp.asarray(dequantize_stored("blocks", values, scale, (128, 128), (192, 320))), bias)
    got = blocks_linear(x, jnp.asarray(values), jnp.asarray(scale), 128, 128, jnp.float32, bias)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    packed = rng.integers(-2 ** 31, 2 ** 31 - 1, (192, 40)).astype(np.int32)  # 4-bit values, 8 a word
    zero, scale = rng.integers(-2 ** 31, 2 ** 31 - 1, (24, 10)).astype(np.int32), rng.random((192, 10)).astype(np.float32)
    args = (4, 32, 320)
    want = linear(x, jnp.asarray(dequantize_stored("packed-int", packed, scale, args, (192, 320), zero)), bias)
    got = packed_int_linear(x, jnp.asarray(packed), jnp.asarray(scale), *args, jnp.float32, jnp.asarray(zero), bias)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("quantization, named", [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ with 3-bit weights"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemv"}, "AWQ in the gemv layout"),
    ({"quant_method": "hqq"}, "hqq"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32},
        "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}}}}, "quantized activations"),
])
def test_formats_that_do_not_convert_are_refused_naming_those_that_do(block_fp8, tmp_path, quantization, named):
    config = json.loads((block_fp8 / "config.json").read_text())
    config["quantization_config"] = quantization
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(torch2jax.InputSpecError) as refused:
        torch2jax.convert_hf(tmp_path, max_cache_len=16, max_batch=2)
    message = str(refused.value)
    assert named in message and "fp8 (block-scaled float8" in message and "compressed-tensors pack-quantized" in message
    assert "GPTQ (2, 4 or 8 bits" in message and "AWQ (4 bits, the gemm layout)" in message


def test_a_prequantized_checkpoint_is_not_loaded_dequantized_in_memory(block_fp8):
    with pytest.raises(torch2jax.InputSpecError, match="convert only streamed"):
        torch2jax.convert_hf(block_fp8, max_cache_len=16, max_batch=2, stream_weights=False)
