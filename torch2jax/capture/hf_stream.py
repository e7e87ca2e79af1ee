"""Hugging Face directories converted without materializing the weights.

The model is built from config.json with fake parameters (capture/fake_params.py) in the dtype
`from_pretrained` would pick (config dtype, else the checkpoint's first floating tensor), its
buffers real; the checkpoint's tensors are mapped onto its params with transformers' own load-time
renaming and fusing rules (capture/streaming.py) and read only when the artifact is written.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch

from ..errors import Torch2JaxError
from ..ir import dtypes
from .fake_params import fake_parameters
from .safetensors_files import Checkpoint
from .streaming import WeightSource, transformers_rules

LAYER_LISTS = ("layer_types",)  # per-layer config entries that follow num_hidden_layers


def fake_causal_lm(directory: Path, config: Any = None) -> tuple[Any, WeightSource]:
    """(a causal LM with fake params and real buffers, the source of its weights) for a model directory."""
    import transformers

    lm, source = fake_model(transformers.AutoModelForCausalLM, directory, config)
    lm.generation_config = _generation_config(transformers, directory, lm.config)
    return lm, source


def fake_model(auto_class: Any, directory: Path, config: Any = None) -> tuple[Any, WeightSource]:
    """(the model of `auto_class` with fake params, in eval mode, and its WeightSource), checked against the files."""
    import transformers
    from transformers.initialization import no_init_weights

    from .hf import prepare_for_export

    checkpoint = Checkpoint.open(directory)
    config = config or transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    dtype = _load_dtype(config, checkpoint)
    errors = []
    for attention in ("sdpa", "eager"):
        try:
            with fake_parameters(), no_init_weights():  # random init is wasted on fakes (and some inits read values)
                model = auto_class.from_config(config, attn_implementation=attention, dtype=dtype)
            model.tie_weights()  # what init_weights would have done besides initializing
            break
        except (OSError, ValueError, KeyError) as err:
            errors.append(f"{attention}: {err}")
    else:
        raise Torch2JaxError(f"transformers could not build {auto_class.__name__} for {directory}: {'; '.join(errors)}")
    prepare_for_export(model)
    renames, fuses = transformers_rules(model)
    source = WeightSource(checkpoint, renames, fuses)
    source.check(model)
    return model.eval(), source


def num_layers(config: Any) -> int | None:
    return getattr(config, "num_hidden_layers", None)


def sliced_config(config: Any, layers: int) -> Any:
    """The same config with only the first `layers` decoder layers (and per-layer lists cut alike)."""
    small = copy.deepcopy(config)
    small.num_hidden_layers = layers
    for name in LAYER_LISTS:
        value = getattr(small, name, None)
        if isinstance(value, (list, tuple)):
            setattr(small, name, type(value)(value[:layers]))
    return small


def reference_lm(directory: Path, config: Any = None) -> Any:
    """The model as transformers itself loads it (the verification reference), optionally with a sliced config."""
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    extra = {"config": config} if config is not None else {}
    logging = transformers.utils.logging
    verbosity, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # inside our own progress line
    if config is not None:  # a slice: the later layers' tensors are unused on purpose, not worth transformers' report
        logging.set_verbosity_error()
    try:
        lm = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, **extra)
    finally:
        logging.set_verbosity(verbosity)
        if bar:
            logging.enable_progress_bar()
    return lm.eval()


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


def _generation_config(transformers: Any, directory: Path, config: Any) -> Any:
    if (directory / "generation_config.json").is_file():
        return transformers.GenerationConfig.from_pretrained(directory, local_files_only=True)
    return transformers.GenerationConfig.from_model_config(config)
