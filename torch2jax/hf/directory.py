"""Hugging Face model directories (`hf:DIR`, as `save_pretrained` writes them): local files only.

This is the one place that imports transformers for the hf room, offline: nothing is ever downloaded.
It finds the directory, reads its config, loads a model with the attention kept whole where the
architecture allows it, and lists the tokenizer files that travel with an artifact.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import InputSpecError, Torch2JaxError

PREFIX = "hf:"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


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


def read_config(directory: Path) -> Any:
    """The directory's config; a checkpoint stored quantized by another tool is refused (see check_not_quantized)."""
    config = transformers().AutoConfig.from_pretrained(directory, local_files_only=True)
    check_not_quantized(config, directory)
    return config


def check_not_quantized(config: Any, directory: Path) -> None:
    """A `quantization_config` means the safetensors hold another tool's quantized format (GPTQ, AWQ, bitsandbytes,
    ...), whose tensors the converter cannot read as weights: say which, and what works instead."""
    quantization = getattr(config, "quantization_config", None)
    if not quantization:
        return
    method = quantization.get("quant_method") if isinstance(quantization, dict) else getattr(quantization, "quant_method", None)
    method = getattr(method, "value", method) or "an unnamed method"
    raise InputSpecError(f"{directory} holds weights quantized with {method} (config.json's quantization_config), which "
                         "torch2jax cannot read: convert the unquantized checkpoint, with --quantize int8 or int4 to store "
                         "it quantized")


def load_model(auto_class: Any, directory: Path) -> Any:
    """Load with sdpa attention (kept whole and lowered to one fused attention), eager where the architecture has no sdpa.

    Every weight must come from the checkpoint: transformers fills a missing or misnamed tensor with a fresh random
    initialization (and one of the wrong shape too, when told to go on), which would put random weights in the
    artifact; such a checkpoint is refused here, naming the tensors, before anything is converted."""
    errors = []
    logging = transformers().utils.logging
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # its load report is replaced by our error, or says nothing worth it
    try:
        for attention in ("sdpa", "eager"):
            try:
                model, info = auto_class.from_pretrained(directory, local_files_only=True, attn_implementation=attention,
                                                         output_loading_info=True, ignore_mismatched_sizes=True)
                break
            except (OSError, ValueError, KeyError) as err:
                errors.append(f"{attention}: {err}")
        else:
            raise Torch2JaxError(f"transformers could not load {auto_class.__name__} from {directory}: {'; '.join(errors)}")
    finally:
        logging.set_verbosity(verbosity)
    check_loaded(info, directory)
    return model


def check_loaded(info: dict, directory: Path) -> None:
    """Refuse a load in which a weight did not come from the checkpoint (transformers' loading info)."""
    missing = sorted(info.get("missing_keys") or ())
    mismatched = sorted(info.get("mismatched_keys") or ())
    if not missing and not mismatched:
        return
    lines = [f"the checkpoint in {directory} does not match the model (transformers would fill these weights with random values):"]
    if missing:
        lines.append(f"  {len(missing)} param(s) have no tensor in the checkpoint: {', '.join(missing[:20])}"
                     + (f" (and {len(missing) - 20} more)" if len(missing) > 20 else ""))
        unexpected = sorted(info.get("unexpected_keys") or ())
        if unexpected:
            lines.append(f"  checkpoint tensors no param took: {', '.join(unexpected[:20])}"
                         + (f" (and {len(unexpected) - 20} more)" if len(unexpected) > 20 else ""))
    if mismatched:
        lines.append(f"  {len(mismatched)} tensor(s) differ in shape:")
        lines += [f"    {name}: the checkpoint has {list(stored)}, the model {list(wanted)}" for name, stored, wanted in mismatched[:20]]
    lines.append("Is this the checkpoint of this model (config.json)? Nothing was converted.")
    raise InputSpecError("\n".join(lines))


def load_quietly(auto_class: Any, directory: Path, config: Any = None) -> Any:
    """The model as transformers itself loads it (a verification reference), in eval mode. With a sliced `config`
    the later layers' tensors are unused on purpose: transformers' load report about them is not shown, and its
    progress bar never breaks into our own progress line."""
    logging = transformers().utils.logging
    extra = {"config": config} if config is not None else {}
    verbosity, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    if config is not None:
        logging.set_verbosity_error()
    try:
        model = auto_class.from_pretrained(directory, local_files_only=True, **extra)
    finally:
        logging.set_verbosity(verbosity)
        if bar:
            logging.enable_progress_bar()
    return model.eval()


def prepare_for_export(model: Any) -> None:
    """Settings under which transformers models export with static shapes: mixture-of-experts layers as batched
    matmuls over every expert (eager routing makes data-dependent shapes; grouped_mm is a custom op), and the
    expert loops written in a model's own code replaced while tracing (hf/experts.py)."""
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
