"""Gated delta nets (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, OLMo-hybrid) and Kimi's delta attention over the converted
step's explicit recurrent state.

Each of these mixers runs a depthwise causal convolution over its query, key and value projections, then the gated
delta rule per head: the state S [k_dim, v_dim] decays by exp(g), reads what it predicts for the key, writes the
correction beta (v - k S) along k, and the query reads it:

    S_t = exp(g_t) S_{t-1};  S_t = S_t + k_t (beta_t (v_t - k_t^T S_t))^T;  o_t = q_t^T S_t

with q and k l2-normalised (in float32) and q scaled by 1/sqrt(k_dim). g is one log-decay per head for the gated
delta nets (-exp(A_log) softplus(a + dt_bias)) and one per key channel for Kimi (KDA).

transformers runs a prompt with the chunked form of this rule from the cache's state and a decode token with the
recurrent form, each writing its cache object in place. Under the converted step (hf/steps/recurrent.py) the layer's
cache entry holds `conv` [B, conv_dim, kernel - 1] (the model's dtype) and `recurrent` [B, heads, k_dim, v_dim]
(float32, as transformers keeps it) as tensors, and the stand-in runs the recurrent form as one
`torch.ops.higher_order.scan` over the tokens (lax.scan once converted), continuing from the given state: prompt,
prompt chunk and decode token are the same graph. A token that is not real (left padding) leaves both states as they
were: its input to the convolution is zero, its decay is exp(0) = 1 and its write strength beta is 0.

The chunked form (matmuls over blocks of 64 tokens, then a scan over blocks) would prefill long prompts faster; it is
not used here yet: the token scan is exact and the decode step needs it anyway.
Outside the step (a plain forward, no such cache entry) the mixer's own forward runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import mixers
from .mixers import Mixer, causal_conv, conv_state_shape, step_state

_MODELS = "transformers.models"


def _delta_states(mixer: torch.nn.Module) -> tuple:
    """conv [q, k and v channels, kernel - 1] in the model's dtype, recurrent [v heads, k head dim, v head dim]
    float32."""
    return ((conv_state_shape(mixer.conv1d), None),
            ((int(mixer.num_v_heads), int(mixer.head_k_dim), int(mixer.head_v_dim)), torch.float32))


def _kda_states(mixer: torch.nn.Module) -> tuple:
    """conv [3 heads x head dim, kernel - 1] in the model's dtype, recurrent [heads, head dim, head dim] float32."""
    return ((conv_state_shape(mixer.conv1d), None),
            ((int(mixer.num_heads), int(mixer.head_dim), int(mixer.head_dim)), torch.float32))


GATED_DELTA, KDA = Mixer("gated-delta", _delta_states), Mixer("kimi-delta", _kda_states)


def l2_normalized(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim (the form, and eps, transformers' rule uses)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def delta_scan(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule over the tokens (dim 0), as one scan from `state` [B, H, Dk, Dv].

    q, k [T, B, H, Dk]; v [T, B, H, Dv]; g (log decay) [T, B, H, 1] per head or [T, B, H, Dk] per key channel;
    beta [T, B, H]. Returns (outputs [T, B, H, Dv], the last state)."""
    from torch._higher_order_ops.scan import scan

    def step(s, xs):
        q_t, k_t, v_t, g_t, beta_t = xs
        s = s * torch.exp(g_t)[..., None]
        predicted = (k_t[..., None, :] @ s).squeeze(-2)  # [B, H, Dv]: what the state holds for this key
        s = s + k_t[..., :, None] * ((v_t - predicted) * beta_t[..., None])[..., None, :]
        return s, (q_t[..., None, :] @ s).squeeze(-2)

    last, outputs = scan(step, state, (q, k, v, g, beta))
    return outputs, last


def delta_mixer(mixer: Any, layer: Any, mixed_qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, heads: int,
                key_dim: int, head_k_dim: int, head_v_dim: int) -> torch.Tensor:
    """The convolution and the delta rule of one layer over the step's state: mixed_qkv [B, T, 2 key_dim + value
    dim] (queries, keys, values before the convolution), g [B, T, heads] or [B, T, heads, head_k_dim] float32,
    beta [B, T, heads]. Query and key heads are repeated to `heads` (grouped like transformers': each serves
    consecutive value heads). Sets the new states on `layer`; returns the outputs [B, T, heads, head_v_dim] in the
    projections' dtype."""
    batch, tokens, _ = mixed_qkv.shape
    dtype = mixed_qkv.dtype
    keep = layer.keep  # [B, T]
    conv_state, recurrent = layer.states
    qkv, conv_state = causal_conv(mixed_qkv.transpose(1, 2) * keep[:, None, :].to(dtype), conv_state, mixer.conv1d,
                                  mixer.activation)
    q, k, v = torch.split(qkv.transpose(1, 2), [key_dim, key_dim, qkv.shape[1] - 2 * key_dim], dim=-1)
    q, k = (x.reshape(batch, tokens, -1, head_k_dim) for x in (q, k))
    v = v.reshape(batch, tokens, heads, head_v_dim)
    if q.shape[2] != heads:
        q, k = (x.repeat_interleave(heads // x.shape[2], dim=2, output_size=heads) for x in (q, k))
    q = l2_normalized(q.float()) * head_k_dim ** -0.5
    k = l2_normalized(k.float())
    real = keep.to(torch.float32)[:, :, None]
    g = g.float() * (real if g.dim() == 3 else real[..., None])  # a pad's decay is exp(0) = 1 ...
    beta = beta.float() * real  # ... and it writes nothing
    if g.dim() == 3:
        g = g[..., None]
    outputs, recurrent = delta_scan(recurrent, q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1),
                                    g.transpose(0, 1), beta.transpose(0, 1))
    layer.states = [conv_state, recurrent]
    return outputs.transpose(0, 1).to(dtype)


def _own(self: Any, hidden_states: torch.Tensor, cache: Any, attention_mask: Any, kwargs: dict) -> torch.Tensor:
    return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)


def qwen3_5_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                    **kwargs: Any) -> torch.Tensor:
    """Qwen3_5GatedDeltaNet (and Qwen3.5-MoE's) over the step's state: separate qkv, z, b and a projections."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return _own(self, hidden_states, cache, attention_mask, kwargs)
    batch, tokens, _ = hidden_states.shape
    hidden_states = hidden_states * layer.keep[:, :, None].to(hidden_states.dtype)
    z = self.in_proj_z(hidden_states).reshape(batch, tokens, -1, self.head_v_dim)
    g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(hidden_states).float() + self.dt_bias)
    core = delta_mixer(self, layer, self.in_proj_qkv(hidden_states), g, self.in_proj_b(hidden_states).sigmoid(),
                       self.num_v_heads, self.key_dim, self.head_k_dim, self.head_v_dim)
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch, tokens, -1))


def qwen3_next_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                       **kwargs: Any) -> torch.Tensor:
    """Qwen3NextGatedDeltaNet over the step's state: its fused qkvz and ba projections, split per key head as
    transformers' `fix_query_key_value_ordering` does."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return _own(self, hidden_states, cache, attention_mask, kwargs)
    batch, tokens, _ = hidden_states.shape
    hidden_states = hidden_states * layer.keep[:, :, None].to(hidden_states.dtype)
    q, k, v, z, b, a = self.fix_query_key_value_ordering(self.in_proj_qkvz(hidden_states), self.in_proj_ba(hidden_states))
    mixed_qkv = torch.cat([x.reshape(batch, tokens, -1) for x in (q, k, v)], dim=-1)
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    core = delta_mixer(self, layer, mixed_qkv, g, b.sigmoid(), self.num_v_heads, self.key_dim, self.head_k_dim,
                       self.head_v_dim)
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch, tokens, -1))


