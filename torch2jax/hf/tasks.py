"""What a Hugging Face model is converted for: its task, from `--task` or its config's `architectures`.

Text generation (causal LMs), text2text generation (encoder-decoders) and image-text-to-text become generators with
their own entry points (hf/steps/); every other task is one forward pass through the task's auto class, converted like
any module, on example inputs made from the config.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputSpecError, Torch2JaxError
from .directory import transformers

TEXT_GENERATION = "text-generation"
TEXT2TEXT_GENERATION = "text2text-generation"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"  # vision-language models (hf/steps/vision_language.py), and encoder-decoders
# whose encoder reads the image (VisionEncoderDecoderModel: TrOCR, Donut; hf/steps/seq2seq.py)
IMAGE_ENCODER_DECODER = "vision-encoder-decoder"  # the model_type of VisionEncoderDecoderModel's config
# what convert_hf builds (a Generator, a Seq2SeqGenerator, a VisionLanguageGenerator)
GENERATION_TASKS = (TEXT_GENERATION, TEXT2TEXT_GENERATION, IMAGE_TEXT_TO_TEXT)
GENERATION_AUTO_CLASSES = {TEXT_GENERATION: "AutoModelForCausalLM", TEXT2TEXT_GENERATION: "AutoModelForSeq2SeqLM",
                           IMAGE_TEXT_TO_TEXT: "AutoModelForImageTextToText"}
# the architecture name's suffix -> its task (transformers' naming)
_TASK_BY_SUFFIX = (
    ("ForCausalLM", TEXT_GENERATION),
    ("LMHeadModel", TEXT_GENERATION),
    ("ForConditionalGeneration", TEXT2TEXT_GENERATION),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForImageClassification", "image-classification"),
    ("ForMaskedLM", "fill-mask"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMultipleChoice", "multiple-choice"),
    ("ForObjectDetection", "object-detection"),
    ("ForSemanticSegmentation", "semantic-segmentation"),
    ("ForDepthEstimation", "depth-estimation"),
    ("ForAudioClassification", "audio-classification"),
    ("ForCTC", "automatic-speech-recognition"),
)
# tasks found by the auto class listing the architecture, before the suffix: speech classifiers are named
# *ForSequenceClassification (Wav2Vec2ForSequenceClassification), CLIP-like dual encoders *Model (CLIPModel)
_TASK_BY_LISTING = ("audio-classification", "zero-shot-image-classification")


def default_task(config: Any) -> str:
    """The task the config's `architectures` entry implies (feature-extraction when it names none we know)."""
    architectures = getattr(config, "architectures", None) or []
    if getattr(config, "model_type", None) == IMAGE_ENCODER_DECODER:
        return IMAGE_TEXT_TO_TEXT
    if is_vision_language(config) and any(a.endswith("ForConditionalGeneration") for a in architectures):
        return IMAGE_TEXT_TO_TEXT
    for arch in architectures:
        listed = next((task for task in _TASK_BY_LISTING if arch in _auto_class_names(FORWARD_TASKS[task].auto_class)), None)
        if listed:
            return listed
        for suffix, task in _TASK_BY_SUFFIX:
            if arch.endswith(suffix):
                return task
    return "feature-extraction"


def _auto_class_names(auto_class: str) -> set[str]:
    """The model class names transformers' `auto_class` maps configs to (its own auto mapping)."""
    lazy = getattr(getattr(transformers(), auto_class), "_model_mapping", None)
    mapping = getattr(lazy, "_model_mapping", {})  # model type -> class name(s); {} if transformers changes it
    return {name for names in mapping.values() for name in ([names] if isinstance(names, str) else names)}


def is_vision_language(config: Any) -> bool:
    """A config with a vision part and a text (language-model) part: a vision-language model, not an encoder-decoder."""
    return getattr(config, "vision_config", None) is not None and getattr(config, "text_config", None) is not None


def reads_images(model: Any) -> bool:
    """An encoder-decoder whose encoder reads pixel_values (VisionEncoderDecoderModel): converted as an encoder-decoder
    with a pixel source, not as a vision-language model."""
    return bool(getattr(model.config, "is_encoder_decoder", False)) and getattr(model, "main_input_name", None) == "pixel_values"


