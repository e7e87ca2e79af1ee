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
from .tasks import IMAGE_TEXT_TO_TEXT, TEXT2TEXT_GENERATION, TEXT_GENERATION, auto_class

LAYER_LISTS = ("layer_types",)  # per-layer config entries that follow num_hidden_layers
# an encoder-decoder's layer counts by the names its configs give them (T5's; BART's, Whisper's, Marian's, ...)
SEQ2SEQ_LAYERS = ("num_layers", "num_decoder_layers", "encoder_layers", "decoder_layers")


def fake_causal_lm(directory: Path, config: Any = None, vision: bool = False) -> tuple[Any, WeightSource]:
    """(a causal LM with fake params and real buffers, the source of its weights) for a model directory; `vision`:
    the vision-language model (AutoModelForImageTextToText) around it."""
    return fake_generation_model(directory, IMAGE_TEXT_TO_TEXT if vision else TEXT_GENERATION, config)


def fake_generation_model(directory: Path, task: str, config: Any = None) -> tuple[Any, WeightSource]:
    """(the model a generation task converts, with fake params and real buffers, the source of its weights), with the
    directory's generation config; an encoder-decoder as transformers builds it (as its in-memory load is: not
    prepared for export)."""
    config = config or read_config(directory)
    lm, source = fake_model(auto_class(task, config), directory, config, prepare=task != TEXT2TEXT_GENERATION)
    lm.generation_config = generation_config(directory, lm.config)
    return lm, source


def fake_model(model_class: Any, directory: Path, config: Any = None, prepare: bool = True) -> tuple[Any, WeightSource]:
    """(the model of `model_class` (a transformers auto class) with fake params, in eval mode, and its WeightSource),
    checked against the files; `prepare`: with hf.directory.prepare_for_export's settings."""
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
    if prepare:
        prepare_for_export(model)
    renames, fuses = transformers_rules(model)
    quantized = checkpoint_format(config)  # stored quantized: its weights keep that form (hf/prequantized.py)
    source = WeightSource(checkpoint, renames, fuses, stored=quantized.stored_weights(checkpoint) if quantized else None)
    source.check(model)
    return model.eval(), source


def num_layers(config: Any) -> int | None:
    """The decoder layers of the language model (a vision-language model's in its text config; the deeper of an
    encoder-decoder's two stacks)."""
    if getattr(config, "is_encoder_decoder", False):
        depths = [getattr(config, name) for name in SEQ2SEQ_LAYERS if isinstance(getattr(config, name, None), int)]
        return max(depths, default=None)
    return getattr(_text_config(config), "num_hidden_layers", None)


def sliced_config(config: Any, layers: int) -> Any:
    """The same config with only the first `layers` decoder layers (and per-layer lists cut alike); a vision-language
    model's text config is cut, its vision tower kept whole; an encoder-decoder's encoder and decoder are both cut."""
    small = copy.deepcopy(config)
    if getattr(small, "is_encoder_decoder", False):  # the encoder's and the decoder's first layers
        for name in SEQ2SEQ_LAYERS:
            if isinstance(getattr(small, name, None), int):
                setattr(small, name, min(getattr(small, name), layers))
        return small
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
