"""transformers' linear-attention hybrids over the converted step's explicit state: LaraMini's gated delta net, and the
short convolutions of Inkling, Inkling2 and Inkling2-Loop.

LaraMiniGatedDeltaNet is Qwen3.5's gated delta net line for line (separate qkv, z, b and a projections, the same
convolution, rule and gated norm; its checkpoints' fused `in_proj` is split when loading), so it runs Qwen3.5's
stand-in (gated_delta.qwen3_5_forward) over the same two states: `conv` [B, conv_dim, kernel - 1] in the model's dtype
and `recurrent` [B, value heads, k head dim, v head dim] float32.

Inkling's decoder layers keep no recurrent rule: each attention layer (full or sliding) runs four depthwise causal
convolutions in float32 (over its keys and values, after the attention and after the MLP), each with a residual, and
transformers keeps their windows in one cache layer beside the keys and values (LinearAttentionAndFullAttentionLayer,
LinearAttentionAndSlidingWindowAttentionLayer, the window of convolution `conv_idx` as conv state `conv_idx`). Here the
decoder layer is the registered mixer: its state is the four windows [B, channels, kernel - 1] float32, in `conv_idx`
order, then the attention's keys and values (a hybrid layer, hf/steps/recurrent.py). Each convolution's stand-in
continues its own window (a pad token enters it as zero, as transformers' `conv_mask` makes it). Inkling2 scales each
output by 1/sqrt(kernel + 1), and its full-attention layers' key and value convolutions add per-token taps projected
from the layer input (Inkling2DynamicShortConvolution: 1/sqrt(2 kernel + 1)).

The attention's relative-position bias reads each query's distance to each key slot. transformers builds it from one
row of query positions for the whole batch; the step's rows write at their own slots (`write_at` [B, T]), so here the
distance is each row's: query slot minus key slot, [B, 1, T, S] (Inkling2's `get_relative_distance`; Inkling's
attention reads it from the step's layer). Inkling's optional log scaling of the full layers' queries
(`log_scaling_n_floor`) counts a query's position as the real tokens it attends to (its row's position + 1);
transformers counts cache slots, left padding included, so with log scaling on, a left-padded row's tokens past the
floor differ from transformers' (the row alone's are the same). Inkling2 scales by the given positions, as
transformers does.

Inkling2-Loop runs its loop layers several times, each later pass on its own copies of their cache layers (appended
after the model's layers, read at `layer_idx + cache_offset`): a loop layer's mixer entry names those layers too
(`later_layers`), so the step lays out one state and keys and values per pass, and its stand-ins read the pass's own.
Outside the step (a plain forward, no such cache entry) each module's own forward runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ...capture import trace_forwards
from ...errors import ExportError
from ..steps.kv_cache import query_slots, step_layer
from . import mixers
from .gated_delta import GATED_DELTA, qwen3_5_forward
from .mixers import Mixer, causal_conv, step_state

_MODELS = "transformers.models"

mixers.register(f"{_MODELS}.lara_mini.modeling_lara_mini.LaraMiniGatedDeltaNet", GATED_DELTA, qwen3_5_forward)


def _short_convolutions(decoder_layer: torch.nn.Module) -> list[torch.nn.Module]:
    """The layer's short convolutions in the order of their cache states (`conv_idx` 0, 1, ...)."""
    found = sorted((m for m in decoder_layer.modules() if hasattr(m, "conv_idx")), key=lambda m: int(m.conv_idx))
    if [int(m.conv_idx) for m in found] != list(range(len(found))):
        raise ExportError(f"{type(decoder_layer).__name__}'s short convolutions do not number their cache states "
                          f"0, 1, ... ({[int(m.conv_idx) for m in found]})")
    return found


def _window_shape(convolution: torch.nn.Module) -> tuple[int, int]:
    channels = convolution.conv1d.in_channels if hasattr(convolution, "conv1d") else convolution.static_weight.shape[1]
    return (int(channels), int(convolution.conv_kernel_size) - 1)


def _loop_bounds(config: Any) -> tuple[int, int, int]:
    """(first loop layer, one past the last, passes) of an Inkling2-Loop config; (0, 0, 1) for one without a loop."""
    passes = getattr(config, "loop_num_passes", None)
    if passes is None:
        return 0, 0, 1
    return int(config.loop_layer_index_start), int(config.loop_layer_index_end), int(passes)


def _inkling_states(decoder_layer: torch.nn.Module) -> tuple:
    """One window [channels, kernel - 1] float32 per short convolution, in `conv_idx` order."""
    config = decoder_layer.self_attn.config
    start, end, passes = _loop_bounds(config)
    if passes > 1 and start < config.num_hidden_layers < end:
        raise ExportError(
            f"{type(decoder_layer).__name__}: Inkling2-Loop's loop layers {start}..{end - 1} run past its "
            f"{config.num_hidden_layers} layers, so its later passes' cache layers are not where its forward looks "
            "for them. Its forward converts: torch2jax.convert(model, args), or "
            "`torch2jax convert hf:DIR --task feature-extraction`.")
    return tuple((_window_shape(conv), torch.float32) for conv in _short_convolutions(decoder_layer))


