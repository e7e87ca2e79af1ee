"""GPTQ and AWQ checkpoints convert as they are stored (hf/prequantized.py): their packed 4- or 8-bit values, zero points
and scales become the pack-quantized layout bit for bit, and the artifact computes what the checkpoint's weights are.

The checkpoints are written here from a random Llama quantized round-to-nearest per group (min-max, asymmetric), packed
as each tool lays its tensors out: GPTQ's qweight packs down the input dim and its v1 format stores each zero point
minus one; AWQ's packs along the output dim in the order 0 2 4 6 1 3 5 7 within a word. transformers loads neither
without GPTQModel (a CUDA build), so the references are:
  - AWQ: compressed-tensors' own AutoAWQ converter turns the checkpoint into pack-quantized tensors, which transformers
    loads dequantized: a peer's reading of the AWQ layout, independent of ours;
  - GPTQ: the float Llama with each weight (q - zero) * scale computed from the integers before they were packed (the
    packing follows AutoGPTQ's QuantLinear.pack: values down the input dim, the lowest bits first, zeros minus one).
LOGITS_ATOL is 1e-5: a float32 sum order apart, far below what one misplaced 4-bit field moves a logit.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.hf.verify import check_generation, verify_generation

from .test_prequantized import PROJECTIONS, VOCAB, _random_llama

LOGITS_ATOL = 1e-5
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _quantize(w: np.ndarray, bits: int, group: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest of w [out, in] per group of `group` columns: (q [out, in], zeros [out, groups], scales [out,
    groups] float16), unsigned, w ~ (q - zero) * scale."""
    top = (1 << bits) - 1
    grouped = w.reshape(w.shape[0], -1, group)
    lo, hi = np.minimum(grouped.min(-1), 0), np.maximum(grouped.max(-1), 0)
    scales = ((hi - lo) / top).astype(np.float16)
    zeros = np.clip(np.round(-lo / scales.astype(np.float32)), 0, top).astype(np.int64)
    q = np.clip(np.round(grouped / scales[:, :, None].astype(np.float32)) + zeros[:, :, None], 0, top).astype(np.int64)
    return q.reshape(w.shape), zeros, scales


