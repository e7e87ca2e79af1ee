"""Mamba's kin over the converted step's explicit recurrent state (the registry: mixers.py; the worked example:
state_space.py, whose scan and convolution these reuse).

- FalconMamba and Jamba: Mamba1 with RMS norms on the time step, B and C after `x_proj` (FalconMamba's have no
  weight, Jamba's do); state as Mamba's: conv [channels, kernel - 1], SSM [intermediate, state] float32.
- Zamba: Mamba1 split into `n_mamba_heads` independent heads, each with its own `x_proj` and `dt_proj`; the input
  projection interleaves x and gate channel by channel. State: conv [intermediate, kernel - 1], SSM [heads,
  head_dim, state] float32 (transformers' own per-head layout).
- Zamba2: Mamba2's arithmetic (state_space.ssd_mixer), a prompt's time steps limited below by `time_step_min`.

Zamba and Zamba2 put a shared attention block before some Mamba layers: that layer's cache keeps the mixer's states
and the attention's keys and values together (a hybrid layer, hf/steps/recurrent.py).

As in state_space.py, a token that is not real (left padding) enters neither state: its input to the convolution is
zero and its time step is zero, so the SSM update is the identity.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import mixers
from .mixers import Mixer, causal_conv, conv_state_shape, step_state
from .state_space import MAMBA, MAMBA2, diagonal_scan, mamba_forward, ssd_mixer

_MODELS = "transformers.models"


class _NormedView:
    """A FalconMambaMixer / JambaMambaMixer seen as the plain Mamba mixer state_space.mamba_forward runs: its
    `x_proj` returns the time step, B and C already through the mixer's own norms, as transformers' torch path
    applies them before `dt_proj`. Every other attribute is the mixer's."""

    def __init__(self, mixer: torch.nn.Module):
        self._mixer = mixer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mixer, name)

    def x_proj(self, x: torch.Tensor) -> torch.Tensor:
        mixer = self._mixer
        sizes = [mixer.time_step_rank, mixer.ssm_state_size, mixer.ssm_state_size]
        time_step, B, C = torch.split(mixer.x_proj(x), sizes, dim=-1)
        return torch.cat([mixer.dt_layernorm(time_step), mixer.b_layernorm(B), mixer.c_layernorm(C)], dim=-1)


def normed_mamba_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                         **kwargs: Any) -> torch.Tensor:
    """FalconMambaMixer / JambaMambaMixer over the step's state: Mamba1 with norms on the time step, B and C."""
    if step_state(cache, self.layer_idx) is None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    return mamba_forward(_NormedView(self), hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)


def _zamba_states(mixer: torch.nn.Module) -> tuple:
    """conv [intermediate, kernel - 1] in the model's dtype, SSM [heads, head_dim, state] float32."""
    return ((conv_state_shape(mixer.conv1d), None),
            ((int(mixer.n_mamba_heads), int(mixer.mamba_head_dim), int(mixer.ssm_state_size)), torch.float32))


ZAMBA = Mixer("zamba", _zamba_states)


def zamba_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                  **kwargs: Any) -> torch.Tensor:
    """ZambaMambaMixer over the step's state: Mamba1 per head (transformers loops over the heads; here the heads are
    one more batch dim of the same scan), x and gate interleaved in the input projection as transformers splits it."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    batch, tokens, _ = hidden_states.shape
    dtype = hidden_states.dtype
    heads, head_dim = self.n_mamba_heads, self.mamba_head_dim
    keep = layer.keep  # [B, T]
    conv_state, ssm_state = layer.states
    hidden_states = hidden_states * keep[:, :, None].to(dtype)
    projected = self.in_proj(hidden_states).transpose(1, 2).reshape(batch, -1, 2, tokens)  # channel 2d: x, 2d + 1: gate
    x, gate = projected[:, :, 0], projected[:, :, 1]  # [B, D, T] each
    x, conv_state = causal_conv(x * keep[:, None, :].to(x.dtype), conv_state, self.conv1d, self.activation)
    x = x * keep[:, None, :].to(x.dtype)
    x = x.reshape(batch, heads, head_dim, tokens).permute(3, 0, 1, 2)  # [T, B, H, P]
    # per head: [dt rank + 2 state, P] @ x -> time step, B, C
    parameters = torch.einsum("hrp,tbhp->tbhr", self.x_proj_weight, x)
    time_step, B, C = torch.split(parameters, [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1)
    time_step = torch.einsum("hpr,tbhr->tbhp", self.dt_proj_weight, time_step)  # [T, B, H, P]
    dt = F.softplus(time_step + self.dt_proj_bias.float()) * keep.transpose(0, 1)[:, :, None, None]  # pads: identity
    A = -torch.exp(self.A_log.float())  # [H, P, N]
    ys, ssm_state = diagonal_scan(ssm_state, A, dt, x.float(), B.float(), C.float())
    layer.states = [conv_state, ssm_state]
    y = ys.to(dtype) + x * self.D.float()  # [T, B, H, P]
    y = y * F.silu(gate.reshape(batch, heads, head_dim, tokens).permute(3, 0, 1, 2))
    return self.out_proj(y.permute(1, 0, 2, 3).reshape(batch, tokens, -1).to(dtype))


def zamba2_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                   **kwargs: Any) -> torch.Tensor:
    """Zamba2MambaMixer over the step's state: Mamba2's arithmetic (state_space.ssd_mixer) with Zamba2's time-step
    limit (`time_step_min`, no upper bound), which, as in transformers, bounds a prompt's time steps and not a
    one-token step's."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    return ssd_mixer(self, hidden_states, layer, self.conv1d, self.activation, limit=self.time_step_limit)


mixers.register(f"{_MODELS}.falcon_mamba.modeling_falcon_mamba.FalconMambaMixer", MAMBA, normed_mamba_forward)
mixers.register(f"{_MODELS}.jamba.modeling_jamba.JambaMambaMixer", MAMBA, normed_mamba_forward)
mixers.register(f"{_MODELS}.zamba2.modeling_zamba2.Zamba2MambaMixer", MAMBA2, zamba2_forward)
mixers.register(f"{_MODELS}.zamba.modeling_zamba.ZambaMambaMixer", ZAMBA, zamba_forward)
