"""Hugging Face model directories (`hf:DIR`, as `save_pretrained` writes them): local files only.

The architecture comes from config.json; the task defaults to what its `architectures` entry
implies. A causal LM for text generation becomes a `Generator` (capture/decoder.py), an encoder-decoder
for text2text generation a `Seq2SeqGenerator` (capture/seq2seq.py); tokenizer files found in the
directory travel with either.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from ..errors import InputSpecError, Torch2JaxError

PREFIX = "hf:"
TEXT_GENERATION = "text-generation"
TEXT2TEXT_GENERATION = "text2text-generation"
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
TASKS = (TEXT_GENERATION, TEXT2TEXT_GENERATION)  # what convert_hf builds (a Generator, a Seq2SeqGenerator)
# forward-pass tasks: the transformers auto class to load, converted as one function (today's artifact)
FORWARD_TASKS = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "fill-mask": "AutoModelForMaskedLM",
    "image-classification": "AutoModelForImageClassification",
}
EXAMPLE_BATCH, EXAMPLE_SEQ = 2, 16
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def tp_plan_hints(module: Any) -> dict[str, str]:
    """A transformers model's own tensor-parallel plan (`config.base_model_tp_plan`: {module pattern: style}),
    with the patterns prefixed by where the base model sits in `module` (e.g. "model."); {} for other modules."""
    config = getattr(module, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if not isinstance(plan, dict):
        return {}
    prefix = getattr(module, "base_model_prefix", "")
    base = f"{prefix}." if prefix and hasattr(module, prefix) else ""
    return {f"{base}{pattern}": style for pattern, style in plan.items() if isinstance(pattern, str) and isinstance(style, str)}


def is_hf_target(target: str) -> bool:
    return isinstance(target, str) and target.startswith(PREFIX)


def model_dir(target: str | os.PathLike) -> Path:
    """The local directory of an `hf:DIR` target (or a plain path), checked to hold a config.json."""
    text = str(target)
    path = Path(text[len(PREFIX):] if text.startswith(PREFIX) else text).expanduser()
    if not path.is_dir():
        raise InputSpecError(f"{path} is not a directory: hf: takes a local model directory (config.json + *.safetensors); "
                             "nothing is downloaded")
    if not (path / "config.json").is_file():
        raise InputSpecError(f"{path} has no config.json: is it a directory written by save_pretrained?")
    return path


def default_task(config: Any) -> str:
    architectures = getattr(config, "architectures", None) or []
    for arch in architectures:
        for suffix, task in _TASK_BY_SUFFIX:
            if arch.endswith(suffix):
                return task
    return "feature-extraction"


def convert_hf(
    source: Any,
    *,
    task: str | None = None,
    max_cache_len: int = 512,
    max_batch: int = 8,
    dtype: str | None = None,
    progress: Any = None,
    stream_weights: bool = False,
    max_source_len: int = 512,
    repeat_layers: bool = True,
):
    """A Hugging Face model directory (or a transformers model object) -> a torch-free `Generator`, or for
    text2text-generation (encoder-decoders: T5, BART, Whisper) a `Seq2SeqGenerator` for sources of up to `max_source_len`.

    `stream_weights=True` (a directory only, causal LMs) builds the model with fake parameters and reads each weight
    from the safetensors files only when the Generator is saved: memory stays flat in the model's size, and the
    Generator runs once saved and loaded (capture/hf_stream.py).
    `repeat_layers=False` traces every decoder layer with torch.export; by default a stack of alike layers is traced
    at 3 and 4 layers and a middle one repeated, after checking that this reproduces the 4-layer trace.
    """
    from .decoder import convert_causal_lm

    if generation_task(source, task) == TEXT2TEXT_GENERATION:
        if stream_weights:
            raise InputSpecError("stream_weights=True is for causal LMs; text2text-generation models load in memory: "
                                 "pass stream_weights=False")
        from .seq2seq import convert_seq2seq

        lm, directory = seq2seq_lm_from(source)
        generator = convert_seq2seq(lm, max_cache_len=max_cache_len, max_batch=max_batch, max_source_len=max_source_len,
                                    dtype=dtype, progress=progress)
        if directory is not None:
            generator.tokenizer_files = tokenizer_files(directory)
        return generator
    weights = None
    if stream_weights:
        if not isinstance(source, (str, os.PathLike)):
            raise InputSpecError("stream_weights=True reads the weights from a model directory: pass its path, not a model object")
        lm, directory, weights = streamed_causal_lm(source, task)
    else:
        lm, directory = causal_lm_from(source, task)
    generator = convert_causal_lm(lm, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype, progress=progress,
                                  weights=weights, repeat_layers=repeat_layers)
    if directory is not None:
        generator.tokenizer_files = tokenizer_files(directory)
    return generator


def generation_task(source: Any, task: str | None) -> str:
    """`task`, else what the config of `source` (a directory or a transformers model) implies."""
    if task:
        return task
    if isinstance(source, (str, os.PathLike)):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import transformers

        return default_task(transformers.AutoConfig.from_pretrained(model_dir(source), local_files_only=True))
    name = type(source).__name__  # a model built from a config has no `architectures` until it is saved
    return next((task for suffix, task in _TASK_BY_SUFFIX if name.endswith(suffix)), TEXT_GENERATION)


def seq2seq_lm_from(source: Any) -> tuple[Any, Path | None]:
    """(the encoder-decoder ready for export, its directory or None) from an `hf:DIR` / path or a transformers model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    directory = None
    if isinstance(source, (str, os.PathLike)):
        directory = model_dir(source)
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
        speech = type(config) in transformers.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING  # Whisper: AutoModelForSpeechSeq2Seq
        lm = _load(transformers.AutoModelForSpeechSeq2Seq if speech else transformers.AutoModelForSeq2SeqLM, directory)
    elif getattr(source, "config", None) is None:
        raise InputSpecError(f"convert_hf takes a model directory or a transformers model, got {type(source).__name__}")
    else:
        lm = source
    return lm.eval(), directory


