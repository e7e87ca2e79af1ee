"""xLSTM (xLSTMForCausalLM: mLSTM blocks) over the converted step's explicit state (hf/steps/recurrent.py; the
registry: mixers.py).

xLSTM keeps no transformers Cache: its forward takes an `xLSTMCache` (`cache`) whose `rnn_state` maps each block to
its mLSTM memory C [B, heads, qk_head, v_head], normalizer n [B, heads, qk_head] and maximum m [B, heads, 1], copied
into in place after each block. Under the step each block's cache entry holds its three, float32 (the arithmetic's
state dtype, `inference_state_dtype`; transformers stores them back in the model's dtype, so a bfloat16 model's
states round there and not here). The step passes its Cache of entries as `cache` (the registry entry's
`state_keyword`); the model's forward stands in to hand it to every block (no in-place copies), and each block runs
the mLSTM as one scan over the tokens in transformers' single-step form starting from the given state (prompt,
prompt chunk and decode token are the same graph). A token that is not real leaves the three as they were; an empty
state is zeros, as transformers starts.

transformers runs a prompt of at least `chunk_size` tokens (64) through its chunkwise kernel, in
`autocast_kernel_dtype` (bfloat16 by default), and shorter ones step by step in float32; here every prompt is the
float32 recurrence (the same function; longer prompts differ from transformers' by its chunkwise rounding).
transformers' xLSTM ignores the attention mask: left padding enters its state, so its padded rows differ from its
rows alone (tests compare each row with transformers' row alone).
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture import trace_forwards
from . import mixers
from .mixers import STATE_ATTRIBUTE, Mixer, step_state

_MODULE = "transformers.models.xlstm.modeling_xlstm"


def _states(block: torch.nn.Module) -> tuple:
    """C [heads, qk_head, v_head], n [heads, qk_head], m [heads, 1], float32."""
    layer = block.mlstm_layer
    heads = int(layer.config.num_heads)
    qk, v = int(layer.qk_dim) // heads, int(layer.v_dim) // heads
    state = getattr(torch, layer.config.inference_state_dtype)
    return (((heads, qk, v), state), ((heads, qk), state), ((heads, 1), state))


def _no_index(block: torch.nn.Module) -> int:
    """xLSTM's blocks keep no index: the step's state_mixers reads it from the block's place (`blocks.N`)."""
    return int(block.layer_idx)


XLSTM = Mixer("xlstm", _states, layer_index=_no_index, state_keyword="cache")


