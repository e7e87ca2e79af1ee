"""Verifying a conversion whose weights were streamed, without the whole model in memory.

A model of at most `layers` decoder layers is compared whole: the saved artifact against transformers
loading the same directory. A deeper one is compared on a slice: its first `layers` layers (embeddings,
final norm and head included) with the real weights, converted by the same streamed path and saved to
a temporary artifact, against transformers loading the same slice. Where the conversion repeated a
middle layer's graph (hf/layer_repeat.py), the slice is deep enough to be converted that way too. The
output says which was done. A vision-language model is compared the same way with an image in each prompt, its
language model's layers counted and sliced, its vision tower whole.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from ..capture.converter import quantize_like
from ..generate.generator_artifact import load_generator, save_generator
from ..runtime.quantize import DEFAULT_GROUP_SIZE
from .causal_lm import SLICE_UNITS, convert_causal_lm
from .directory import load_quietly
from .streamed import lm_class, num_layers, sliced_config, streamed_causal_lm
from .verify import check_generation, verify_generation, verify_vision_language
from .vision_language import convert_vision_language


def verify_streamed(directory: Path, artifact_dir: Path, config: Any, *, layers: int = 2, tokens: int = 16,
                    dtype: str | None = None, max_cache_len: int = 512, max_batch: int = 8, seed: int = 0,
                    progress: Any = None, repeat_slice: int | None = None, quantization: dict | None = None,
                    vision: bool = False) -> str:
    """Check a streamed text-generation artifact against transformers; returns what was checked (raises if it differs).
    `repeat_slice`: where the conversion repeated layers, the depth of a slice that converts that way too
    (hf.causal_lm.repeat_slice); None if it traced every layer. `quantization` (the artifact's): transformers runs
    with the same weights dequantized, and a slice is converted quantized alike. `vision`: an image-text-to-text
    artifact, compared with images (hf.verify.verify_vision_language)."""
    quantization = quantization or {}
    compare = verify_vision_language if vision else verify_generation
    depth = num_layers(config)
    if repeat_slice is not None:
        layers = max(layers, repeat_slice)
    if depth is None or depth <= layers:
        if progress:
            progress("verify", f"greedy-generate {tokens} tokens with the saved artifact and with transformers (whole model)")
        reference = quantize_like(_cast(_reference(directory, vision=vision), dtype), quantization)
        result = compare(reference, load_generator(artifact_dir), tokens=tokens, seed=seed)
        check_generation(result)
        how = f", its {quantization['scheme']} weights dequantized" if quantization else ""
        return f"verified against transformers (the whole model, {depth} layers{how}):\n{result.summary()}"
    if progress:
        progress("verify", f"convert the first {layers} of {depth} layers the same way and generate {tokens} tokens with both")
    small = sliced_config(config, layers)
    with tempfile.TemporaryDirectory(prefix="torch2jax-verify-") as scratch:
        generator = _convert_slice(directory, small, Path(scratch) / "slice", dtype, max_cache_len, max_batch,
                                   repeat_slice is not None, quantization, vision)
        reference = quantize_like(_cast(_reference(directory, small, vision), dtype), generator.prefill_model.quantization)
        result = compare(reference, generator, tokens=tokens, seed=seed)
    check_generation(result)
    how = " (its middle layers repeated, as for the whole model)" if repeat_slice is not None else ""
    included = "the vision tower, embeddings, norm and head" if vision else "embeddings, norm and head"
    return (f"verified a slice against transformers: the first {layers} of {depth} layers ({included} "
            f"included) with the real weights, converted by the same streamed path{how}; the whole model is not run in torch, "
            f"which would need all its weights in memory:\n{result.summary()}")


def _convert_slice(directory: Path, config: Any, out: Path, dtype: str | None, max_cache_len: int, max_batch: int,
                   repeat_layers: bool, quantization: dict, vision: bool):
    lm, _, weights = streamed_causal_lm(directory, config, vision=vision)
    if vision:
        generator = convert_vision_language(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype,
                                            weights=weights, quantize=quantization.get("scheme"),
                                            group_size=quantization.get("group_size", DEFAULT_GROUP_SIZE))
    else:
        generator = convert_causal_lm(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype, weights=weights,
                                      repeat_layers=SLICE_UNITS if repeat_layers else False,
                                      quantize=quantization.get("scheme"),
                                      group_size=quantization.get("group_size", DEFAULT_GROUP_SIZE))
    save_generator(generator, out, platforms=("cpu",))
    return load_generator(out)


def _cast(lm: torch.nn.Module, dtype: str | None) -> torch.nn.Module:
    return lm.to(getattr(torch, dtype)) if dtype else lm


def _reference(directory: Path, config: Any = None, vision: bool = False) -> torch.nn.Module:
    return load_quietly(lm_class(vision), directory, config)