def task_of(config: Any, model: Any = None) -> str:
    """The task implied where none is given: a directory's by its config's `architectures` (default_task); a model
    object's by its class name (a model built from a config has no `architectures` until it is saved): a vision part
    and a text part make image-text-to-text, else the name's suffix, else text-generation."""
    if model is None:
        return default_task(config)
    name = type(model).__name__
    image_text = name.endswith("ForConditionalGeneration") or name in _auto_class_names("AutoModelForImageTextToText")
    if (is_vision_language(config) and image_text) or reads_images(model):  # (Nemotron-H Omni's own class name)
        return IMAGE_TEXT_TO_TEXT
    return next((task for suffix, task in _TASK_BY_SUFFIX if name.endswith(suffix)), TEXT_GENERATION)


def auto_class(task: str, config: Any = None) -> Any:
    """transformers' auto class a task's model is loaded with: a generator's (an encoder-decoder whose config is a
    speech model's, such as Whisper, or an image encoder's, VisionEncoderDecoderModel, its own), or a forward-pass
    task's (FORWARD_TASKS)."""
    module = transformers()
    if task == TEXT2TEXT_GENERATION and type(config) in module.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING:
        return module.AutoModelForSpeechSeq2Seq
    if task == TEXT2TEXT_GENERATION and getattr(config, "model_type", None) == IMAGE_ENCODER_DECODER:
        return module.AutoModelForImageTextToText
    return getattr(module, GENERATION_AUTO_CLASSES.get(task) or FORWARD_TASKS[task].auto_class)


def check_generation_task(task: str) -> None:
    if task not in GENERATION_TASKS:
        raise Torch2JaxError(
            f"convert_hf builds text-generation, text2text-generation and image-text-to-text models; task {task!r} is a "
            "forward pass: convert it with "
            f"`torch2jax convert hf:DIR --task {task}` or torch2jax.convert(model, args)"
        )


# ---- example inputs made from the config, one maker per kind of input ----

EXAMPLE_BATCH, EXAMPLE_SEQ, EXAMPLE_CHOICES, EXAMPLE_SAMPLES = 2, 16, 3, 4000
DEFAULT_IMAGE_SIZE = 224
Inputs = dict  # input name -> (example tensor, its dynamic dims {axis: dim})
_BATCH = {"name": "batch", "min": 1}


@dataclass
class Example:
    """What an input maker reads: the model directory (its preprocessor_config.json), config, module, and a seeded
    generator for the values."""

    directory: Path
    config: Any
    module: Any
    generator: Any

    def cannot(self, what: str) -> InputSpecError:
        return InputSpecError(
            f"{self.directory}: {what}, so example inputs cannot be made from the config; pass --input specs "
            f"(e.g. --input input_ids=int64[batch,seq]), or convert the model object with torch2jax.convert(model, args)")

    def preprocessor(self) -> dict:
        path = self.directory / "preprocessor_config.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def takes(self, name: str) -> bool:
        return name in inspect.signature(self.module.forward).parameters


def token_inputs(example: Example, config: Any = None, batch: dict | None = None, choices: int = 0) -> Inputs:
    """input_ids and attention_mask [batch, seq] ([batch, choices, seq] with `choices`), from the vocab size."""
    import torch

    config = config or example.config
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        raise example.cannot("config.json has no vocab_size")
    seq = {"name": "seq", "min": 1, "max": getattr(config, "max_position_embeddings", None)}
    lead = [(EXAMPLE_BATCH, batch or _BATCH)] + ([(choices, {"name": "choices", "min": 1})] if choices else [])
    shape = [size for size, _ in lead] + [EXAMPLE_SEQ]
    dims = {axis: dim for axis, (_, dim) in enumerate(lead)} | {len(lead): seq}
    ids = torch.randint(0, vocab, shape, generator=example.generator)
    return {"input_ids": (ids, dims), "attention_mask": (torch.ones_like(ids), dims)}


def choice_inputs(example: Example) -> Inputs:
    """Multiple choice: token ids and mask [batch, choices, seq]."""
    return token_inputs(example, choices=EXAMPLE_CHOICES)


def pixel_inputs(example: Example, config: Any = None, batch: dict | None = None) -> Inputs:
    """pixel_values [batch, channels, height, width] at the config's image_size (else 224)."""
    import torch

    config = config or example.config
    size = getattr(config, "image_size", None) or DEFAULT_IMAGE_SIZE
    size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    pixels = torch.randn((EXAMPLE_BATCH, getattr(config, "num_channels", 3), *size), generator=example.generator)
    return {"pixel_values": (pixels, {0: batch or _BATCH})}


