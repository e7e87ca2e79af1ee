"""ZAYA's compressed convolutional attention projection (ZayaCCAProjection) over the converted step's explicit state
(hf/steps/recurrent.py; the registry: mixers.py).

Each ZAYA layer attends with keys and values like any decoder, but makes its queries and keys through a causal
convolution (a depthwise, then a grouped one) and takes half of each value head from the token before. Its cache
layer is transformers' hybrid one: a conv state and a recurrent state, then keys and values. Under the step the
layer's entry holds conv [B, q + kv channels, window] and the previous token's delayed value projection
[B, kv_hidden / 2], both in the model's dtype, then keys and values; the convolution continues from its window (prompt,
prompt chunk and decode token are the same graph) and the delayed value is each token's last real predecessor's.

The delayed-value state is kept without the projection's bias (added back when read), so an empty state (zeros)
is transformers' start, the projection of a zero token. A token that is not real (left padding) puts zero into the
conv window and leaves the delayed value as it was. transformers zeroes a pad's input instead, so with
`attention_bias` its pads put the query and key biases into the window (its padded rows then differ from its rows
alone; here a padded row is the row alone, and unpadded rows are the same).

Converting ZAYA also needs its windowed layers' mask under their own name ("hybrid_sliding"): hf/steps/recurrent.py
gives them the sliding-window mask.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import mixers
from .mixers import Mixer, step_state
from .rwkv import token_shift

_MODELS = "transformers.models"


def _states(projection: torch.nn.Module) -> tuple:
    """conv [q + kv channels, both kernels' reach], the delayed value [kv_hidden / 2], in the model's dtype."""
    channels = int(projection.conv_qk_depthwise.in_channels)
    return (((channels, int(projection.conv_kernel_size)), None),
            ((int(projection.v_proj_delayed.out_features),), None))


CCA = Mixer("zaya-cca", _states)


def cca_projection_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, conv_mask: Any = None,
                           **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ZayaCCAProjection over the step's state: queries and keys through the two convolutions from the window, with
    their residual paths; values half current, half the previous real token's delayed projection."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache, conv_mask, **kwargs)
    keep = layer.keep  # [B, T]
    conv_state, delayed_state = layer.states
    hidden_states = hidden_states * keep[:, :, None].to(hidden_states.dtype)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)

    queries, keys = self.q_proj(hidden_states), self.k_proj(hidden_states)
    query_residual = queries.view(*hidden_shape)
    key_residual = keys.view(*hidden_shape).repeat_interleave(self.num_key_value_groups, dim=2)
    query_residual = (query_residual + key_residual) * 0.5
    key_residual = query_residual.view(*input_shape, -1, self.num_key_value_groups, self.head_dim).mean(dim=-2)

    qk = torch.cat([queries, keys], dim=-1).transpose(1, 2) * keep[:, None, :].to(queries.dtype)  # [B, C, T]
    window = torch.cat([conv_state.to(qk.dtype), qk], dim=-1)
    conv_state = window[:, :, window.shape[-1] - self.conv_kernel_size:].to(conv_state.dtype)
    qk = self.conv_qk_grouped(self.conv_qk_depthwise(window)).transpose(1, 2)
    width = query_residual.shape[-2] * query_residual.shape[-1]
    query = qk[..., :width].view(*hidden_shape) + query_residual
    key = qk[..., width:].view(*hidden_shape) + key_residual

    delayed = F.linear(hidden_states, self.v_proj_delayed.weight)  # the bias is added when read
    previous, delayed_state = token_shift(delayed, delayed_state, keep)
    if self.v_proj_delayed.bias is not None:
        previous = previous + self.v_proj_delayed.bias
    value = torch.cat([self.v_proj_current(hidden_states), previous], dim=-1).view(*hidden_shape)
    layer.states = [conv_state, delayed_state]
    return query, key, value


mixers.register(f"{_MODELS}.zaya.modeling_zaya.ZayaCCAProjection", CCA, cca_projection_forward)
