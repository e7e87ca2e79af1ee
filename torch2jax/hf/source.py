"""A Hugging Face model resolved once, into the one record every later stage takes.

`resolve_source` turns what the user named (an `hf:DIR` or a path, or a transformers model object) into an
`HFSource`: the directory checked, its config read (once: no later stage resolves the path or reads the config
again), the task (given, else what the config implies) and the files that travel with the artifact.
`load_generation_model` adds the model a generation task converts: loaded with transformers, or built with fake
params and its weights mapped from the safetensors files (hf/streamed.py); `forward_target` loads a forward-pass task's
model from the same record, with example inputs made by the task's input maker (hf/tasks.py).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..capture.target import Target, from_specs, load_weights
from ..capture.weight_source import WeightSource
from ..errors import InputSpecError
from ..ir import input_specs
from .directory import load_model, open_directory, prepare_for_export
from .streamed import fake_generation_model, fake_model
from .tasks import (
    FORWARD_TASKS,
    TEXT2TEXT_GENERATION,
    TEXT_GENERATION,
    Example,
    auto_class,
    check_generation_task,
    task_of,
)


@dataclass(frozen=True)
class HFSource:
    """A Hugging Face model as the conversion sees it."""

    name: str  # as given ("hf:DIR", a path), or a model object's class name: what progress lines and the manifest say
    directory: Path | None  # the model directory; None for a model object
    config: Any  # its config, read once
    task: str  # "text-generation", "image-text-to-text", ... (hf/tasks.py)
    tokenizer_files: dict[str, Path] = field(default_factory=dict)  # the directory's, to travel with the artifact
    processor_files: dict[str, Path] = field(default_factory=dict)  # the same, for an image-text-to-text model
    model: Any = None  # the model to convert, once loaded (a model object: itself)
    weights: WeightSource | None = None  # streamed: where each param's tensor is in the safetensors files


def resolve_source(source: Any, task: str | None = None) -> HFSource:
    """`source` (an `hf:DIR` / path, or a transformers model) -> its HFSource, the model not yet loaded for a
    directory. A checkpoint stored quantized by another tool is refused here (hf/directory.read_config)."""
    if isinstance(source, (str, os.PathLike)):
        directory, config, tokenizer, processor = open_directory(source)
        return HFSource(str(source), directory, config, task or task_of(config), tokenizer, processor)
    config = getattr(source, "config", None)
    if config is None:
        raise InputSpecError(f"convert_hf takes a model directory or a transformers model, got {type(source).__name__}")
    return HFSource(type(source).__name__, None, config, task or task_of(config, source), model=source)


def load_generation_model(source: HFSource, stream_weights: bool = False) -> HFSource:
    """The source with the model its generation task converts, in eval mode and ready for export (hf/directory's
    prepare_for_export; an encoder-decoder as loaded): loaded with transformers, or with `stream_weights` built with
    fake params beside the WeightSource of its safetensors files (a directory's model)."""
    check_generation_task(source.task)
    if stream_weights:
        if source.directory is None:
            raise InputSpecError("stream_weights=True reads the weights from a model directory: pass its path, not a model object")
        model, weights = fake_generation_model(source.directory, source.task, source.config)
        return dataclasses.replace(source, model=model, weights=weights)
    model = source.model if source.directory is None else load_model(auto_class(source.task, source.config), source.directory)
    if source.task != TEXT2TEXT_GENERATION:
        prepare_for_export(model)
    return dataclasses.replace(source, model=model.eval())


def forward_target(source: HFSource, inputs: list[str] | None = None, weights: str | None = None, train: bool = False,
                   seed: int = 0, stream: bool = False) -> Target:
    """The source for its forward-pass task: the model from the task's auto class, and example inputs from `inputs`
    (--input specs) or made from its config by the task's input maker (hf/tasks.FORWARD_TASKS). With `stream` (and no
    `weights` file) the model has fake params and `Target.weights` maps its safetensors files."""
    import torch

    if source.task not in FORWARD_TASKS:
        known = ", ".join([*FORWARD_TASKS, TEXT_GENERATION, TEXT2TEXT_GENERATION])
        raise InputSpecError(f"task {source.task!r} is not supported for hf: targets (supported: {known})")
    model_class = auto_class(source.task)
    streamed = None
    if stream and not weights:
        module, streamed = fake_model(model_class, source.directory, source.config)
    else:
        module = load_model(model_class, source.directory).eval()
        prepare_for_export(module)
        if weights:
            load_weights(module, weights)
    module.train(train)
    if inputs:
        args, kwargs, dynamic = from_specs(module, [input_specs.parse(text) for text in inputs], seed)
        return Target(module, args, kwargs, dynamic, source.name, None, streamed)
    made = FORWARD_TASKS[source.task].inputs(Example(source.directory, module.config, module, torch.Generator().manual_seed(seed)))
    return Target(module, (), {name: tensor for name, (tensor, _) in made.items()},
                  {name: dims for name, (_, dims) in made.items()}, source.name, None, streamed)
