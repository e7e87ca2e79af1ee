"""GPT-Neo's attention, masked by each query's cache slot instead of by the key count.

GPT-Neo keeps a [positions, positions] causal table (banded to `window_size` in its local layers) and takes the
rows `key_length - query_length ...`, which are the queries' positions only when the keys are exactly the tokens
so far (transformers' growing cache). The converted steps attend to a span of a fixed cache (a power of two at
least the filled slots, hf/steps/kv_cache.py), so those rows belonged to later slots: a local layer's window sat past
the real keys and a left-padded prompt generated other tokens than transformers. While tracing, this stand-in
takes each query's row from its slot (`write_at`, which the step's cache layer holds); everything else is the
model's own computation, and without the step's cache (plain conversion) the model's own forward runs.
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture import trace_forwards
from ..steps.kv_cache import query_slots, step_slots

_ATTENTION = "transformers.models.gpt_neo.modeling_gpt_neo.GPTNeoSelfAttention"


def attention_by_slot(self: Any, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      layer_past: Any = None, use_cache: bool = False, output_attentions: bool = False, **kwargs: Any):
    write_at = step_slots(layer_past, self.layer_id)
    if write_at is None:
        return type(self).forward(self, hidden_states, attention_mask, layer_past, use_cache, output_attentions, **kwargs)
    query, key, value = (self._split_heads(proj(hidden_states), self.num_heads, self.head_dim)
                         for proj in (self.q_proj, self.k_proj, self.v_proj))
    key, value = layer_past.update(key, value, self.layer_id)
    slot = torch.arange(key.shape[-2], device=key.device)
    at = query_slots(write_at)[:, None, :, None]  # [B or 1, 1, queries, 1]: each query's slot
    allowed = slot <= at  # [B or 1, 1, queries, keys]: the causal table's row of each query's slot
    if self.attention_type == "local":
        allowed = allowed & (slot > at - self.config.window_size)
    scores = torch.matmul(query.to(torch.float32), key.to(torch.float32).transpose(-1, -2))
    scores = torch.where(allowed, scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = self.attn_dropout(torch.nn.functional.softmax(scores, dim=-1).to(value.dtype))
    out = self._merge_heads(torch.matmul(weights, value), self.num_heads, self.head_dim)
    return self.resid_dropout(self.out_proj(out)), weights


trace_forwards.register(_ATTENTION, attention_by_slot)
