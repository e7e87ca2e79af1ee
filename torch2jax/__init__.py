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
    SignatureError,
    Torch2JaxError,
    UnsupportedOpsError,
    VerificationError,
)
from .ops import register_lowering
from .runtime.artifact import load, save
from .runtime.model import Model

__version__ = "0.1.0"


def convert(module: Any, args: Any = (), kwargs: dict | None = None, dynamic_shapes: Any = None, **options: Any) -> Model:
    """Convert a torch.nn.Module to a JAX `Model` (see torch2jax.capture.converter.convert for options)."""
    from .capture.converter import convert as _convert  # imports torch, only now

    return _convert(module, args, kwargs, dynamic_shapes, **options)


def load_into_torch(module: Any, model: Model, params: dict | None = None, strict: bool = True) -> Any:
    """Copy a model's (fine-tuned) params back into the torch module (see converter.load_into_torch)."""
    from .capture.converter import load_into_torch as _load_into_torch  # imports torch, only now

    return _load_into_torch(module, model, params, strict)


__all__ = [
    "ArtifactError",
    "ExportError",
    "InputSpecError",
    "LoweringError",
    "Model",
    "SignatureError",
    "Torch2JaxError",
    "UnsupportedOpsError",
    "VerificationError",
    "convert",
    "load",
    "load_into_torch",
    "register_lowering",
    "save",
]
