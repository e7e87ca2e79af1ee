"""LFM2's gated short convolution (Lfm2ShortConv, and LFM2-MoE's and LFM3's) over the converted step's explicit state.

The mixer projects each token to B, C and x, convolves B * x with a short depthwise causal kernel and gates the
result with C. Its cache is the convolution's window only: under the converted step (hf/steps/recurrent.py) the
layer's cache entry holds `conv` [B, hidden, kernel - 1] in the model's dtype, and the stand-in continues the
convolution from it (mixers.causal_conv: prompt, prompt chunk and decode token are the same graph, no loop). A token
that is not real (left padding) puts zero into the window, so the row's window is the row alone's.

Where the config has `conv_bias`, transformers zeroes a pad token's hidden state but not the in-projection's bias, so
B * x at a pad is bias_B * bias_x and enters its window: a left-padded row then differs from the row alone in
transformers itself. Here the pad's input to the window is zero (the row alone's result); unpadded rows are the same.
Outside the step (a plain forward, no such cache entry) the mixer's own forward runs.
"""

from __future__ import annotations

from typing import Any

import torch

from . import mixers
from .mixers import Mixer, causal_conv, conv_state_shape, step_state

_MODELS = "transformers.models"


def _short_conv_states(mixer: torch.nn.Module) -> tuple:
    """conv [hidden, kernel - 1] in the model's dtype."""
    return ((conv_state_shape(mixer.conv), None),)


SHORT_CONV = Mixer("short-conv", _short_conv_states)


def short_conv_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, attention_mask: Any = None,
                       **kwargs: Any) -> torch.Tensor:
    """Lfm2ShortConv over the step's state: in-projection to B, C, x; B * x through the window; C gates the output."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    keep = layer.keep[:, None, :].to(hidden_states.dtype)  # [B, 1, T]
    b, c, x = self.in_proj(hidden_states).transpose(-1, -2).chunk(3, dim=-2)  # [B, hidden, T] each
    convolved, conv_state = causal_conv(b * x * keep, layer.states[0], self.conv, None)
    layer.states = [conv_state]
    return self.out_proj((c * convolved).transpose(-1, -2))


mixers.register(f"{_MODELS}.lfm2.modeling_lfm2.Lfm2ShortConv", SHORT_CONV, short_conv_forward)
mixers.register(f"{_MODELS}.lfm2_moe.modeling_lfm2_moe.Lfm2MoeShortConv", SHORT_CONV, short_conv_forward)
mixers.register(f"{_MODELS}.lfm3.modeling_lfm3.Lfm3ShortConv", SHORT_CONV, short_conv_forward)  # LFM2's, line for line
