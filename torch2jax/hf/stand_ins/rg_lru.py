"""RecurrentGemma's recurrent block (Griffin's temporal conv and RG-LRU) over the converted step's explicit state
(hf/steps/recurrent.py; the registry: mixers.py).

transformers keeps this block's state on the module itself (`conv1d_state`, `rg_lru.recurrent_states`), not in its
cache, runs a prompt's recurrence as a Python loop over the tokens and always starts a prompt from a zero state.
Under the step the layer's cache entry holds both (conv [B, lru_width, width - 1] in the model's dtype, recurrence
[B, lru_width] float32), the recurrence is one scan over the tokens starting from the given state (a prompt, a chunk
of one and a decode token are the same graph), and a token that is not real (left padding) leaves both as they were.

transformers lets left padding into the block: a pad token's input enters the conv window of the first real tokens
(its recurrence forgets the pads, being reset where the position is 0, at the first real token). Here the pads are
left out, so a padded row generates what the row alone does in both; transformers' padded rows differ from its rows
alone (tests compare rows without padding).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import mixers
from .mixers import Mixer, causal_conv, conv_state_shape, step_state

_MODELS = "transformers.models"


def _states(block: torch.nn.Module) -> tuple:
    """conv [lru_width, width - 1] in the model's dtype, the recurrence [lru_width] float32."""
    return ((conv_state_shape(block.conv_1d), None), ((int(block.lru_width),), torch.float32))


RG_LRU = Mixer("rg_lru", _states)


def _linear_scan(state: torch.Tensor, decay: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = decay_t h_{t-1} + x_t over the tokens (dim 0 of decay and x: [T, B, W]) as one scan: (h [T, B, W],
    the last h)."""
    from torch._higher_order_ops.scan import scan

    def step(h, xs):
        decay_t, x_t = xs
        h = decay_t * h + x_t
        return h, h.clone()

    last, ys = scan(step, state, (decay, x))
    return ys, last


def _gate(rg_lru: torch.nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """sigmoid(x W_h + b_h) per head block (RecurrentGemmaRglru's block-diagonal gates)."""
    batch, tokens, width = x.shape
    heads = rg_lru.num_attention_heads
    blocks = x.reshape(batch, tokens, heads, width // heads)
    return torch.sigmoid(torch.einsum("bthi,hij->bthj", blocks, weight) + bias).reshape(batch, tokens, width)


def recurrent_block_forward(self: Any, input_states: torch.Tensor, position_ids: torch.Tensor,
                            attention_mask: torch.Tensor = None, use_cache: bool = True, cache: Any = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """RecurrentGemmaRecurrentBlock over the step's state: transformers' branches, gates and reset at position 0,
    the conv and the recurrence continuing from the given state."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, input_states, position_ids, attention_mask, use_cache=use_cache, cache=cache,
                                  **kwargs)
    dtype = input_states.dtype
    keep = layer.keep  # [B, T]
    conv_state, recurrence = layer.states
    y_branch = self.act_fn(self.linear_y(input_states))
    x_branch = self.linear_x(input_states).transpose(1, 2)  # [B, W, T]
    x_branch, conv_state = causal_conv(x_branch * keep[:, None, :].to(dtype), conv_state, self.conv_1d, None)
    x = x_branch.transpose(1, 2)  # [B, T, W]

    rg_lru = self.rg_lru
    reset = position_ids[:, :, None] == 0
    input_gate = _gate(rg_lru, x, rg_lru.input_gate_weight, rg_lru.input_gate_bias)
    recurrent_gate = _gate(rg_lru, x, rg_lru.recurrent_gate_weight, rg_lru.recurrent_gate_bias)
    log_decay = -8.0 * recurrent_gate * F.softplus(rg_lru.recurrent_param)
    decay = torch.exp(log_decay)
    multiplier = torch.sqrt(1 - torch.exp(2 * log_decay))
    multiplier = reset + ~reset * multiplier
    normalized = x * input_gate * multiplier.to(dtype)
    real = keep[:, :, None]
    decay = torch.where(real, decay * ~reset, torch.ones_like(decay)).float()  # a pad keeps the state as it was
    normalized = torch.where(real, normalized, torch.zeros_like(normalized)).float()
    ys, recurrence = _linear_scan(recurrence, decay.transpose(0, 1), normalized.transpose(0, 1))
    layer.states = [conv_state, recurrence]
    hidden_states = ys.transpose(0, 1).to(dtype) * y_branch
    return self.linear_out(hidden_states), None


mixers.register(f"{_MODELS}.recurrent_gemma.modeling_recurrent_gemma.RecurrentGemmaRecurrentBlock", RG_LRU,
                recurrent_block_forward)
