"""Hugging Face model directories (`hf:DIR`, as `save_pretrained` writes them): local files only.

This is the one place that imports transformers for the hf room, offline: nothing is ever downloaded.
It finds the directory, reads its config, loads a model with the attention kept whole where the
architecture allows it, and lists the tokenizer and processor files that travel with an artifact.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from ..capture.weight_source import mismatch_report
from ..errors import InputSpecError, Torch2JaxError

PREFIX = "hf:"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json", "chat_template.jinja", "chat_template.json")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # tried in this order
T = TypeVar("T")


def transformers() -> ModuleType:
    """transformers, imported with the hub offline: a directory's files are all that is read."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers as module

    return module


def is_hf_target(target: Any) -> bool:
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


def open_directory(target: str | os.PathLike) -> tuple[Path, Any, dict[str, Path], dict[str, Path]]:
    """(the directory, its config, its tokenizer files, its processor files) of an `hf:DIR` target or a path: what a
    conversion reads of a directory before loading its model, read once."""
    directory = model_dir(target)
    return directory, read_config(directory), tokenizer_files(directory), processor_files(directory)


def read_config(directory: Path) -> Any:
    """The directory's config; a checkpoint stored quantized by another tool is refused unless its format converts as
    it is stored (see check_not_quantized)."""
    config = transformers().AutoConfig.from_pretrained(directory, local_files_only=True)
    check_not_quantized(config, directory)
    return config


def check_not_quantized(config: Any, directory: Path) -> None:
    """A `quantization_config` means the safetensors hold another tool's quantized format: fp8 blocks and
    compressed-tensors, GPTQ and AWQ convert as they are stored (hf/prequantized.py); any other (bitsandbytes, ...) is
    refused, saying which and what works instead."""
    from .prequantized import check_convertible

    check_convertible(config, directory)


def load_model(auto_class: Any, directory: Path) -> Any:
    """Load with sdpa attention (kept whole and lowered to one fused attention), eager where the architecture has no sdpa.

    A checkpoint stored quantized converts only streamed, which keeps its stored form: transformers would load it
    dequantized to floats. Every weight must come from the checkpoint: transformers fills a missing or misnamed tensor with a fresh random
    initialization (and one of the wrong shape too, when told to go on), which would put random weights in the
    artifact; such a checkpoint is refused here, naming the tensors, before anything is converted."""
    from .prequantized import method_of

    method = method_of(transformers().AutoConfig.from_pretrained(directory, local_files_only=True))
    if method is not None:
        raise InputSpecError(f"{directory} holds weights quantized with {method}, which convert only streamed from the "
                             "safetensors files (the default: drop --weights-in-memory / pass stream_weights=True), keeping "
                             "the stored form; loaded by transformers they would be dequantized to floats")
    logging = transformers().utils.logging
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # its load report is replaced by our error, or says nothing worth it
    try:
        model, info = with_attention_fallback(
            lambda attention: auto_class.from_pretrained(directory, local_files_only=True, attn_implementation=attention,
                                                         output_loading_info=True, ignore_mismatched_sizes=True),
            f"transformers could not load {auto_class.__name__} from {directory}")
    finally:
        logging.set_verbosity(verbosity)
    check_loaded(info, directory)
    return model


def with_attention_fallback(build: Callable[[str], T], failure: str) -> T:
    """`build(attention)` with sdpa, whose attention stays whole (one fused attention op), else with eager where the
    architecture has no sdpa; `failure` starts the error naming both attempts when neither builds."""
    errors = []
    for attention in ATTENTION_IMPLEMENTATIONS:
        try:
            return build(attention)
        except (OSError, ValueError, KeyError) as err:
            errors.append(f"{attention}: {err}")
    raise Torch2JaxError(f"{failure}: {'; '.join(errors)}")


def check_loaded(info: dict, directory: Path) -> None:
    """Refuse a load in which a weight did not come from the checkpoint (transformers' loading info)."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    if not missing and not mismatched:
        return
    shapes = [f"{name}: the checkpoint has {list(stored)}, the model {list(wanted)}" for name, stored, wanted in mismatched]
    raise InputSpecError(mismatch_report(
        missing, sorted(info.get("unexpected_keys") or ()), shapes, differ="shape",
        subject=f"the checkpoint in {directory} does not match the model (transformers would fill these weights with "
                "random values)",
        closing="Is this the checkpoint of this model (config.json)? Nothing was converted."))


def load_quietly(auto_class: Any, directory: Path, config: Any = None) -> Any:
    """The model as transformers itself loads it (a verification reference), in eval mode. With a sliced `config`
    the later layers' tensors are unused on purpose: transformers' load report about them is not shown, and its
    progress bar never breaks into our own progress line. A compressed-tensors checkpoint is decompressed as it loads
    (transformers' `dequantize=True`): its compressed forward cannot load asymmetric int4 weights. GPTQ and AWQ, which
    transformers loads only through GPTQModel, are dequantized here (hf/prequantized.dequantized_reference)."""
    import warnings

    from .prequantized import NOT_LOADED_BY_TRANSFORMERS, dequantized_reference, method_of

    logging = transformers().utils.logging
    extra = {"config": config} if config is not None else {}
    read = config or transformers().AutoConfig.from_pretrained(directory, local_files_only=True)
    if method_of(read) in NOT_LOADED_BY_TRANSFORMERS:
        return dequantized_reference(auto_class, directory, read)
    if method_of(read) == "compressed-tensors":
        extra["quantization_config"] = transformers().CompressedTensorsConfig(dequantize=True)
    verbosity, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    if config is not None:
        logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():  # that the directory's own quantization config is kept: it is
            warnings.filterwarnings("ignore", "You passed `quantization_config`", UserWarning)
            model = auto_class.from_pretrained(directory, local_files_only=True, **extra)
    finally:
        logging.set_verbosity(verbosity)
        if bar:
            logging.enable_progress_bar()
    return model.eval()


def prepare_for_export(model: Any) -> None:
    """Settings under which transformers models export with static shapes: mixture-of-experts layers as batched
    matmuls over every expert (eager routing makes data-dependent shapes; grouped_mm is a custom op), and the
    expert loops written in a model's own code replaced while tracing (hf/stand_ins/)."""
    from . import stand_ins  # noqa: F401 - registers the trace-time stand-ins
    if getattr(model.config, "_experts_implementation", None) not in (None, "batched_mm") and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("batched_mm")


def generation_config(directory: Path, config: Any) -> Any:
    """The directory's generation_config.json, else the one transformers derives from the model config."""
    if (directory / "generation_config.json").is_file():
        return transformers().GenerationConfig.from_pretrained(directory, local_files_only=True)
    return transformers().GenerationConfig.from_model_config(config)


def tokenizer_files(directory: Path) -> dict[str, Path]:
    """The tokenizer and generation files a model directory has, to travel with the artifact."""
    return {name: directory / name for name in TOKENIZER_FILES if (directory / name).is_file()}


def processor_files(directory: Path) -> dict[str, Path]:
    """The processor's files (image-processor settings, chat template) a model directory has, to travel with the artifact."""
    return {name: directory / name for name in PROCESSOR_FILES if (directory / name).is_file()}
