"""torch2jax: export PyTorch models to pure JAX functions and StableHLO artifacts.

    jm = torch2jax.convert(module, args=(x,))      # needs torch (pip install 'torch2jax-aot[convert]')
    torch2jax.save(jm, "out_dir")
    m = torch2jax.load("out_dir")                    # needs no torch

Importing torch2jax never imports torch; `convert` does, when called.
"""

from __future__ import annotations

from typing import Any

from .errors import (
    ArtifactError,
    ExportError,
    InputSpecError,
    LoweringError,
    ShardingError,
    SignatureError,
    Torch2JaxError,
    UnsupportedOpsError,
    VerificationError,
)
from .ops import register_lowering
from .runtime import artifact as _artifact
from .runtime.model import Model
from .serve.generator import Generator
from .serve.loop import TokenLoop
from .serve.seq2seq import Seq2SeqGenerator

__version__ = "0.1.0"


def convert(module: Any, args: Any = (), kwargs: dict | None = None, dynamic_shapes: Any = None, **options: Any) -> Model:
    """Convert a torch.nn.Module to a JAX `Model` (see torch2jax.capture.converter.convert for options)."""
    from .capture.converter import convert as _convert  # imports torch, only now

    return _convert(module, args, kwargs, dynamic_shapes, **options)


def convert_hf(source: Any, *, task: str | None = None, max_cache_len: int = 512, max_batch: int = 8,
               dtype: str | None = None, **options: Any) -> Generator | Seq2SeqGenerator:
    """A Hugging Face model (a local `save_pretrained` directory, or the model object) -> a `Generator` (causal LM,
    torch-free prefill/decode) or a `Seq2SeqGenerator` (encoder-decoder, text2text-generation: encode/decode; takes
    max_source_len=), each with `generate` (see torch2jax.capture.hf.convert_hf)."""
    from .capture.hf import convert_hf as _convert_hf  # imports torch and transformers, only now

    return _convert_hf(source, task=task, max_cache_len=max_cache_len, max_batch=max_batch, dtype=dtype, **options)


def save(model: Model | TokenLoop, path: Any, **options: Any) -> Any:
    """Write a `Model`, `Generator` or `Seq2SeqGenerator` as an artifact directory, atomically (see docs/format.md)."""
    if isinstance(model, TokenLoop):
        from .serve.artifact import save_generator

        return save_generator(model, path, **options)
    return _artifact.save(model, path, **options)


def load(path: Any, *, from_graph: bool = False, verify_hashes: bool = True, mesh: Any = None,
         sharding: Any = "auto") -> Model | Generator | Seq2SeqGenerator:
    """Load an artifact without torch: a `Model`, a `Generator` for a text-generation artifact, or a
    `Seq2SeqGenerator` for a text2text-generation one.

    Checks the format version and every file's sha256; `from_graph=True` rebuilds the functions from the
    portable graph instead of deserializing the StableHLO (see docs/api.md). With a `jax.sharding.Mesh`,
    each param is restored straight onto its devices as `sharding` says ("auto", "replicated", or
    {name pattern: PartitionSpec}; see torch2jax.serve.sharding) and calls put the batch on the `data` axis.
    """
    if mesh is None and not (isinstance(sharding, str) and sharding == "auto"):
        raise ShardingError("sharding= needs mesh=: torch2jax.load(path, mesh=jax.make_mesh(...), sharding=...)")
    root, manifest = _artifact.open_artifact(path, verify_hashes=False)  # the loaders below check every hash
    plan = None
    if mesh is not None:
        from .serve import sharding as _sharding

        hints = manifest["params"].get("sharding_hints")
        plan = _sharding.plan(_artifact.param_tree(manifest), _sharding.auto_mesh(mesh), sharding,
                              hints if isinstance(hints, dict) else None)
    if manifest.get("task") in (Generator.TASK, Seq2SeqGenerator.TASK):
        from .serve.artifact import load_generator

        return load_generator(root, from_graph=from_graph, verify_hashes=verify_hashes, plan=plan)
    model = _artifact.load(root, from_graph=from_graph, verify_hashes=verify_hashes,
                           shardings=plan.shardings() if plan else None)
    model.sharding = plan
    return model


def load_into_torch(module: Any, model: Model, params: dict | None = None, strict: bool = True) -> Any:
    """Copy a model's (fine-tuned) params back into the torch module (see converter.load_into_torch)."""
    from .capture.converter import load_into_torch as _load_into_torch  # imports torch, only now

    return _load_into_torch(module, model, params, strict)


__all__ = [
    "ArtifactError",
    "ExportError",
    "Generator",
    "InputSpecError",
    "LoweringError",
    "Model",
    "Seq2SeqGenerator",
    "ShardingError",
    "SignatureError",
    "Torch2JaxError",
    "UnsupportedOpsError",
    "VerificationError",
    "convert",
    "convert_hf",
    "load",
    "load_into_torch",
    "register_lowering",
    "save",
]
