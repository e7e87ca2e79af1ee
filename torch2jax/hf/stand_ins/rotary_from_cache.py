"""RoFormer's sinusoidal rotary positions over the converted causal-LM step.

RoFormer's encoder numbers a call's tokens from the cache's length (`arange(cache_length, cache_length + T)`) and
rotates queries and keys by one [T, D] table shared by the batch. Over the step's cache that length is a tensor (the
first slot written), so the arange has a shape torch.export cannot know, and it would count the length bucket's
padding besides (hf/stand_ins/positions.py). The step gives each query's column in transformers' batch instead, which
the embedding's stand-in looks up ([T] columns give transformers' [T, D] table; a row-apart step's [B, T] columns give
[B, T, D], one table per row). The attention's stand-in reads such a per-row table, which the encoder's `[None, None]`
turns into [1, 1, B, T, D], as [B, 1, T, D]: the same rotation, broadcast over the heads. Without the step's columns
(plain conversion) RoFormer's own code runs.
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture import trace_forwards
from .positions import register_counted_from_cache, step_columns

_ROFORMER = "transformers.models.roformer.modeling_roformer"


def roformer_table_at_columns(self: Any, input_ids_shape: Any, cache_length: Any = 0,
                              position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """RoFormerSinusoidalPositionalEmbedding.forward at the step's columns, where the step gives them."""
    columns = step_columns(self)
    if columns is None or position_ids is not None:
        return type(self).forward(self, input_ids_shape, cache_length, position_ids)
    return torch.nn.Embedding.forward(self, columns.clamp(min=0))


def roformer_rotary(self: Any, sinusoidal_pos: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor | None = None) -> Any:
    """RoFormerSelfAttention.apply_rotary_position_embeddings over a per-row table [1, 1, B, T, D] as [B, 1, T, D]."""
    if sinusoidal_pos.dim() == 5:
        sinusoidal_pos = sinusoidal_pos[0, 0][:, None]
    rotate = type(self).apply_rotary_position_embeddings
    return rotate(sinusoidal_pos, query, key) if value is None else rotate(sinusoidal_pos, query, key, value)


register_counted_from_cache(f"{_ROFORMER}.RoFormerSinusoidalPositionalEmbedding", roformer_table_at_columns)
trace_forwards.register(f"{_ROFORMER}.RoFormerSelfAttention", roformer_rotary,
                        method="apply_rotary_position_embeddings")
