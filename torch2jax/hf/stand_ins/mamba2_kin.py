"""Mamba2 mixers of the hybrid families (Granite 4 / GraniteMoeHybrid, Nemotron-H, Falcon-H1) over the converted
step's explicit state (hf/steps/recurrent.py; the registry: mixers.py).

Each is transformers' Mamba2 mixer with small differences, so each reuses state_space.ssd_mixer (the projections,
the causal conv over the conv state, one scan over the tokens, the gated norm):

- GraniteMoeHybridMambaLayer and NemotronHMamba2Mixer are Bamba's mixer line for line (a grouped gated RMS norm,
  `time_step_limit`; Nemotron-H's is (time_step_min, inf)).
- FalconH1Mixer scales its input by `ssm_in_multiplier` and its projection by `mup_vector` (the mup multipliers), and
  its gated norm is optional (without it the output is gated by silu(gate) alone); see `falcon_h1_forward`.

The cache layers around them are the step's: Nemotron-H's MLP-only and MoE-only layers keep no cache (transformers'
DummyLayer), and each Falcon-H1 layer keeps its mixer's state and its attention's keys and values side by side
(a hybrid layer: transformers' LinearAttentionAndFullAttentionLayer).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import mixers
from .mixers import step_state
from .state_space import MAMBA2, mamba2_forward, ssd_mixer

_MODELS = "transformers.models"


class _FalconH1View:
    """A FalconH1Mixer seen as the plain Mamba2 mixer ssd_mixer runs: the mup multipliers folded into `in_proj`,
    the optional gated norm as `norm` (silu(gate) alone where the model has none). Every other attribute is the
    mixer's."""

    def __init__(self, mixer: torch.nn.Module):
        self._mixer = mixer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mixer, name)

    def in_proj(self, hidden_states: torch.Tensor) -> torch.Tensor:
        mixer = self._mixer
        return mixer.in_proj(hidden_states * mixer.ssm_in_multiplier) * mixer.mup_vector

    def norm(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        if self._mixer.mamba_rms_norm:
            return self._mixer.norm(y, gate)
        return y * F.silu(gate.to(y.dtype))


def falcon_h1_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                      **kwargs: Any) -> torch.Tensor:
    """FalconH1Mixer over the step's state: Mamba2's arithmetic with Falcon-H1's multipliers and optional norm."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    return ssd_mixer(_FalconH1View(self), hidden_states, layer, self.conv1d, self.activation,
                     limit=tuple(self.time_step_limit))


mixers.register(f"{_MODELS}.granitemoehybrid.modeling_granitemoehybrid.GraniteMoeHybridMambaLayer", MAMBA2,
                mamba2_forward)
mixers.register(f"{_MODELS}.nemotron_h.modeling_nemotron_h.NemotronHMamba2Mixer", MAMBA2, mamba2_forward)
mixers.register(f"{_MODELS}.falcon_h1.modeling_falcon_h1.FalconH1Mixer", MAMBA2, falcon_h1_forward)
