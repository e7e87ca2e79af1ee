"""State-space mixers (Mamba, Mamba2, Bamba's Mamba2 layers) over the converted step's explicit recurrent state.

transformers runs a Mamba layer's prompt with a Python loop over its tokens when the CUDA kernels are absent (Mamba)
or with the chunked algorithm from a zero state (Mamba2), and its one-token step through another function; each
reads and writes its conv and SSM state in a cache object in place. Under the converted step (hf/steps/recurrent.py)
the layer's cache entry holds the state as tensors the step was given (`conv` [B, channels, kernel - 1], `ssm`
[B, ...] float32) and which tokens are real (`keep` [B, T]); the mixer's stand-in runs the same arithmetic as one
`torch.ops.higher_order.scan` over the tokens (lax.scan once converted: one compiled loop, not one copy of the body per
token), starting from the given state, so the prompt, a chunk of it and a single decode token are the same graph.
A token that is not real (left padding) leaves both states as they were: its input to the convolution is zero and its
time step is zero, so the SSM update is the identity. The new states are set on the cache entry for the step to return
(the registry: mixers.py).
Outside the step (a plain forward, no such cache entry) the mixer's own forward runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import mixers
from .mixers import Mixer, causal_conv, conv_state_shape, step_state

_MODELS = "transformers.models"


def _mamba_states(mixer: torch.nn.Module) -> tuple:
    """conv [channels, kernel - 1] in the model's dtype, SSM [intermediate, state] float32."""
    return ((conv_state_shape(mixer.conv1d), None),
            ((int(mixer.intermediate_size), int(mixer.ssm_state_size)), torch.float32))


def _mamba2_states(mixer: torch.nn.Module) -> tuple:
    """conv [channels, kernel - 1] in the model's dtype, SSM [heads, head_dim, state] float32."""
    return ((conv_state_shape(mixer.conv1d), None),
            ((int(mixer.num_heads), int(mixer.head_dim), int(mixer.ssm_state_size)), torch.float32))


MAMBA, MAMBA2 = Mixer("mamba", _mamba_states), Mixer("mamba2", _mamba2_states)


