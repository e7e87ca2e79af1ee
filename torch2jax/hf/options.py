"""What a Hugging Face generator is converted with: one frozen record, built once by its caller (`torch2jax.convert_hf`,
`torch2jax convert`, `pipeline.convert_target`) and handed down whole, so that no layer re-lists the same keywords.

Torch-free: the CLI and the package root may build it without importing the torch side.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.quantize import DEFAULT_GROUP_SIZE


@dataclass(frozen=True)
class GenerationOptions:
    """How to convert (see torch2jax.convert_hf for each field). A forward-pass conversion through the pipeline reads
    `dtype`, `stream_weights`, `quantize` and `group_size` alike; the rest are the generators' own."""

    max_cache_len: int = 512  # KV cache slots (prompt + new tokens); an encoder-decoder's most new tokens
    max_batch: int = 8  # the most prompts per generate call
    max_source_len: int = 512  # encoder-decoders: the longest source, in tokens
    dtype: str | None = None  # e.g. "bfloat16": params and computation in that precision
    stream_weights: bool = False  # read each weight from the safetensors files only while saving
    repeat_layers: bool | int = True  # False: trace every layer; an int: repeat from that many alike units
    quantize: str | None = None  # "int8", "int4" or "int8-dynamic": the matmul weights stored quantized
    group_size: int = DEFAULT_GROUP_SIZE  # int4's input columns sharing one scale
