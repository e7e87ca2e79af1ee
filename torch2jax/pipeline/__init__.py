"""A target to a checked artifact (torch side): the library behind `torch2jax convert`, `verify` and `bisect`.

A target is a model file (`model.py:Model`) or a Hugging Face directory (`hf:DIR`). `convert_target`
resolves it, converts it, checks the artifact against torch (or transformers' generate) before the
artifact is renamed into place, and returns what was written. Importing this package imports torch.
"""

from .conversion import Conversion
from .convert import convert_target
from .targets import resolve_target

__all__ = ["Conversion", "convert_target", "resolve_target"]