def encoder_inputs(example: Example) -> Inputs:
    """Feature extraction: tokens and pixels for a dual encoder, pixels for a model that takes pixel_values, else
    token ids."""
    if example.takes("pixel_values"):
        return text_image_inputs(example) if example.takes("input_ids") else pixel_inputs(example)
    return token_inputs(example)


def text_image_inputs(example: Example) -> Inputs:
    """CLIP-like dual encoders: token ids [texts, seq] from the text config and pixels [images, ...] from the
    vision config, their counts independent."""
    config = example.config
    text, vision = getattr(config, "text_config", None), getattr(config, "vision_config", None)
    if text is None or vision is None:
        raise example.cannot("config.json has no text_config and vision_config")
    return {**token_inputs(example, text, {"name": "texts", "min": 1}),
            **pixel_inputs(example, vision, {"name": "images", "min": 1})}


def audio_inputs(example: Example) -> Inputs:
    """The model's main audio input: a waveform input_values [batch, samples] (samples dynamic, from the shortest
    waveform the feature encoder makes two frames of), or spectrogram frames at the sizes the config (or preprocessor_config.json) fixes:
    input_values [batch, frames, mel bins] (AST-like) or input_features [batch, mel bins, frames] (Whisper-like)."""
    import torch

    config, name = example.config, getattr(example.module, "main_input_name", "input_values")
    features = example.preprocessor()
    mels = getattr(config, "num_mel_bins", None) or features.get("num_mel_bins") or features.get("feature_size")
    if name == "input_values" and getattr(config, "max_length", None) and getattr(config, "num_mel_bins", None):
        shape = (EXAMPLE_BATCH, config.max_length, config.num_mel_bins)  # spectrogram patches: fixed frames
        dims = {0: _BATCH}
    elif name == "input_values":
        kernels, strides = getattr(config, "conv_kernel", None) or [1], getattr(config, "conv_stride", None) or [1]
        field, step = 1, 1
        for kernel, stride in zip(kernels, strides):
            field, step = field + (kernel - 1) * step, step * stride
        shortest = field + step  # two frames: torch.export specializes a size of 1
        shape = (EXAMPLE_BATCH, max(EXAMPLE_SAMPLES, shortest))
        dims = {0: _BATCH, 1: {"name": "samples", "min": shortest}}
    elif name == "input_features" and mels and getattr(config, "max_source_positions", None):
        frames = features.get("nb_max_frames") or 2 * config.max_source_positions  # two stride-2 convolutions
        shape, dims = (EXAMPLE_BATCH, mels, frames), {0: _BATCH}
    else:
        raise example.cannot(f"its main input {name!r} has no audio sizes in config.json")
    return {name: (torch.randn(shape, generator=example.generator), dims)}


@dataclass(frozen=True)
class ForwardTask:
    auto_class: str  # the transformers auto class the model is loaded with
    inputs: Callable[[Example], Inputs]  # its example inputs, made from the config


# forward-pass tasks: one function through the task's auto class, on inputs its maker builds
FORWARD_TASKS: dict[str, ForwardTask] = {
    "feature-extraction": ForwardTask("AutoModel", encoder_inputs),
    "text-classification": ForwardTask("AutoModelForSequenceClassification", token_inputs),
    "token-classification": ForwardTask("AutoModelForTokenClassification", token_inputs),
    "fill-mask": ForwardTask("AutoModelForMaskedLM", token_inputs),
    "question-answering": ForwardTask("AutoModelForQuestionAnswering", token_inputs),
    "multiple-choice": ForwardTask("AutoModelForMultipleChoice", choice_inputs),
    "image-classification": ForwardTask("AutoModelForImageClassification", pixel_inputs),
    "object-detection": ForwardTask("AutoModelForObjectDetection", pixel_inputs),
    "semantic-segmentation": ForwardTask("AutoModelForSemanticSegmentation", pixel_inputs),
    "depth-estimation": ForwardTask("AutoModelForDepthEstimation", pixel_inputs),
    "zero-shot-image-classification": ForwardTask("AutoModelForZeroShotImageClassification", text_image_inputs),
    "audio-classification": ForwardTask("AutoModelForAudioClassification", audio_inputs),
    "automatic-speech-recognition": ForwardTask("AutoModelForCTC", audio_inputs),
}