def mlstm_scan(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, igate: torch.Tensor, fgate: torch.Tensor,
               keep: torch.Tensor, state: list[torch.Tensor], eps: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The mLSTM recurrence over query, key [B, heads, T, qk], value [B, heads, T, v] and the gates' pre-activations
    [B, heads, T] from `state` (C, n, m) as one scan, each token as transformers' single step: (h [B, heads, T, v],
    the new state). Tokens not kept leave the state as it was."""
    from torch._higher_order_ops.scan import scan

    dtype = query.dtype
    scale = query.shape[-1] ** -0.5

    def step(carry, xs):
        c_old, n_old, m_old = carry
        q, k, v, i, f, real = xs  # [B, H, qk], [B, H, qk], [B, H, v], [B, H, 1] x 3
        f_log = torch.nn.functional.logsigmoid(f)
        m = torch.maximum(f_log + m_old, i)
        f_act, i_act = torch.exp(f_log + m_old - m), torch.exp(i - m)
        c = f_act[..., None] * c_old + i_act[..., None] * (k[..., :, None] @ v[..., None, :])
        n = f_act * n_old + i_act * k
        q = q * scale
        h_num = (q[..., None, :] @ c.to(dtype)).squeeze(-2).to(c_old.dtype)
        qn = (q[..., None, :] @ n[..., :, None].to(dtype)).squeeze(-2)
        h = h_num / (torch.maximum(qn.abs(), torch.exp(-m)) + eps).to(c_old.dtype)
        carry = (torch.where(real[..., None], c.to(c_old.dtype), c_old), torch.where(real, n.to(n_old.dtype), n_old),
                 torch.where(real, m.to(m_old.dtype), m_old))
        return carry, h.to(dtype)

    def tokens_first(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 2).transpose(1, 2)  # [B, H, T, ...] -> [T, B, H, ...]

    real = keep.transpose(0, 1)[:, :, None, None]  # [T, B, 1, 1]
    (c, n, m), h = scan(step, tuple(state), (tokens_first(query), tokens_first(key), tokens_first(value),
                                             tokens_first(igate[..., None]), tokens_first(fgate[..., None]), real))
    return h.transpose(1, 2).transpose(0, 2), [c, n, m]


def _projections(layer: Any, x: torch.Tensor) -> tuple:
    """xLSTMLayer's query, key, value, output gate, input and forget gate pre-activations (both weight modes)."""
    from transformers.models.xlstm.modeling_xlstm import soft_cap

    config = layer.config
    if config.weight_mode == "single":
        query, key, value, o_preact = layer.q(x), layer.k(x), layer.v(x), layer.ogate_preact(x)
        i_preact = soft_cap(layer.igate_preact(x), cap_value=config.gate_soft_cap)
        f_preact = soft_cap(layer.fgate_preact(x), cap_value=config.gate_soft_cap)
    else:
        query, key, value, o_preact = torch.tensor_split(
            layer.qkv_opreact(x), (layer.qk_dim, 2 * layer.qk_dim, 2 * layer.qk_dim + layer.v_dim), dim=-1)
        gates = soft_cap(layer.ifgate_preact(x), cap_value=config.gate_soft_cap)
        i_preact, f_preact = torch.tensor_split(gates, (config.num_heads,), dim=-1)
    return query, key, value, o_preact, i_preact, f_preact


def block_forward(self: Any, x: torch.Tensor, state: Any = None) -> tuple:
    """xLSTMBlock over the step's state: the normed mLSTM layer (projections, the scan, the per-head norm, the output
    gate), then the normed feed-forward, each with its residual."""
    layer = step_state(state, self.layer_idx)
    if layer is None:
        return type(self).forward(self, x, state)
    mlstm = self.mlstm_layer
    heads = mlstm.config.num_heads
    batch, tokens, _ = x.shape
    query, key, value, o_preact, i_preact, f_preact = _projections(mlstm, self.norm_mlstm(x))

    def per_head(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, tokens, heads, -1).transpose(1, 2)

    h, layer.states = mlstm_scan(per_head(query), per_head(key), per_head(value), i_preact.transpose(1, 2),
                                 f_preact.transpose(1, 2), layer.keep, layer.states, mlstm.config.eps)
    h = mlstm.multihead_norm(h.transpose(1, 2)).reshape(batch, tokens, -1)
    x = x + mlstm.out_proj(mlstm.ogate_act_fn(o_preact) * h)
    return x + self.ffn(self.norm_ffn(x)), state


def model_forward(self: Any, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                  cache: Any = None, use_cache: bool | None = None, **kwargs: Any) -> Any:
    """xLSTMModel with the step's Cache of entries as `cache`: every block gets it (and reads its own entry), with
    none of the model's in-place copies into `rnn_state`. Any other cache runs the model's own forward."""
    layers = getattr(cache, "layers", None)
    if not layers or not getattr(layers[0], STATE_ATTRIBUTE, False):
        return type(self).forward(self, input_ids=input_ids, inputs_embeds=inputs_embeds, cache=cache,
                                  use_cache=use_cache, **kwargs)
    from transformers.models.xlstm.modeling_xlstm import xLSTMOutput

    hidden = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
    for block in self.blocks:
        hidden, _ = block(hidden, cache)
    return xLSTMOutput(last_hidden_state=self.out_norm(hidden), cache=cache)


mixers.register(f"{_MODULE}.xLSTMBlock", XLSTM, block_forward)
trace_forwards.register(f"{_MODULE}.xLSTMModel", model_forward)
