"""RWKV (v4, RwkvForCausalLM) over the converted step's explicit state (hf/steps/recurrent.py; the registry:
mixers.py).

RWKV keeps no transformers Cache: its forward takes and returns `state`, five tensors [B, hidden, layers] (the
feed-forward's and the attention's last input, then the WKV recurrence's numerator, denominator and running maximum,
float32). Under the step each block's cache entry holds its own five, one row each: ffn_x [hidden] and att_x [hidden]
in the model's dtype, num, den and max [attention_hidden] float32; the step passes its Cache of entries as `state`
(the registry entry's `state_keyword`) and the model hands it to every block unchanged.

Each block is one stand-in: the token shift (each token mixed with the one before) reads the last *real* token before
it, or the state's (the place of each token's last real one, then a gather), and the WKV recurrence is one scan
over the tokens in transformers' numerically stable form (the running maximum kept beside numerator and
denominator, as its CPU path does), starting from the given state: prompt, prompt chunk and decode token are the same
graph. A token that is not real leaves all five states as they were.

An empty state is zeros (the generator's new cache); transformers starts the maximum at -1e30 instead. Both give the
same first output (numerator and denominator are zero, so the maximum cancels); here the maximum is read as -1e38
wherever the denominator is zero (the denominator of a state that saw a real token is at least one).

transformers' RWKV ignores the attention mask: left padding enters its state, so its padded rows differ from its
rows alone. Here padding is left out (a padded row generates what the row alone does; tests compare each row with
transformers' row alone). transformers' batched generate also differs from its rows alone on an unpadded row (a
batch of two; its forward without a cache agrees with the rows alone, and with this).
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture import trace_forwards
from . import mixers
from .mixers import Mixer, step_state

_MODELS = "transformers.models"
EMPTY_MAX = -1e38  # the WKV maximum of a state that has seen no token


def _states(block: torch.nn.Module) -> tuple:
    """ffn_x and att_x [hidden] in the model's dtype; the WKV numerator, denominator and maximum [attention_hidden]
    float32 (transformers' order)."""
    hidden = (int(block.config.hidden_size),)
    width = (int(block.attention.attention_hidden_size),)
    return ((hidden, None), (hidden, None), (width, torch.float32), (width, torch.float32), (width, torch.float32))


RWKV = Mixer("rwkv", _states, layer_index=lambda block: int(block.layer_id), state_keyword="state")


def token_shift(x: torch.Tensor, previous: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For x [B, T, C]: each token's last real predecessor (`previous` [B, C] where none is in x), and the new
    `previous` (the last real token, or `previous` where none is real). keep [B, T] marks the real tokens."""
    from torch._higher_order_ops.scan import scan

    batch, tokens, channels = x.shape
    row = torch.cat([previous[:, None].to(x.dtype), x], dim=1)  # [B, T + 1, C]: 0 is the state

    def step(last, xs):
        at, real = xs
        last = torch.where(real, at, last)
        return last, last.clone()

    # each token's place in `row` of the last real token up to it (a running maximum; a scan: jax's cumulative
    # maximum needs a static length)
    at = torch.arange(1, tokens + 1, device=x.device)[:, None].expand(tokens, batch)
    _, last = scan(step, torch.zeros_like(at[0]), (at, keep.transpose(0, 1)))
    last = torch.cat([torch.zeros_like(last[:1]), last], dim=0).transpose(0, 1)  # [B, T + 1]
    shifted = row.gather(1, last[:, :tokens, None].expand(batch, tokens, channels))
    new = row.gather(1, last[:, tokens:, None].expand(batch, 1, channels))[:, 0]
    return shifted, new.to(previous.dtype)


def wkv_scan(time_decay: torch.Tensor, time_first: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             keep: torch.Tensor, state: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """RWKV's WKV recurrence over key and value [B, T, A] from `state` (numerator, denominator, maximum [B, A]
    float32) as one scan: (the output [B, T, A] float32, the new state). Tokens not kept leave the state as it was."""
    from torch._higher_order_ops.scan import scan

    decay = -torch.exp(time_decay.float())
    first = time_first.float()
    num, den, top = state
    top = torch.where(den == 0, torch.full_like(top, EMPTY_MAX), top)

    def step(carry, xs):
        num, den, top = carry
        k, v, real = xs  # [B, A], [B, A], [B, 1]
        out_top = torch.maximum(top, k + first)
        e1, e2 = torch.exp(top - out_top), torch.exp(k + first - out_top)
        out = (e1 * num + e2 * v) / (e1 * den + e2)
        new_top = torch.maximum(top + decay, k)
        e1, e2 = torch.exp(top + decay - new_top), torch.exp(k - new_top)
        carry = (torch.where(real, e1 * num + e2 * v, num), torch.where(real, e1 * den + e2, den),
                 torch.where(real, new_top, top))
        return carry, out

    (num, den, top), out = scan(step, (num, den, top), (key.float().transpose(0, 1), value.float().transpose(0, 1),
                                                         keep.transpose(0, 1)[:, :, None]))
    return out.transpose(0, 1), [num, den, top]


def _mix(x: torch.Tensor, shifted: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    return x * mix + shifted * (1 - mix)


def block_forward(self: Any, hidden: torch.Tensor, state: Any = None, use_cache: bool = False,
                  output_attentions: bool = False, rescale: float = 1.0) -> tuple:
    """RwkvBlock over the step's state: attention (token shift, WKV scan, receptance gate), then the feed-forward
    (token shift, squared ReLU, receptance gate), each with its residual, their outputs divided by `rescale` (the
    inference rescaling of weights that are not rescaled yet, model_forward)."""
    layer = step_state(state, self.layer_id)
    if layer is None:
        return type(self).forward(self, hidden, state=state, use_cache=use_cache, output_attentions=output_attentions)
    ffn_x, att_x, *wkv = layer.states
    keep = layer.keep
    if self.layer_id == 0:
        hidden = self.pre_ln(hidden)

    attention = self.attention
    x = self.ln1(hidden)
    shifted, att_x = token_shift(x, att_x, keep)

    key, value = attention.key(_mix(x, shifted, attention.time_mix_key)), attention.value(_mix(x, shifted, attention.time_mix_value))
    receptance = torch.sigmoid(attention.receptance(_mix(x, shifted, attention.time_mix_receptance)))
    out, wkv = wkv_scan(attention.time_decay, attention.time_first, key, value, keep, wkv)
    hidden = hidden + attention.output(receptance * out.to(key.dtype)) / rescale

    feed_forward = self.feed_forward
    x = self.ln2(hidden)
    shifted, ffn_x = token_shift(x, ffn_x, keep)
    key = torch.square(torch.relu(feed_forward.key(_mix(x, shifted, feed_forward.time_mix_key))))
    receptance = torch.sigmoid(feed_forward.receptance(_mix(x, shifted, feed_forward.time_mix_receptance)))
    hidden = hidden + receptance * (feed_forward.value(key) / rescale)
    layer.states = [ffn_x, att_x, *wkv]
    return hidden, state, None


def model_forward(self: Any, input_ids: torch.Tensor | None = None, attention_mask: Any = None,
                  inputs_embeds: torch.Tensor | None = None, state: Any = None, use_cache: bool | None = None,
                  **kwargs: Any) -> Any:
    """RwkvModel with the step's Cache of entries as `state`: every block reads its own entry. transformers rescales
    its weights in place on the first call in eval mode (each block's output weights divided by 2 ** (index //
    rescale_every), the stream halved every rescale_every blocks); here weights not rescaled yet (a model not run in
    eval mode, or weights streamed from a checkpoint) stay as they are and the division is in the graph (exact: a
    power of two), so the trace changes no weight. Any other state runs the model's own forward."""
    layers = getattr(state, "layers", None)
    if not layers or not getattr(layers[0], mixers.STATE_ATTRIBUTE, False):
        return type(self).forward(self, input_ids=input_ids, attention_mask=attention_mask,
                                  inputs_embeds=inputs_embeds, state=state, use_cache=use_cache, **kwargs)
    from transformers.models.rwkv.modeling_rwkv import RwkvOutput

    every = self.config.rescale_every
    hidden = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
    for index, block in enumerate(self.blocks):
        rescale = 2.0 ** (index // every) if every > 0 and not self.layers_are_rescaled else 1.0
        hidden, _, _ = block(hidden, state=state, rescale=rescale)
        if every > 0 and (index + 1) % every == 0:
            hidden = hidden / 2
    return RwkvOutput(last_hidden_state=self.ln_out(hidden), state=state)


mixers.register(f"{_MODELS}.rwkv.modeling_rwkv.RwkvBlock", RWKV, block_forward)
trace_forwards.register(f"{_MODELS}.rwkv.modeling_rwkv.RwkvModel", model_forward)
