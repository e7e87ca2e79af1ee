"""What a Hugging Face model is converted for: its task, from `--task` or its config's `architectures`.

Text generation (causal LMs) and text2text generation (encoder-decoders) become generators with their
own entry points (hf/causal_lm.py, hf/seq2seq.py); every other task is one forward pass through the
task's auto class, converted like any module, on example inputs made from the config.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from ..capture.target import Target, from_specs, load_weights
from ..errors import InputSpecError, Torch2JaxError
from ..ir import input_specs
from .directory import load_model, model_dir, prepare_for_export, read_config, transformers

TEXT_GENERATION = "text-generation"
TEXT2TEXT_GENERATION = "text2text-generation"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"  # vision-language models (hf/vision_language.py)
# what convert_hf builds (a Generator, a Seq2SeqGenerator, a VisionLanguageGenerator)
GENERATION_TASKS = (TEXT_GENERATION, TEXT2TEXT_GENERATION, IMAGE_TEXT_TO_TEXT)
# the architecture name's suffix -> its task (transformers' naming)
_TASK_BY_SUFFIX = (
    ("ForCausalLM", TEXT_GENERATION),
    ("LMHeadModel", TEXT_GENERATION),
    ("ForConditionalGeneration", TEXT2TEXT_GENERATION),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForImageClassification", "image-classification"),
    ("ForMaskedLM", "fill-mask"),
)
# forward-pass tasks: the transformers auto class to load, converted as one function
FORWARD_TASKS = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "fill-mask": "AutoModelForMaskedLM",
    "image-classification": "AutoModelForImageClassification",
}
EXAMPLE_BATCH, EXAMPLE_SEQ = 2, 16


def default_task(config: Any) -> str:
    """The task the config's `architectures` entry implies (feature-extraction when it names none we know)."""
    architectures = getattr(config, "architectures", None) or []
    if is_vision_language(config) and any(a.endswith("ForConditionalGeneration") for a in architectures):
        return IMAGE_TEXT_TO_TEXT
    for arch in architectures:
        for suffix, task in _TASK_BY_SUFFIX:
            if arch.endswith(suffix):
                return task
    return "feature-extraction"


def is_vision_language(config: Any) -> bool:
    """A config with a vision part and a text (language-model) part: a vision-language model, not an encoder-decoder."""
    return getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None


def task_of(source: Any, task: str | None = None) -> str:
    """`task`, else what the config of `source` (an `hf:DIR` / path, or a transformers model) implies."""
    if task:
        return task
    if isinstance(source, (str, os.PathLike)):
        return default_task(read_config(model_dir(source)))
    name = type(source).__name__  # a model built from a config has no `architectures` until it is saved
    if is_vision_language(getattr(source, "config", None)) and name.endswith("ForConditionalGeneration"):
        return IMAGE_TEXT_TO_TEXT
    return next((task for suffix, task in _TASK_BY_SUFFIX if name.endswith(suffix)), TEXT_GENERATION)


def check_generation_task(task: str) -> None:
    if task not in GENERATION_TASKS:
        raise Torch2JaxError(
            f"convert_hf builds text-generation, text2text-generation and image-text-to-text models; task {task!r} is a "
            "forward pass: convert it with "
            f"`torch2jax convert hf:DIR --task {task}` or torch2jax.convert(model, args)"
        )


def forward_target(target: str, task: str | None = None, inputs: list[str] | None = None, weights: str | None = None,
                   train: bool = False, seed: int = 0, stream: bool = False) -> Target:
    """An `hf:DIR` target for a forward-pass task: the model from its auto class, and example inputs from `inputs`
    (--input specs) or from its config (token ids [batch, seq] and a mask, or pixel values [batch, C, H, W]).
    With `stream` (and no `weights` file) the model has fake params and `Target.weights` maps its safetensors files."""
    import torch

    directory = model_dir(target)
    config = read_config(directory)
    task = task or default_task(config)
    if task not in FORWARD_TASKS:
        known = ", ".join([*FORWARD_TASKS, TEXT_GENERATION, TEXT2TEXT_GENERATION])
        raise InputSpecError(f"task {task!r} is not supported for hf: targets (supported: {known})")
    auto_class = getattr(transformers(), FORWARD_TASKS[task])
    source = None
    if stream and not weights:
        from .streamed import fake_model

        module, source = fake_model(auto_class, directory, config)
    else:
        module = load_model(auto_class, directory).eval()
        prepare_for_export(module)
        if weights:
            load_weights(module, weights)
    module.train(train)
    if inputs:
        args, kwargs, dynamic = from_specs(module, [input_specs.parse(text) for text in inputs], seed)
        return Target(module, args, kwargs, dynamic, target, None, source)
    generator = torch.Generator().manual_seed(seed)
    batch = {"name": "batch", "min": 1}
    if task == "image-classification" or "pixel_values" in inspect.signature(module.forward).parameters:
        size = getattr(config, "image_size", 224)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        pixels = torch.randn((EXAMPLE_BATCH, getattr(config, "num_channels", 3), *size), generator=generator)
        return Target(module, (), {"pixel_values": pixels}, {"pixel_values": {0: batch}}, target, None, source)
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        raise InputSpecError(f"{directory}: config.json has no vocab_size, so example token ids cannot be made; "
                             "convert the model object with torch2jax.convert(model, args) instead")
    seq = {"name": "seq", "min": 1, "max": getattr(config, "max_position_embeddings", None)}
    ids = torch.randint(0, vocab, (EXAMPLE_BATCH, EXAMPLE_SEQ), generator=generator)
    mask = torch.ones_like(ids)
    dims = {0: batch, 1: seq}
    return Target(module, (), {"input_ids": ids, "attention_mask": mask}, {"input_ids": dims, "attention_mask": dims},
                  target, None, source)
