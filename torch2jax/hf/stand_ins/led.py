"""LED (Longformer encoder, BART-like decoder) over the encoder-decoder's steps (hf/steps/seq2seq.py).

Encoder: LED's forward reads `is_global_attn = (mask > 0).any().item()` to choose between its local-window attention
and the global one, a branch on a tensor's value that torch.export cannot capture ("Could not guard on data-dependent
expression"). Global attention comes from `global_attention_mask` alone (`attention_mask` holds 0 and 1, which LED
turns into -inf and 0: no key is ever > 0 from it), and neither transformers' generate nor the encode step passes one,
so the stand-in runs LED's own pieces with the branch known to be local-only. With a global attention mask (or
attentions or hidden states asked for), LED's own forward runs. LED pads the source to a multiple of its attention
window only where the length needs it, a branch on the length: the encode step is exported at max_source_len then
(hf/steps/seq2seq.py, as LongT5's). Its local attention cuts queries, keys and values into
overlapping chunks with `as_strided`, whose strides grow with the batch: a symbolic batch leaves them symbolic, where
the artifact's lowering needs them as numbers. The stand-ins build the same chunks from non-overlapping blocks (a
reshape) laid side by side, which holds the same elements in the same order.

Decoder: for one token LED builds no self-attention mask (transformers' cache holds only the tokens written, all
attended); the step's fixed cache holds slots not written yet, so its layers are given the step's 4-D mask instead,
the same keys transformers attends to. Its positions count from the cache's length (hf/stand_ins/positions.py).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ...capture import trace_forwards
from ..steps.kv_cache import step_layer

_LED = "transformers.models.led.modeling_led"
_MASK = "_torch2jax_step_mask"  # the decoder layers' attribute for the step's self-attention mask


def led_encoder(self: Any, input_ids: Any = None, attention_mask: Any = None, global_attention_mask: Any = None,
                inputs_embeds: Any = None, output_attentions: Any = None, output_hidden_states: Any = None,
                return_dict: Any = None, **kwargs: Any) -> Any:
    """transformers' LEDEncoder.forward without global attention: the local-window branch, chosen statically."""
    if global_attention_mask is not None or output_attentions or output_hidden_states:
        return type(self).forward(self, input_ids, attention_mask, global_attention_mask, inputs_embeds,
                                  output_attentions, output_hidden_states, return_dict, **kwargs)
    module = sys.modules[type(self).__module__]
    if inputs_embeds is None:
        inputs_embeds = self.embed_tokens(input_ids)
    if attention_mask is None:
        attention_mask = torch.ones(inputs_embeds.shape[:-1], device=inputs_embeds.device, dtype=torch.long)
    padding_len, input_ids, attention_mask, inputs_embeds = self._pad_to_window_size(
        input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
        pad_token_id=self.config.pad_token_id)
    input_shape = inputs_embeds.shape[:-1] if input_ids is None else input_ids.shape
    attention_mask = module._prepare_4d_attention_mask_inverted(attention_mask, inputs_embeds.dtype)[:, 0, 0, :]
    hidden_states = self.layernorm_embedding(inputs_embeds + self.embed_positions(input_shape))
    hidden_states = torch.nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
    for layer in self.layers:
        hidden_states = layer(hidden_states, attention_mask=attention_mask, is_index_masked=attention_mask < 0,
                              is_index_global_attn=attention_mask > 0, is_global_attn=False)[0]
    if padding_len > 0:
        hidden_states = hidden_states[:, :-padding_len]
    output = module.LEDEncoderBaseModelOutput(last_hidden_state=hidden_states)
    return output if return_dict is not False else (hidden_states,)


def _overlapping(blocks: torch.Tensor, count: int) -> torch.Tensor:
    """Chunks of `count` consecutive blocks, one chunk starting at every block: [N, blocks, w, d] ->
    [N, blocks - count + 1, count * w, d]."""
    last = blocks.shape[1] - count + 1
    return torch.cat([blocks[:, i:i + last] for i in range(count)], dim=2)


def led_chunk(self: Any, hidden_states: torch.Tensor, window_overlap: int, onnx_export: bool = False) -> torch.Tensor:
    """LEDEncoderSelfAttention._chunk: [N, L, d] -> [N, L / w - 1, 2w, d], chunks of 2w overlapping by w."""
    rows, length, width = hidden_states.shape
    blocks = hidden_states.reshape(rows, length // window_overlap, window_overlap, width)
    return _overlapping(blocks, 2)


def led_probs_times_values(self: Any, attn_probs: torch.Tensor, value: torch.Tensor, window_overlap: int) -> torch.Tensor:
    """LEDEncoderSelfAttention._sliding_chunks_matmul_attn_probs_value with the values' chunks (3w long, one every w,
    over the values padded by w on both sides) built from blocks instead of `as_strided`."""
    batch, length, heads, width = value.shape
    probs = attn_probs.transpose(1, 2).reshape(batch * heads, length // window_overlap, window_overlap,
                                               2 * window_overlap + 1)
    value = value.transpose(1, 2).reshape(batch * heads, length, width)
    padded = torch.nn.functional.pad(value, (0, 0, window_overlap, window_overlap), value=-1)
    blocks = padded.reshape(batch * heads, length // window_overlap + 2, window_overlap, width)
    context = torch.einsum("bcwd,bcdh->bcwh", self._pad_and_diagonalize(probs), _overlapping(blocks, 3))
    return context.view(batch, heads, length, width).transpose(1, 2)


def led_decoder(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' LEDDecoder.forward, its layers given the step's self-attention mask over the step's cache."""
    cache = kwargs.get("cache")
    mask = kwargs.get("attention_mask")
    own = getattr(cache, "self_attention_cache", cache)
    if step_layer(own, 0) is None or not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return type(self).forward(self, *args, **kwargs)
    for layer in self.layers:
        layer.__dict__[_MASK] = mask
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        for layer in self.layers:
            layer.__dict__.pop(_MASK, None)


def led_decoder_layer(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None, *args: Any,
                      **kwargs: Any) -> Any:
    """transformers' LEDDecoderLayer.forward with the step's mask where LED gives none (one token)."""
    if attention_mask is None:
        attention_mask = self.__dict__.get(_MASK)
    return type(self).forward(self, hidden_states, attention_mask, *args, **kwargs)


trace_forwards.register(f"{_LED}.LEDEncoder", led_encoder)
trace_forwards.register(f"{_LED}.LEDEncoderSelfAttention", led_chunk, method="_chunk")
trace_forwards.register(f"{_LED}.LEDEncoderSelfAttention", led_probs_times_values,
                        method="_sliding_chunks_matmul_attn_probs_value")
trace_forwards.register(f"{_LED}.LEDDecoder", led_decoder)
trace_forwards.register(f"{_LED}.LEDDecoderLayer", led_decoder_layer)
