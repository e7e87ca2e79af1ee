"""ALiBi models (BLOOM, MPT) over the converted steps' cache, while tracing.

BLOOM builds its ALiBi bias from the token-level mask [batch, keys] (each key's position: the count of real tokens
up to it). The converted steps pass a 4-d mask [batch, 1, queries, keys] instead (hf/steps/causal_lm.py), whose last query
row keeps exactly the cache's real keys: every filled slot precedes the last one written, plus that slot itself,
which comes after all of them and so shifts no other key's position. While tracing, this stand-in reads the keys
from that row and builds the bias as BLOOM does; a 2-d mask (plain conversion) takes the model's own method.

MPT slices its bias table [heads, 1, max_seq_len] to the keys' count and to `queries + cache.get_seq_length()`
rows; the table has one row, so that slice always starts at 0, but the cache's length is a tensor in the steps
and torch.export cannot decide `max(0, 1 - length)`. Its stand-in slices the keys alone (the same values): the
bias then grows by one per key slot, which differs from transformers' by a constant per query (softmax ignores it).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ...capture import trace_forwards
from ..steps.kv_cache import step_slots

_MODEL = "transformers.models.bloom.modeling_bloom.BloomModel"
_MPT_ATTENTION = "transformers.models.mpt.modeling_mpt.MptAttention"


def alibi_from_step_mask(self: Any, attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    if attention_mask.dim() == 4:
        last = attention_mask[:, 0, -1, :]
        attention_mask = (last if last.dtype == torch.bool else last == 0).to(torch.long)
    return sys.modules[type(self).__module__].build_alibi_tensor(attention_mask, num_heads, dtype)


def mpt_attention(self: Any, hidden_states: torch.Tensor, position_bias: torch.Tensor, cache: Any = None,
                  attention_mask: torch.Tensor | None = None, **kwargs: Any):
    if step_slots(cache, self.layer_idx) is None:
        return type(self).forward(self, hidden_states, position_bias, cache, attention_mask, **kwargs)
    batch, length = hidden_states.shape[:2]
    qkv = self.Wqkv(hidden_states)
    if self.clip_qkv:
        qkv = qkv.clamp(min=-self.clip_qkv, max=self.clip_qkv)
    query, key, value = (t.reshape(batch, length, self.n_heads, self.head_dim).transpose(1, 2) for t in qkv.chunk(3, dim=2))
    key, value = cache.update(key, value, self.layer_idx, kwargs=kwargs)
    scores = torch.matmul(query, key.transpose(-1, -2)) * self.softmax_scale
    scores = scores + position_bias[:, :, position_bias.shape[2] - key.shape[-2]:]
    if attention_mask is not None:
        scores = scores.masked_fill(attention_mask, torch.finfo(query.dtype).min)
    weights = torch.nn.functional.softmax(scores.float(), dim=-1).to(value.dtype)
    weights = torch.nn.functional.dropout(weights, p=self.attn_dropout_p, training=self.training)
    context = torch.matmul(weights, value).permute(0, 2, 1, 3).contiguous().view(batch, length, -1)
    return self.out_proj(context), weights


trace_forwards.register(_MODEL, alibi_from_step_mask, method="build_alibi_tensor")
trace_forwards.register(_MPT_ATTENTION, mpt_attention)
