"""torch2jax: export PyTorch models to pure JAX functions and StableHLO artifacts.

    jm = torch2jax.convert(module, args=(x,))      # needs torch (pip install 'torch2jax-aot[convert]')
    torch2jax.save(jm, "out_dir")
    m = torch2jax.load("out_dir")                    # needs no torch

Importing torch2jax never imports torch; the functions that convert do, when called. What
`torch2jax convert` does as one checked step (resolve a target, convert, verify, save) is
`torch2jax.pipeline.convert_target`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import (
    ArtifactError,
    ExamplePathError,
    ExportError,
    InputMutationWarning,
    InputSpecError,
    LoweringError,
    ShardingError,
    SignatureError,
    Torch2JaxError,
    UnsupportedOpsError,
    VerificationError,
)
from .generate import artifacts as _artifacts
from .generate.generator import Generator
from .generate.seq2seq import Seq2SeqGenerator
from .generate.vision_language import VisionLanguageGenerator
from .ops import register_lowering
from .runtime.model import Model
from .runtime.stablehlo import DEFAULT_PLATFORMS

__version__ = "0.1.0"

ProgressFn = Callable[[str, str], None]  # (stage, message), called as each conversion stage starts


def convert(module: Any, args: Any = (), kwargs: dict | None = None, dynamic_shapes: Any = None, *, strict: bool = False,
            dtype: str | Any = None, quantize: str | None = None, group_size: int = 64, specialize: list[str] | None = None,
            progress: ProgressFn | None = None) -> Model:
    """Convert a torch.nn.Module to a JAX `Model`, tracing it on example inputs (needs torch).

    Args:
      module: the module, exported in the mode it is in: call `module.eval()` first for inference.
      args: example positional inputs (a tensor or a tuple of them).
      kwargs: example keyword inputs.
      dynamic_shapes: torch.export's form, or a plain one such as `{"x": {0: "batch"}}` (dims named alike are one
        symbol; a dict `{"name": "batch", "min": 1, "max": 64}` bounds one).
      strict: torch.export's strict mode (default: non-strict).
      dtype: e.g. "bfloat16": converts a copy of the module and its floating inputs first, as `module.to(dtype)`.
      quantize: "int8" (one scale per output row) or "int4" (one per `group_size` input columns): the weights of the
        matrix products (nn.Linear's) are held quantized and dequantized inside the function (docs/api.md).
      group_size: int4's group of input columns sharing one scale.
      specialize: names of integer tensor inputs to fix to their example values, for a model that reads their values
        to decide shapes (an image's size). Side-data inputs are fixed automatically where torch.export stops on
        their values; the Model refuses any other value of a fixed input (docs/api.md).
      progress: called with (stage, message) as each stage starts.
    """
    from .capture.converter import convert as _convert  # imports torch, only now

    # the trace-time stand-ins for transformers code, wherever its modules sit in the user's (matched by class name;
    # importing them imports neither transformers nor any model)
    from .hf import stand_ins  # noqa: F401

    return _convert(module, args, kwargs, dynamic_shapes, strict=strict, dtype=dtype, progress=progress, quantize=quantize,
                    group_size=group_size, specialize=specialize)


def convert_hf(source: Any, *, task: str | None = None, max_cache_len: int = 512, max_batch: int = 8,
               max_source_len: int = 512, dtype: str | None = None, stream_weights: bool = False, repeat_layers: bool = True,
               quantize: str | None = None, group_size: int = 64,
               progress: ProgressFn | None = None) -> Generator | Seq2SeqGenerator | VisionLanguageGenerator:
    """A Hugging Face model (a local `save_pretrained` directory, or the model object) -> a torch-free `Generator`
    (causal LM: prefill/decode), `Seq2SeqGenerator` (encoder-decoder: encode/decode) or `VisionLanguageGenerator`
    (image-text-to-text, LLaVA: encode_image/prefill/decode), each with `generate`.

    Args:
      source: a model directory (a path, or "hf:DIR"; nothing is downloaded), or a transformers model.
      task: "text-generation", "text2text-generation" or "image-text-to-text"; default: what the config's `architectures` implies.
      max_cache_len: KV cache slots (prompt + new tokens); for an encoder-decoder, the most new tokens.
      max_batch: the most prompts per `generate` call.
      max_source_len: encoder-decoders: the longest source, in tokens.
      dtype: e.g. "bfloat16": params and computation in that precision.
      stream_weights: (a model directory: any generation task) read each weight from the safetensors
        files only when saving.
      repeat_layers: False traces every decoder layer instead of repeating a middle one of an alike stack.
      quantize: causal LMs: "int8" or "int4": the projections' and LM head's weights stored quantized.
      group_size: int4's group of input columns sharing one scale.
      progress: called with (stage, message) as each stage starts.
    """
    from .hf.convert import convert_hf as _convert_hf  # imports torch and transformers, only now
    from .hf.options import GenerationOptions

    options = GenerationOptions(max_cache_len=max_cache_len, max_batch=max_batch, max_source_len=max_source_len, dtype=dtype,
                                stream_weights=stream_weights, repeat_layers=repeat_layers, quantize=quantize,
                                group_size=group_size)
    return _convert_hf(source, options, task=task, progress=progress)


def save(model: Model | Generator | Seq2SeqGenerator, path: str | os.PathLike, *, force: bool = False,
         platforms: Sequence[str] = DEFAULT_PLATFORMS, vjp_order: int = 1, source: str | None = None,
         check: Callable[[Path], None] | None = None, on_bytes: Callable[[int, int], None] | None = None) -> Path:
    """Write a `Model`, `Generator` or `Seq2SeqGenerator` as an artifact directory, atomically (see docs/format.md).

    Args:
      model: what to write.
      path: the directory; written to a temporary sibling first and renamed into place once complete.
      force: replace an existing directory (otherwise an existing path is an error).
      platforms: jax.export platforms of the StableHLO.
      vjp_order: how many orders of derivatives the exported function carries (models; generators have none).
      source: recorded in the manifest as where the model came from.
      check: called with the finished temporary directory before the rename; raising aborts the save.
      on_bytes: called with (written, total) bytes while streamed weights are written.
    """
    return _artifacts.save(model, path, force=force, platforms=platforms, vjp_order=vjp_order, source=source, check=check,
                           on_bytes=on_bytes)


def load(path: str | os.PathLike, *, from_graph: bool = False, verify_hashes: bool = True, mesh: Any = None,
         sharding: str | Mapping[str, Any] = "auto") -> Model | Generator | Seq2SeqGenerator:
    """Load an artifact without torch: a `Model`, or the `Generator` / `Seq2SeqGenerator` of a generation artifact.

    Args:
      path: the artifact directory. Its format version and every file's sha256 are checked.
      from_graph: rebuild the functions from the portable graph instead of deserializing the StableHLO (see docs/api.md).
      verify_hashes: check every file's sha256 against the manifest.
      mesh: a `jax.sharding.Mesh`: each param is restored straight onto its devices, and calls put the batch on the
        `data` axis.
      sharding: with `mesh`: "auto", "replicated", or {name pattern: PartitionSpec} (see torch2jax.runtime.sharding).
    """
    return _artifacts.load(path, from_graph=from_graph, verify_hashes=verify_hashes, mesh=mesh, sharding=sharding)


def load_into_torch(module: Any, model: Model, params: dict | None = None, strict: bool = True) -> Any:
    """Copy a model's (fine-tuned) params back into the torch module (needs torch).

    Args:
      module: the torch module the model was converted from (or one with the same state_dict names).
      model: the converted `Model`.
      params: the params to copy (default: `model.params`), e.g. after fine-tuning in JAX.
      strict: as torch's `load_state_dict`; its result (missing / unexpected keys) is returned.
    """
    from .capture.converter import load_into_torch as _load_into_torch  # imports torch, only now

    return _load_into_torch(module, model, params, strict)


__all__ = [
    "ArtifactError",
    "ExamplePathError",
    "ExportError",
    "Generator",
    "InputMutationWarning",
    "InputSpecError",
    "LoweringError",
    "Model",
    "Seq2SeqGenerator",
    "ShardingError",
    "SignatureError",
    "Torch2JaxError",
    "UnsupportedOpsError",
    "VerificationError",
    "VisionLanguageGenerator",
    "convert",
    "convert_hf",
    "load",
    "load_into_torch",
    "register_lowering",
    "save",
]