def diagonal_scan(state: torch.Tensor, decay_rate: torch.Tensor, dt: torch.Tensor, x: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t, y_t = h_t C_t over the tokens (dim 0 of dt, x, B, C), as one scan.

    Shapes with the tokens first: Mamba: state [B, D, N], A [D, N], dt, x [T, B, D], B, C [T, B, N];
    Mamba2: state [B, H, P, N], A [H, 1, 1], dt [T, B, H, 1], x [T, B, H, P], B, C [T, B, H, N]. Returns (y [T, ...
    of x], the last state)."""
    from torch._higher_order_ops.scan import scan

    def step(h, xs):
        dt_t, x_t, b_t, c_t = xs
        h = torch.exp(dt_t[..., None] * decay_rate) * h + (dt_t * x_t)[..., None] * b_t.unsqueeze(-2)
        return h, (h @ c_t[..., None]).squeeze(-1)

    last, ys = scan(step, state, (dt, x, B, C))
    return ys, last


def mamba_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None, **kwargs: Any):
    """MambaMixer over the step's state: the projections and gating of transformers' torch path, the scan above."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    dtype = hidden_states.dtype
    keep = layer.keep  # [B, T]
    conv_state, ssm_state = layer.states
    hidden_states = hidden_states * keep[:, :, None].to(dtype)
    x, gate = self.in_proj(hidden_states).transpose(1, 2).chunk(2, dim=1)  # [B, D, T] each
    x, conv_state = causal_conv(x * keep[:, None, :].to(x.dtype), conv_state, self.conv1d, self.activation)
    x = x.transpose(1, 2) * keep[:, :, None].to(x.dtype)  # [B, T, D]
    time_step, B, C = torch.split(self.x_proj(x), [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1)
    time_step = (self.dt_proj.weight @ time_step.transpose(1, 2)).transpose(1, 2)  # [B, T, D]
    dt = F.softplus(time_step + self.dt_proj.bias.float()) * keep[:, :, None]  # a pad's step is the identity
    A = -torch.exp(self.A_log.float())
    ys, ssm_state = diagonal_scan(ssm_state, A, dt.transpose(0, 1), x.float().transpose(0, 1),
                                  B.float().transpose(0, 1), C.float().transpose(0, 1))
    layer.states = [conv_state, ssm_state]
    y = ys.transpose(0, 1).to(dtype) + x * self.D.float()  # [B, T, D]
    y = y * F.silu(gate.transpose(1, 2))
    return self.out_proj(y.to(dtype))


def mamba2_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None, **kwargs: Any):
    """Mamba2Mixer over the step's state: transformers' projections, gated norm and time-step limits, the scan above
    per head (the state [heads, head_dim, state] of transformers' one-token update)."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    return ssd_mixer(self, hidden_states, layer, self.conv1d, self.activation, limit=self.time_step_limit)


def ssd_mixer(mixer: Any, hidden_states: torch.Tensor, layer: Any, conv: torch.nn.Conv1d, activation: str,
              limit: tuple[float, float] = (0.0, float("inf"))) -> torch.Tensor:
    """The Mamba2 (state-space duality) mixer of transformers' Mamba2 and its kin over the step's state."""
    batch, tokens, _ = hidden_states.shape
    dtype = hidden_states.dtype
    keep = layer.keep
    conv_state, ssm_state = layer.states
    hidden_states = hidden_states * keep[:, :, None].to(dtype)
    projected = mixer.in_proj(hidden_states)
    groups_state = mixer.n_groups * mixer.ssm_state_size
    gate, xbc, dt = projected.split([mixer.intermediate_size, mixer.conv_dim, mixer.num_heads], dim=-1)
    xbc, conv_state = causal_conv(xbc.transpose(1, 2) * keep[:, None, :].to(xbc.dtype), conv_state, conv, activation)
    xbc = xbc.transpose(1, 2) * keep[:, :, None].to(xbc.dtype)
    x, B, C = torch.split(xbc, [mixer.intermediate_size, groups_state, groups_state], dim=-1)
    dt = F.softplus(dt + mixer.dt_bias.to(dt.dtype))
    lo, hi = limit
    if lo > 0.0 or hi != float("inf"):  # transformers limits a prompt's time steps, not a one-token update's
        several = torch.ones_like(keep[0], dtype=torch.int32).sum() > 1  # a tensor: the decode graph keeps it
        dt = torch.where(several, torch.clamp(dt, min=lo, max=hi), dt)
    dt = dt.float() * keep[:, :, None]  # [B, T, H]; a pad's step is the identity
    heads, head_dim, state = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size
    per_group = heads // mixer.n_groups
    x = x.reshape(batch, tokens, heads, head_dim).float()
    B = B.reshape(batch, tokens, mixer.n_groups, state).float().repeat_interleave(per_group, dim=2, output_size=heads)
    C = C.reshape(batch, tokens, mixer.n_groups, state).float().repeat_interleave(per_group, dim=2, output_size=heads)
    A = -torch.exp(mixer.A_log.float())[:, None, None]  # [H, 1, 1]
    ys, ssm_state = diagonal_scan(ssm_state, A, dt.transpose(0, 1)[..., None], x.transpose(0, 1), B.transpose(0, 1),
                                  C.transpose(0, 1))
    layer.states = [conv_state, ssm_state]
    y = ys.transpose(0, 1) + x * mixer.D.float()[:, None]  # [B, T, H, P]
    y = mixer.norm(y.reshape(batch, tokens, -1), gate)
    return mixer.out_proj(y.to(dtype))


mixers.register(f"{_MODELS}.mamba.modeling_mamba.MambaMixer", MAMBA, mamba_forward)
mixers.register(f"{_MODELS}.mamba2.modeling_mamba2.Mamba2Mixer", MAMBA2, mamba2_forward)
mixers.register(f"{_MODELS}.bamba.modeling_bamba.BambaMixer", MAMBA2, mamba2_forward)  # Mamba2's, beside attention