def _pack(values: np.ndarray, bits: int, axis: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """Unsigned values packed 32 / bits to an int32 word along `axis`, field i (the lowest bits first) holding value
    order[i] of its run."""
    per_word = 32 // bits
    moved = np.moveaxis(values, axis, -1).astype(np.uint32)
    runs = moved.reshape(*moved.shape[:-1], -1, per_word)
    if order is not None:
        runs = runs[..., list(order)]
    words = np.bitwise_or.reduce(runs << (np.arange(per_word, dtype=np.uint32) * bits), axis=-1)
    return np.ascontiguousarray(np.moveaxis(words, -1, axis)).view(np.int32)


def write_quantized(out: Path, method: str, bits: int = 4, group: int = 32, fmt: str = "gptq",
                    act_order: bool = False) -> tuple[Path, dict]:
    """A random Llama's projections quantized and packed as `method` stores them; returns the directory and the float
    weights (q - zero) * scale the integers stand for. `act_order` (GPTQ's desc_act): each group is a random set of
    columns (as GPTQ takes them in order of their activations), g_idx says each column's, the values stay in column
    order (as AutoGPTQ's QuantLinear.pack stores them)."""
    from safetensors.numpy import save_file

    llama = _random_llama()
    llama.save_pretrained(out)
    state = {name: t.numpy() for name, t in llama.state_dict().items()}
    tensors, dequantized = {}, {}
    for name, w in state.items():
        if not name.endswith("_proj.weight"):
            tensors[name] = w
            continue
        module = name.removesuffix(".weight")
        size = group if group > 0 else w.shape[1]
        order = np.random.default_rng(len(tensors)).permutation(w.shape[1]) if act_order else np.arange(w.shape[1])
        back = np.argsort(order)  # column j is the back[j]-th of the groups' order
        q, zeros, scales = _quantize(w[:, order], bits, size)
        weight = (q.reshape(w.shape[0], -1, size) - zeros[:, :, None]) * scales.astype(np.float32)[:, :, None]
        dequantized[name] = weight.reshape(w.shape)[:, back].astype(np.float32)
        q = q[:, back]
        if method == "gptq":
            stored_zeros = zeros - (1 if fmt == "gptq" else 0)
            tensors[f"{module}.qweight"] = _pack(q.T, bits, axis=0)
            tensors[f"{module}.qzeros"] = _pack(stored_zeros.T & ((1 << bits) - 1), bits, axis=1)
            tensors[f"{module}.g_idx"] = (back // size).astype(np.int32)
        else:
            tensors[f"{module}.qweight"] = _pack(q.T, bits, axis=1, order=AWQ_ORDER)
            tensors[f"{module}.qzeros"] = _pack(zeros.T, bits, axis=1, order=AWQ_ORDER)
        tensors[f"{module}.scales"] = np.ascontiguousarray(scales.T)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    if method == "gptq":
        config["quantization_config"] = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": act_order,
                                         "sym": False, "checkpoint_format": fmt}
    else:
        config["quantization_config"] = {"quant_method": "awq", "bits": bits, "group_size": group, "zero_point": True,
                                         "version": "gemm"}
    (out / "config.json").write_text(json.dumps(config))
    return out, dequantized


def _float_reference(dequantized: dict) -> torch.nn.Module:
    llama = _random_llama()
    with torch.no_grad():
        for name, w in dequantized.items():
            llama.get_parameter(name).copy_(torch.from_numpy(w))
    return llama


def _awq_reference_by_compressed_tensors(directory: Path, out: Path) -> torch.nn.Module:
    """The AWQ checkpoint converted by compressed-tensors' AutoAWQ converter and loaded by transformers, dequantized."""
    import transformers
    from compressed_tensors.entrypoints.convert.converters import AutoAWQConverter
    from safetensors.torch import load_file, save_file

    config = json.loads((directory / "config.json").read_text())
    converter = AutoAWQConverter.from_autoawq_config(config["quantization_config"])
    tensors = converter.process(dict(load_file(directory / "model.safetensors")))
    out.mkdir()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config["quantization_config"] = converter.update_config(None).model_dump(exclude_none=True)
    config["quantization_config"]["quant_method"] = "compressed-tensors"
    (out / "config.json").write_text(json.dumps(config))
    return transformers.AutoModelForCausalLM.from_pretrained(
        out, quantization_config=transformers.CompressedTensorsConfig(dequantize=True)).eval()


def _logits(g, lm) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(0).integers(3, VOCAB, (2, 9))
    positions = np.broadcast_to(np.arange(9), ids.shape)
    logits, _ = g.prefill(g.new_cache(2), jnp.asarray(ids), jnp.asarray(positions), jnp.arange(9), jnp.ones(ids.shape, bool))
    with torch.no_grad():
        want = lm(torch.from_numpy(ids)).logits[:, -1].float().numpy()
    return np.asarray(logits), want


CASES = {
    "gptq-int4-group": dict(method="gptq", bits=4, group=32, fmt="gptq"),
    "gptq_v2-int8-channel": dict(method="gptq", bits=8, group=-1, fmt="gptq_v2"),
    "awq-int4-group": dict(method="awq", bits=4, group=32),
    "gptq-int4-act-order": dict(method="gptq", bits=4, group=32, fmt="gptq", act_order=True),
}


# GPTQ's plain path runs by default through the CLI test below (verified against the dequantized weights)
DEFAULT_CASES = ("awq-int4-group",)  # GPTQ in activation order runs by default through the CLI test
@pytest.mark.parametrize("case", [pytest.param(case, marks=[] if case in DEFAULT_CASES else [pytest.mark.slow])
                                  for case in CASES])
def test_gptq_and_awq_convert_in_their_stored_form_and_compute_the_checkpoint(case, tmp_path):
    settings = dict(CASES[case])
    directory, dequantized = write_quantized(tmp_path / case, **settings)
    g = torch2jax.convert_hf(directory, max_cache_len=32, max_batch=2, stream_weights=True)
    quantized = g.prefill_model.quantization
    assert quantized["stored_by"] == "checkpoint" and len(quantized["params"]) == PROJECTIONS
    q = "model.layers.0.self_attn.q_proj.weight"
    bits = settings["bits"]
    assert (str(g.params[q].dtype), g.params[q].shape) == ("int32", (256, 256 * bits // 32))
    assert (f"{q}_columns" in g.params) == settings.get("act_order", False)
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "out"))
    reference = _float_reference(dequantized)
    got, want = _logits(loaded, reference)
    np.testing.assert_allclose(got, want, rtol=0, atol=LOGITS_ATOL)
    if settings["method"] == "awq":  # the peer's reading of the same tensors
        peer = _awq_reference_by_compressed_tensors(directory, tmp_path / "peer")
        for name, w in dequantized.items():
            got_weight = peer.get_parameter(name).detach()
            # the peer dequantizes in the scales' float16: each weight within float16's rounding of ours; a misread
            # 4-bit field moves one by a whole scale step (about 2^4 times more than the rounding at the least)
            np.testing.assert_allclose(got_weight.float().numpy(), w, rtol=2.0 ** -11, atol=0, err_msg=name)
    check_generation(verify_generation(reference, loaded, tokens=8))


@pytest.mark.slow  # ~25 s: the conversion is tested in-process above, the CLI's verify on other checkpoints
def test_the_cli_converts_a_gptq_checkpoint_verified_against_its_dequantized_weights(tmp_path):
    from ..helpers import cli

    directory, _ = write_quantized(tmp_path / "gptq", "gptq", act_order=True)
    out = tmp_path / "out"
    result = cli("convert", f"hf:{directory}", "--max-cache-len", "32", "--max-batch", "2", "--platforms", "cpu",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "16 of 16 greedy tokens equal" in result.stdout
    assert "GPTQ int4 per group with zero points in activation order" in cli("inspect", str(out)).stdout


def test_groups_of_unequal_size_and_unsupported_widths_are_refused_by_name(tmp_path):
    """Activation order converts (above); a g_idx whose groups are not group_size columns each is no layout GPTQ
    writes, and is refused naming the tensor."""
    from safetensors.numpy import load_file, save_file

    directory, _ = write_quantized(tmp_path / "uneven", "gptq")
    tensors = load_file(directory / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.g_idx"
    tensors[name] = np.sort(np.random.default_rng(0).integers(0, tensors[name].max() + 1, tensors[name].shape)).astype(np.int32)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(torch2jax.InputSpecError, match="down_proj.g_idx: its groups are not 32 columns each"):
        torch2jax.convert_hf(directory, max_cache_len=32, max_batch=2, stream_weights=True)
    config = json.loads((directory / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(torch2jax.InputSpecError, match=r"GPTQ with 3-bit weights .*Pre-quantized checkpoints that convert"):
        torch2jax.convert_hf(directory, max_cache_len=32, max_batch=2)


def test_stored_zero_points_and_values_read_as_the_packers_wrote_them(tmp_path):
    """The repacking alone, every width: what each tool packed (values, zeros, v1's minus one, AWQ's order) reads back."""
    import transformers

    from torch2jax.capture.checkpoint_files import Checkpoint
    from torch2jax.hf.prequantized import checkpoint_format

    for method, bits, fmt, act_order in (("gptq", 2, "gptq", False), ("gptq", 4, "gptq_v2", False),
                                         ("gptq", 8, "gptq", True), ("awq", 4, "gemm", False)):
        directory, dequantized = write_quantized(tmp_path / f"{method}{bits}{fmt}", method, bits=bits, group=64, fmt=fmt,
                                                 act_order=act_order)
        config = transformers.AutoConfig.from_pretrained(directory)
        stored, taken = checkpoint_format(config).stored_weights(Checkpoint.open(directory))
        assert len(stored) == PROJECTIONS and all(name.endswith((".qweight", ".qzeros", ".scales", ".g_idx")) for name in taken)
        for name, weight in stored.items():
            np.testing.assert_allclose(weight.dequantize(), dequantized[name], rtol=0, atol=0)
