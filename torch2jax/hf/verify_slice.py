"""Verifying a conversion whose weights were streamed, without the whole model in memory.

A model of at most `layers` decoder layers is compared whole: the saved artifact against transformers
loading the same directory. A deeper one is compared on a slice: its first `layers` layers (embeddings,
final norm and head included) with the real weights, converted by the same streamed path and saved to
a temporary artifact, against transformers loading the same slice. Where the conversion repeated a
middle layer's graph (hf/steps/layer_repeat.py), the slice is deep enough to be converted that way too. The
output says which was done. A vision-language model is compared the same way with an image in each prompt, its
language model's layers counted and sliced, its vision tower whole.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..capture.converter import cast_module, quantize_like
from ..generate.artifacts import load_generator, save_generator
from ..runtime.quantize import DEFAULT_GROUP_SIZE
from .convert import convert_generator
from .directory import load_quietly
from .options import GenerationOptions
from .source import HFSource
from .steps.causal_lm import SLICE_UNITS
from .streamed import fake_generation_model, num_layers, sliced_config
from .tasks import IMAGE_TEXT_TO_TEXT, TEXT2TEXT_GENERATION, auto_class
from .verify import check_generation, verify_generation, verify_seq2seq, verify_vision_language


def verify_streamed(source: HFSource, artifact_dir: Path, options: GenerationOptions, *, layers: int = 2, tokens: int = 16,
                    seed: int = 0, progress: Any = None, repeat_slice: int | None = None,
                    quantization: dict | None = None) -> str:
    """Check a streamed generation artifact (text-generation, or image-text-to-text: compared with images,
    hf.verify.verify_vision_language) against transformers; returns what was checked (raises if it differs). `source`:
    the loaded source the artifact was converted from, `options` what it was converted with.
    `repeat_slice`: where the conversion repeated layers, the depth of a slice that converts that way too
    (hf.steps.causal_lm.repeat_slice); None if it traced every layer. `quantization` (the artifact's): transformers runs
    with the same weights dequantized, and a slice is converted quantized alike."""
    quantization = quantization or {}
    vision = source.task == IMAGE_TEXT_TO_TEXT
    compare = {IMAGE_TEXT_TO_TEXT: verify_vision_language, TEXT2TEXT_GENERATION: verify_seq2seq}.get(source.task,
                                                                                                      verify_generation)
    config = source.model.config
    depth = num_layers(config)
    if repeat_slice is not None:
        layers = max(layers, repeat_slice)
    if depth is None or depth <= layers:
        if progress:
            progress("verify", f"greedy-generate {tokens} tokens with the saved artifact and with transformers (whole model)")
        reference = quantize_like(_cast(_reference(source.directory, source.task, kind=config), options.dtype), quantization)
        result = compare(reference, load_generator(artifact_dir), tokens=tokens, seed=seed)
        check_generation(result)
        how = f", its {quantization['scheme']} weights dequantized" if quantization else ""
        layers_said = f", {depth} layers" if depth is not None else ""
        return f"verified against transformers (the whole model{layers_said}{how}):\n{result.summary()}"
    if progress:
        progress("verify", f"convert the first {layers} of {depth} layers the same way and generate {tokens} tokens with both")
    small = sliced_config(config, layers)
    stored = quantization.get("stored_by") == "checkpoint"  # stored quantized: the slice's weights are too, as they are
    sliced = dataclasses.replace(options, repeat_layers=SLICE_UNITS if repeat_slice is not None else False,
                                 quantize=None if stored else quantization.get("scheme"),
                                 group_size=quantization.get("group_size", DEFAULT_GROUP_SIZE))
    with tempfile.TemporaryDirectory(prefix="torch2jax-verify-") as scratch:
        generator = _convert_slice(source, small, Path(scratch) / "slice", sliced)
        reference = quantize_like(_cast(_reference(source.directory, source.task, small), options.dtype),
                                  next(iter(generator.entries().values())).quantization)
        result = compare(reference, generator, tokens=tokens, seed=seed)
    check_generation(result)
    how = " (its middle layers repeated, as for the whole model)" if repeat_slice is not None else ""
    included = "the vision tower, embeddings, norm and head" if vision else "embeddings, norm and head"
    return (f"verified a slice against transformers: the first {layers} of {depth} layers ({included} "
            f"included) with the real weights, converted by the same streamed path{how}; the whole model is not run in torch, "
            f"which would need all its weights in memory:\n{result.summary()}")


def _convert_slice(source: HFSource, config: Any, out: Path, options: GenerationOptions) -> Any:
    """The slice converted as the whole model was (hf.convert.convert_generator), saved and loaded back."""
    model, weights = fake_generation_model(source.directory, source.task, config)
    generator = convert_generator(dataclasses.replace(source, config=config, model=model, weights=weights), options)
    save_generator(generator, out, platforms=("cpu",))
    return load_generator(out)


def _cast(lm: torch.nn.Module, dtype: str | None) -> torch.nn.Module:
    return cast_module(lm, dtype) if dtype else lm


def _reference(directory: Path, task: str, config: Any = None, kind: Any = None) -> torch.nn.Module:
    """transformers' load of the directory (of the sliced `config`'s layers when given); `kind`: the config that picks
    the auto class (Whisper's is a speech encoder-decoder's)."""
    return load_quietly(auto_class(task, config or kind), directory, config)
