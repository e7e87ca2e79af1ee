"""FSMT (fairseq's WMT19 translation models) over the encoder-decoder's decode step (hf/steps/seq2seq.py).

The step gives transformers' models 4-D masks ([B, 1, T, S], bool or added to the scores); FSMT's own code takes the
source mask only as [B, S] (`invert_mask` asserts it, which torch.export reports as a bare AssertionError) and, with a
cache, builds no self-attention mask at all: transformers' cache holds just the tokens written, where the step's
fixed cache also holds slots not written yet, which must be masked. Its model's stand-in, over the step's cache, turns
the source mask back into [B, S] and hands the decoder the step's self-attention mask as the additive mask FSMT's
attention adds to its scores ([B, 1, T, S] broadcasts over the heads).

FSMT's sinusoidal table numbers a call's non-pad tokens from the cache's length, and would grow itself past it; over
the step that length is the step's first slot (no padding precedes the start token), given as the step's columns
(hf/stand_ins/positions.py), so the stand-in looks those rows up without the data-dependent check. The step's cache
is no longer than the table (seq2seq's check_positions), so the table never needs to grow there.
"""

from __future__ import annotations

from typing import Any

import torch

from ...capture import trace_forwards
from ..steps.kv_cache import step_layer
from .positions import register_counted_from_cache, step_columns

_FSMT = "transformers.models.fsmt.modeling_fsmt"


def _keep(mask: torch.Tensor) -> torch.Tensor:
    """Which keys a mask lets through: bool as it is, an additive mask where it adds nothing."""
    return mask if mask.dtype == torch.bool else mask == 0


def fsmt_model(self: Any, input_ids: Any = None, attention_mask: Any = None, decoder_input_ids: Any = None,
               decoder_attention_mask: Any = None, encoder_outputs: Any = None, cache: Any = None, **kwargs: Any) -> Any:
    """transformers' FSMTModel.forward; over the step's cache, with the step's 4-D masks in the forms FSMT reads."""
    own = getattr(cache, "self_attention_cache", None)
    if (step_layer(own, 0) is None or encoder_outputs is None or attention_mask is None or attention_mask.dim() != 4
            or decoder_attention_mask is None or decoder_attention_mask.dim() != 4):
        return type(self).forward(self, input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                                  decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
                                  cache=cache, **kwargs)
    from transformers.modeling_outputs import Seq2SeqModelOutput

    dtype = self.decoder.embed_tokens.weight.dtype
    added = torch.where(_keep(decoder_attention_mask), torch.zeros((), dtype=dtype), torch.finfo(dtype).min)
    decoded = self.decoder(decoder_input_ids, encoder_outputs[0], _keep(attention_mask)[:, 0, 0, :], None,
                           decoder_causal_mask=added, cache=cache, use_cache=True, return_dict=True)
    return Seq2SeqModelOutput(last_hidden_state=decoded.last_hidden_state, cache=cache,
                              encoder_last_hidden_state=encoder_outputs[0])


def fsmt_table_at_columns(self: Any, input: torch.Tensor, *, cache_length: Any = 0) -> torch.Tensor:
    """FSMT's SinusoidalPositionalEmbedding.forward numbering from the step's first column, where the step gives it."""
    columns = step_columns(self)
    if columns is None:
        return type(self).forward(self, input, cache_length=cache_length)
    first = columns[:1] if columns.dim() == 1 else columns[:, :1]
    rows = self.make_positions(input, self.padding_idx) + first.clamp(min=0)
    return torch.nn.Embedding.forward(self, rows)


trace_forwards.register(f"{_FSMT}.FSMTModel", fsmt_model)
register_counted_from_cache(f"{_FSMT}.SinusoidalPositionalEmbedding", fsmt_table_at_columns)