def olmo_hybrid_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                        **kwargs: Any) -> torch.Tensor:
    """OlmoHybridGatedDeltaNet over the step's state: separate q, k, v, a, b and gate projections; beta doubled
    where the config allows negative eigenvalues."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return _own(self, hidden_states, cache, attention_mask, kwargs)
    batch, tokens, _ = hidden_states.shape
    hidden_states = hidden_states * layer.keep[:, :, None].to(hidden_states.dtype)
    mixed_qkv = torch.cat([self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], dim=-1)
    beta = self.b_proj(hidden_states).sigmoid()
    if self.allow_neg_eigval:
        beta = beta * 2.0
    g = -self.A_log.float().exp() * F.softplus(self.a_proj(hidden_states).float() + self.dt_bias)
    core = delta_mixer(self, layer, mixed_qkv, g, beta, self.num_v_heads, self.key_dim, self.head_k_dim,
                       self.head_v_dim)
    gate = self.g_proj(hidden_states)
    core = self.o_norm(core.reshape(-1, self.head_v_dim), gate.reshape(-1, self.head_v_dim))
    return self.o_proj(core.reshape(batch, tokens, -1))


def kimi_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                 **kwargs: Any) -> torch.Tensor:
    """KimiLinearDeltaAttention (KDA) over the step's state: the forget gate decays each key channel."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return _own(self, hidden_states, cache, attention_mask, kwargs)
    batch, tokens, _ = hidden_states.shape
    hidden_states = hidden_states * layer.keep[:, :, None].to(hidden_states.dtype)
    mixed_qkv = torch.cat([self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], dim=-1)
    g = self.forget_gate(hidden_states)  # [B, T, H, head_dim] float32
    core = delta_mixer(self, layer, mixed_qkv, g, self.b_proj(hidden_states).sigmoid(), self.num_heads,
                       self.qkv_dim, self.head_dim, self.head_dim)
    gate = self.g_b_proj(self.g_a_proj(hidden_states)).view(batch, tokens, -1, self.head_dim)
    return self.o_proj(self.o_norm(core, gate).reshape(batch, tokens, -1))


mixers.register(f"{_MODELS}.qwen3_5.modeling_qwen3_5.Qwen3_5GatedDeltaNet", GATED_DELTA, qwen3_5_forward)
mixers.register(f"{_MODELS}.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeGatedDeltaNet", GATED_DELTA, qwen3_5_forward)
mixers.register(f"{_MODELS}.qwen3_next.modeling_qwen3_next.Qwen3NextGatedDeltaNet", GATED_DELTA, qwen3_next_forward)
mixers.register(f"{_MODELS}.olmo_hybrid.modeling_olmo_hybrid.OlmoHybridGatedDeltaNet", GATED_DELTA,
                olmo_hybrid_forward)
mixers.register(f"{_MODELS}.kimi_linear.modeling_kimi_linear.KimiLinearDeltaAttention", KDA, kimi_forward)
