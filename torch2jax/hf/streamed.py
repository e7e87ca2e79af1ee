"""Hugging Face directories converted without materializing the weights.

The model is built from config.json with fake parameters (capture/fake_params.py) in the dtype
`from_pretrained` would pick (config dtype, else the checkpoint's first floating tensor), its
buffers real; the checkpoint's tensors are mapped onto its params with transformers' own load-time
renaming and fusing rules (hf/checkpoint_rules.py, capture/weight_source.py) and read only when the artifact is written.
A vision-language model (image-text-to-text) is built the same way, its language model's layers counted and sliced in
its text config.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from ..capture.checkpoint_files import Checkpoint
from ..capture.fake_params import fake_parameters
from ..capture.weight_source import WeightSource
from ..ir import dtypes
from .checkpoint_rules import transformers_rules
from .directory import generation_config, prepare_for_export, read_config, transformers, with_attention_fallback
from .prequantized import checkpoint_format
from .tasks import IMAGE_TEXT_TO_TEXT, TEXT_GENERATION, auto_class

LAYER_LISTS = ("layer_types",)  # per-layer config entries that follow num_hidden_layers


def fake_causal_lm(directory: Path, config: Any = None, vision: bool = False) -> tuple[Any, WeightSource]:
    """(a causal LM with fake params and real buffers, the source of its weights) for a model directory; `vision`:
    the vision-language model (AutoModelForImageTextToText) around it."""
    lm, source = fake_model(auto_class(IMAGE_TEXT_TO_TEXT if vision else TEXT_GENERATION), directory, config)
    lm.generation_config = generation_config(directory, lm.config)
    return lm, source


def fake_model(model_class: Any, directory: Path, config: Any = None) -> tuple[Any, WeightSource]:
    """(the model of `model_class` (a transformers auto class) with fake params, in eval mode, and its WeightSource),
    checked against the files."""
    transformers()  # offline, before anything of transformers is imported
    from transformers.initialization import no_init_weights

    checkpoint = Checkpoint.open(directory)
    config = config or read_config(directory)
    dtype = _load_dtype(config, checkpoint)

    def build(attention: str) -> Any:
        with fake_parameters(), no_init_weights():  # random init is wasted on fakes (and some inits read values)
            model = model_class.from_config(config, attn_implementation=attention, dtype=dtype)
        model.tie_weights()  # what init_weights would have done besides initializing
        return model

    model = with_attention_fallback(build, f"transformers could not build {model_class.__name__} for {directory}")
    prepare_for_export(model)
    renames, fuses = transformers_rules(model)
    quantized = checkpoint_format(config)  # stored quantized: its weights keep that form (hf/prequantized.py)
    source = WeightSource(checkpoint, renames, fuses, stored=quantized.stored_weights(checkpoint) if quantized else None)
    source.check(model)
    return model.eval(), source


def num_layers(config: Any) -> int | None:
    """The decoder layers of the language model (a vision-language model's in its text config)."""
    return getattr(_text_config(config), "num_hidden_layers", None)


def sliced_config(config: Any, layers: int) -> Any:
    """The same config with only the first `layers` decoder layers (and per-layer lists cut alike); a vision-language
    model's text config is cut, its vision tower kept whole."""
    small = copy.deepcopy(config)
    text = _text_config(small)
    text.num_hidden_layers = layers
    for name in LAYER_LISTS:
        value = getattr(text, name, None)
        if isinstance(value, (list, tuple)):
            setattr(text, name, type(value)(value[:layers]))
    return small


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _load_dtype(config: Any, checkpoint: Checkpoint) -> torch.dtype:
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if isinstance(dtype, torch.dtype):
        return dtype
    for entry in checkpoint.entries.values():
        if dtypes.is_floating(entry.dtype):
            return getattr(torch, dtypes.name_of(entry.dtype))
    return torch.get_default_dtype()