def causal_lm_from(source: Any, task: str | None = None) -> tuple[Any, Path | None]:
    """(the causal LM ready for export, its directory or None) from an `hf:DIR` / path or a transformers model."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    directory = None
    if isinstance(source, (str, os.PathLike)):
        directory = model_dir(source)
        config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    else:
        config = getattr(source, "config", None)
        if config is None:
            raise InputSpecError(f"convert_hf takes a model directory or a transformers model, got {type(source).__name__}")
    _check_generation_task(task or default_task(config))
    lm = _load_causal_lm(transformers, directory) if directory is not None else source
    prepare_for_export(lm)
    return lm.eval(), directory


def streamed_causal_lm(source: str | os.PathLike, task: str | None = None, config: Any = None) -> tuple[Any, Path, Any]:
    """(the causal LM with fake params, its directory, the WeightSource of its safetensors files)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    from .hf_stream import fake_causal_lm

    directory = model_dir(source)
    config = config or transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    _check_generation_task(task or default_task(config))
    lm, weights = fake_causal_lm(directory, config)
    return lm, directory, weights


def _check_generation_task(task: str) -> None:
    if task not in TASKS:
        raise Torch2JaxError(
            f"convert_hf builds text-generation and text2text-generation models; task {task!r} is a forward pass: convert it with "
            f"`torch2jax convert hf:DIR --task {task}` or torch2jax.convert(model, args)"
        )


def tokenizer_files(directory: Path) -> dict[str, Path]:
    """The tokenizer and generation files a model directory has, to travel with the artifact."""
    return {name: directory / name for name in TOKENIZER_FILES if (directory / name).is_file()}


def forward_target(target: str, task: str | None, seed: int = 0, stream: bool = False) -> tuple[Any, tuple, dict, Any, Any]:
    """(module, args, kwargs, dynamic_shapes, weights) for a forward-pass task of an `hf:DIR` target: the model from its
    auto class, example inputs from its config (token ids [batch, seq] and a mask, or pixel values [batch, C, H, W]).
    With `stream` the model has fake params and `weights` is the WeightSource of its safetensors files (else None)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    directory = model_dir(target)
    config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    task = task or default_task(config)
    if task not in FORWARD_TASKS:
        known = ", ".join([*FORWARD_TASKS, TEXT_GENERATION])
        raise InputSpecError(f"task {task!r} is not supported for hf: targets (supported: {known})")
    auto_class = getattr(transformers, FORWARD_TASKS[task])
    weights = None
    if stream:
        from .hf_stream import fake_model

        module, weights = fake_model(auto_class, directory, config)
    else:
        module = _load(auto_class, directory).eval()
        prepare_for_export(module)
    generator = torch.Generator().manual_seed(seed)
    batch = {"name": "batch", "min": 1}
    if task == "image-classification" or "pixel_values" in inspect.signature(module.forward).parameters:
        size = getattr(config, "image_size", 224)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        pixels = torch.randn((EXAMPLE_BATCH, getattr(config, "num_channels", 3), *size), generator=generator)
        return module, (), {"pixel_values": pixels}, {"pixel_values": {0: batch}}, weights
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        raise InputSpecError(f"{directory}: config.json has no vocab_size, so example token ids cannot be made; "
                             "convert the model object with torch2jax.convert(model, args) instead")
    seq = {"name": "seq", "min": 1, "max": getattr(config, "max_position_embeddings", None)}
    ids = torch.randint(0, vocab, (EXAMPLE_BATCH, EXAMPLE_SEQ), generator=generator)
    mask = torch.ones_like(ids)
    dims = {0: batch, 1: seq}
    return module, (), {"input_ids": ids, "attention_mask": mask}, {"input_ids": dims, "attention_mask": dims}, weights


def _load_causal_lm(transformers: Any, directory: Path) -> Any:
    return _load(transformers.AutoModelForCausalLM, directory)


def _load(auto_class: Any, directory: Path) -> Any:
    """Load with sdpa attention (kept whole and lowered to one fused attention), eager where the architecture has no sdpa."""
    errors = []
    for attention in ("sdpa", "eager"):
        try:
            return auto_class.from_pretrained(directory, local_files_only=True, attn_implementation=attention)
        except (OSError, ValueError, KeyError) as err:
            errors.append(f"{attention}: {err}")
    raise Torch2JaxError(f"transformers could not load {auto_class.__name__} from {directory}: {'; '.join(errors)}")


def prepare_for_export(lm: Any) -> None:
    """Settings under which transformers models export with static shapes: mixture-of-experts layers as batched
    matmuls over every expert (eager routing makes data-dependent shapes; grouped_mm is a custom op)."""
    if getattr(lm.config, "_experts_implementation", None) not in (None, "batched_mm") and hasattr(lm, "set_experts_implementation"):
        lm.set_experts_implementation("batched_mm")