def _later_passes(decoder_layer: torch.nn.Module) -> tuple[int, ...]:
    """The cache layers of a loop layer's later passes (Inkling2-Loop appends one copy of the loop layers' cache
    layers per pass after the first, after the model's layers: `cache_offset`); () for any other layer."""
    config = decoder_layer.self_attn.config
    index = int(decoder_layer.self_attn.layer_idx)
    start, end, passes = _loop_bounds(config)
    if not start <= index < end:
        return ()
    return tuple(config.num_hidden_layers + (p - 1) * (end - start) + index - start for p in range(1, passes))


SHORT_CONVOLUTIONS = Mixer("short-convolution attention", _inkling_states,
                           layer_index=lambda layer: int(layer.self_attn.layer_idx), later_layers=_later_passes)


def _own_layer_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A decoder layer registered as the mixer runs its own forward: its convolutions' stand-ins read the state."""
    return type(self).forward(self, *args, **kwargs)


def _masked(hidden_states: torch.Tensor, layer: Any) -> torch.Tensor:
    """hidden_states [B, T, C] float32 with the tokens that are not real zeroed (transformers' `conv_mask`)."""
    return hidden_states * layer.keep[:, :, None].to(hidden_states.dtype)


def _set_state(layer: Any, index: int, state: torch.Tensor) -> None:
    states = list(layer.states)
    states[index] = state
    layer.states = states


def _convolved(self: Any, hidden_states: torch.Tensor, layer: Any) -> torch.Tensor:
    """The static short convolution of hidden_states [B, T, C] float32 from the layer's window `conv_idx`, plus the
    input (its residual); sets the new window."""
    out, window = causal_conv(_masked(hidden_states, layer).transpose(1, 2), layer.states[self.conv_idx], self.conv1d,
                              None)
    _set_state(layer, self.conv_idx, window)
    return out.transpose(1, 2) + hidden_states


def inkling_conv_forward(self: Any, hidden_states: torch.Tensor, cache: Any = None, conv_mask: Any = None,
                         **kwargs: Any) -> torch.Tensor:
    """InklingShortConvolution over the step's window: float32, output plus input."""
    layer = step_state(cache, self.layer_idx)
    if layer is None:
        return type(self).forward(self, hidden_states, cache=cache, conv_mask=conv_mask, **kwargs)
    return _convolved(self, hidden_states.float(), layer).to(hidden_states.dtype)


def inkling2_conv_forward(self: Any, hidden_states: torch.Tensor, dynamic_input: Any = None, cache: Any = None,
                          conv_mask: Any = None, cache_offset: int = 0, **kwargs: Any) -> torch.Tensor:
    """Inkling2ShortConvolution (and Inkling2-Loop's) over the step's window: Inkling's, scaled by
    1/sqrt(kernel + 1)."""
    layer = step_state(cache, self.layer_idx + cache_offset)
    if layer is None:
        return type(self).forward(self, hidden_states, dynamic_input, cache=cache, conv_mask=conv_mask,
                                  cache_offset=cache_offset, **kwargs)
    out = _convolved(self, hidden_states.float(), layer) / math.sqrt(self.conv_kernel_size + 1)
    return out.to(hidden_states.dtype)


def inkling2_dynamic_conv_forward(self: Any, hidden_states: torch.Tensor, dynamic_input: torch.Tensor,
                                  cache: Any = None, conv_mask: Any = None, cache_offset: int = 0,
                                  **kwargs: Any) -> torch.Tensor:
    """Inkling2DynamicShortConvolution over the step's window: per channel, static taps plus taps projected from
    `dynamic_input` per token and key/value head, over the window and the token; output plus input, scaled by
    1/sqrt(2 kernel + 1)."""
    layer = step_state(cache, self.layer_idx + cache_offset)
    if layer is None:
        return type(self).forward(self, hidden_states, dynamic_input, cache=cache, conv_mask=conv_mask,
                                  cache_offset=cache_offset, **kwargs)
    batch, tokens, channels = hidden_states.shape
    kernel = self.conv_kernel_size
    dynamic = self.weight_proj(dynamic_input).float().view(batch, tokens, self.num_heads, 1, kernel)
    taps = self.static_weight.float().T.view(self.num_heads, -1, kernel) + dynamic  # [B, T, heads, C / heads, K]
    x = hidden_states.float()
    window = layer.states[self.conv_idx]
    full = torch.cat([window.to(x.dtype), _masked(x, layer).transpose(1, 2)], dim=-1)  # [B, C, K - 1 + T]
    # [B, T, C, K]: [..., lag] is the input `lag` tokens back (K shifted slices: unfold would fix the token count)
    lagged = torch.stack([full[:, :, kernel - 1 - lag:kernel - 1 - lag + tokens] for lag in range(kernel)], dim=-1)
    lagged = lagged.transpose(1, 2)
    out = (lagged.reshape(batch, tokens, self.num_heads, -1, kernel) * taps).sum(-1).reshape(batch, tokens, channels)
    _set_state(layer, self.conv_idx, full[:, :, full.shape[-1] - (kernel - 1):].to(window.dtype))
    return ((out + x) / math.sqrt(2 * kernel + 1)).to(hidden_states.dtype)


