"""MiniMax's lightning attention (MiniMaxLightningAttention: linear attention with a per-head decay, beside softmax
attention layers) over the converted step's explicit state (hf/steps/recurrent.py; the registry: mixers.py).

MiniMax insists on its own cache class (MiniMaxCache): softmax-attention layers keep keys and values in its layers,
lightning layers their key-value memory S [B, heads, head_dim, head_dim] in a list beside them. Under the step the
model gets a MiniMaxCache holding the step's layers (the registry entry's `cache_class`): a lightning layer's entry
holds S in the model's dtype (as transformers keeps it), an attention layer's its keys and values slots.

transformers runs a prompt from an empty cache in blocks (`block_size` tokens: the within-block part as a decayed
causal product, the earlier blocks through S) and a prompt continued from a cache, and each decode token, token by
token: S_t = exp(-slope) S_{t-1} + k_t^T v_t, out_t = q_t S_t. Both are the same function; here every token runs the
second form, as one scan over the tokens from the given S (prompt, prompt chunk and decode token are the same
graph). A token that is not real leaves S as it was (transformers zeroes its key and value, so S decays there; from
an empty S, as with left padding, the two agree).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import mixers
from .mixers import Mixer, step_state

_MODULE = "transformers.models.minimax.modeling_minimax"


def _states(attention: torch.nn.Module) -> tuple:
    """S [heads, head_dim, head_dim] in the model's dtype."""
    heads, dim = int(attention.num_attention_heads), int(attention.head_dim)
    return (((heads, dim, dim), None),)


LIGHTNING = Mixer("minimax-lightning", _states, cache_class=f"{_MODULE}.MiniMaxCache")


def decayed_scan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, decay: torch.Tensor, keep: torch.Tensor,
                 memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out_t = q_t S_t with S_t = decay S_{t-1} + k_t^T v_t over query, key, value [B, H, T, D] from `memory`
    [B, H, D, D] as one scan: (out [B, H, T, D], the last S). Tokens not kept leave S as it was."""
    from torch._higher_order_ops.scan import scan

    def step(s, xs):
        q, k, v, real = xs  # [B, H, D] x 3, [B, 1, 1, 1]
        new = (decay * s + k[..., :, None] @ v[..., None, :]).to(s.dtype)
        s = torch.where(real, new, s)
        return s, (q[..., None, :] @ s.to(q.dtype)).squeeze(-2)

    def tokens_first(x: torch.Tensor) -> torch.Tensor:
        return x.permute(2, 0, 1, 3)  # [B, H, T, D] -> [T, B, H, D]

    real = keep.transpose(0, 1)[:, :, None, None, None]  # [T, B, 1, 1, 1]
    memory, out = scan(step, memory, (tokens_first(query), tokens_first(key), tokens_first(value), real))
    return out.permute(1, 2, 0, 3), memory


def lightning_forward(self: Any, hidden_states: torch.Tensor, position_embeddings: Any = None,
                      attention_mask: Any = None, cache: Any = None, **kwargs: Any) -> tuple:
    """MiniMaxLightningAttention over the step's state: activated q, k, v, the decayed scan, the norm, the output
    gate and projection."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask, cache=cache, **kwargs)
    batch, tokens, _ = hidden_states.shape
    qkv = self.act_fn(self.qkv_proj(hidden_states)).reshape(batch, tokens, self.num_attention_heads, 3 * self.head_dim)
    query, key, value = (t.transpose(1, 2) for t in torch.split(qkv, self.head_dim, dim=3))
    out, memory = decayed_scan(query, key, value, torch.exp(-self.slope_rate), layer.keep, layer.states[0])
    layer.states = [memory]
    out = self.norm(out.transpose(1, 2).reshape(batch, tokens, self.num_attention_heads * self.head_dim))
    out = F.sigmoid(self.output_gate(hidden_states)) * out
    return self.out_proj(out), memory


mixers.register(f"{_MODULE}.MiniMaxLightningAttention", LIGHTNING, lightning_forward)
