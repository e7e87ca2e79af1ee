"""A target to a checked artifact (torch side): the library behind `torch2jax convert`, `verify` and `bisect`.

A target is a model file (`model.py:Model`) or a Hugging Face directory (`hf:DIR`). `convert_target`
resolves it, converts it (with `GenerationOptions`: dtype, quantization, streamed weights, a generator's limits),
checks the artifact against torch (or transformers' generate) before the artifact is renamed into place, and returns
what was written. Importing this package imports torch.
"""

from ..hf.options import GenerationOptions
from .conversion import Conversion
from .convert import convert_target
from .targets import resolve_target
from .verify import verify_artifact

__all__ = ["Conversion", "GenerationOptions", "convert_target", "resolve_target", "verify_artifact"]