def _step_slots(cache: Any) -> tuple[torch.Tensor, Any] | None:
    """(each query's slot [B or 1, T], the attended span) from the step's first attention layer, or None outside
    the step."""
    for index in range(len(getattr(cache, "layers", None) or ())):
        layer = step_layer(cache, index)
        if layer is not None:
            return query_slots(layer.write_at), layer.span
    return None


def _distance(slots: torch.Tensor, span: Any) -> torch.Tensor:
    """Each row's query slot minus each key slot: [B or 1, 1, T, S]."""
    return (slots[:, :, None] - torch.arange(span, device=slots.device))[:, None]


def step_relative_distance(own: Callable) -> Callable:
    """Inkling2's get_relative_distance in the step: each row's own distances [B, 1, T, S] (the bias gathers and
    masks per row by broadcasting); transformers' own outside it."""

    def run(inputs_embeds: torch.Tensor, cache: Any, is_sliding: bool) -> torch.Tensor:
        found = _step_slots(cache)
        return own(inputs_embeds, cache, is_sliding) if found is None else _distance(*found)

    return run


def inkling_attention_forward(self: Any, hidden_states: torch.Tensor, attention_mask: Any, conv_mask: Any = None,
                              cache: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """InklingAttention in the step: transformers' own, with the relative bias gathered at each row's own query slots
    (and the log scaling counting each row's real tokens: the module docstring)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    entry = step_layer(cache, self.layer_idx)
    if entry is None:
        return type(self).forward(self, hidden_states, attention_mask, conv_mask=conv_mask, cache=cache, **kwargs)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states = self.q_proj(hidden_states)
    key_states = self.k_sconv(self.k_proj(hidden_states), cache=cache, conv_mask=conv_mask)
    value_states = self.v_sconv(self.v_proj(hidden_states), cache=cache, conv_mask=conv_mask)
    relative_states = self.r_proj(hidden_states).view(*input_shape, self.num_heads, -1)
    query_states = self.q_norm(query_states.view(hidden_shape)).transpose(1, 2)
    key_states = self.k_norm(key_states.view(hidden_shape)).transpose(1, 2)
    value_states = value_states.view(hidden_shape).transpose(1, 2)
    key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)

    relative = self.rel_logits_proj
    distance = _distance(query_slots(entry.write_at), key_states.shape[2])  # [B or 1, 1, T, S]
    rel_logits = (relative_states @ relative.proj).transpose(1, 2)  # [B, heads, T, rel_extent]
    index = distance.clamp(0, relative.rel_extent - 1).expand(*rel_logits.shape[:2], -1, -1)
    position_bias = rel_logits.gather(-1, index).masked_fill((distance < 0) | (distance >= relative.rel_extent), 0.0)
    if not self.is_sliding and self.config.log_scaling_n_floor is not None:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        seen = allowed.sum(-1, keepdim=True).float()  # [B, 1, T, 1]: the real tokens up to each query
        tau = 1.0 + self.config.log_scaling_alpha * torch.log((seen / self.config.log_scaling_n_floor).clamp(min=1.0))
        query_states = (query_states.float() * tau).to(query_states.dtype)
        position_bias = (position_bias.float() * tau).to(position_bias.dtype)

    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, _eager_of(self))
    attn_output, attn_weights = attention(self, query_states, key_states, value_states, attention_mask, dropout=0.0,
                                          scaling=self.scaling, sliding_window=self.sliding_window,
                                          position_bias=position_bias, **kwargs)
    return self.o_proj(attn_output.reshape(*input_shape, -1).contiguous()), attn_weights


def _eager_of(module: torch.nn.Module) -> Callable:
    import sys

    return sys.modules[type(module).__module__].eager_attention_forward


_INKLING, _INKLING2, _LOOP = (f"{_MODELS}.{name}.modeling_{name}" for name in ("inkling", "inkling2", "inkling2_loop"))

mixers.register(f"{_INKLING}.InklingDecoderLayer", SHORT_CONVOLUTIONS, _own_layer_forward)
trace_forwards.register(f"{_INKLING}.InklingShortConvolution", inkling_conv_forward)
trace_forwards.register(f"{_INKLING}.InklingAttention", inkling_attention_forward)
for _module, _prefix, _layers in ((_INKLING2, "Inkling2", ("Sliding", "Full")),
                                  (_LOOP, "Inkling2Loop", ("Sliding", "SlidingLoop", "Full", "FullLoop"))):
    for _kind in _layers:
        mixers.register(f"{_module}.{_prefix}{_kind}DecoderLayer", SHORT_CONVOLUTIONS, _own_layer_forward)
    trace_forwards.register(f"{_module}.{_prefix}ShortConvolution", inkling2_conv_forward)
    trace_forwards.register(f"{_module}.{_prefix}DynamicShortConvolution", inkling2_dynamic_conv_forward)
    trace_forwards.register_function(f"{_module}.get_relative_distance", step_relative_distance)
