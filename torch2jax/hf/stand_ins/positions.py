"""Positions of decoders that count them from the cache's length, over the converted causal-LM step.

BART's decoder and its kin (mBART, PLBART, Pegasus, Blenderbot, Marian, MVP, BigBird-Pegasus, TrOCR, LED, Whisper's) take no
`position_ids`: token t's position is `t + cache.get_seq_length()`, padding included, so transformers' `generate` on
a left-padded batch gives every row the batch's column numbers. The converted step writes a prompt left-padded
further to a length bucket (generate/loop.prompt_bucket) and its cache reports the first slot written, so those
positions were shifted by the bucket's extra padding and the tokens differed from transformers' whenever the
prompt was not exactly a bucket long.

The causal-LM step (hf/steps/causal_lm.py) knows each query's column in transformers' batch: the longest row has no
padding there, so its position is its column, and every row's position is at most that. It gives these columns
(`write_at` less the bucket's padding: the last slot minus the batch's largest last position) to the decoder's
positional embedding, whose stand-in looks them up instead of the positions it is called with. Slots of the bucket's
padding come before column 0; they are clamped to it (those slots are masked out of every row's attention). The
encoder-decoder's decode step (hf/steps/seq2seq.py) gives its slots, which are the decoder's positions there (no
padding before the start token); MVP's own count, an arange from a tensor length, does not trace at all.
Without a step (plain conversion, the encoder) the embedding's own forward runs. In the server's batch, whose rows
write apart from slot 0 each (serve/engine.py), a row's own slots are its positions alone, which is what the server
gives each request; `one_run` tells `generate`'s batch (every row the same run of slots) from it.

GIT's model reads the cache's length only where the step gives what it would derive from it (positions, a 4-D mask),
but it asks first; its stand-in answers 0 (git_model_with_given_positions).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ...capture import trace_forwards
from ..steps import kv_cache

_MODELS = "transformers.models"
# an nn.Embedding whose row for position p is p + `offset` (its own attribute, else 0)
_TABLES = tuple(f"{_MODELS}.{name}" for name in (
    "bart.modeling_bart.BartLearnedPositionalEmbedding",
    "mbart.modeling_mbart.MBartLearnedPositionalEmbedding",
    "plbart.modeling_plbart.PLBartLearnedPositionalEmbedding",
    "pegasus.modeling_pegasus.PegasusSinusoidalPositionalEmbedding",
    "blenderbot.modeling_blenderbot.BlenderbotLearnedPositionalEmbedding",
    "blenderbot_small.modeling_blenderbot_small.BlenderbotSmallLearnedPositionalEmbedding",
    "marian.modeling_marian.MarianSinusoidalPositionalEmbedding",
    "mvp.modeling_mvp.MvpLearnedPositionalEmbedding",
    "bigbird_pegasus.modeling_bigbird_pegasus.BigBirdPegasusLearnedPositionalEmbedding",
    "trocr.modeling_trocr.TrOCRLearnedPositionalEmbedding",
    "led.modeling_led.LEDLearnedPositionalEmbedding",
    # WhisperForCausalLM's forward names no position_ids, so transformers' generate passes none and its decoder counts
    # from the cache (the encoder-decoder's generate passes the decoder's, which are its slots: the same rows)
    "whisper.modeling_whisper.WhisperPositionalEmbedding",
))
# TrOCR's sinusoidal table numbers each row's non-pad tokens of the call from the cache's length
_TROCR_SINUSOIDAL = f"{_MODELS}.trocr.modeling_trocr.TrOCRSinusoidalPositionalEmbedding"
_GIVEN = "_torch2jax_step_columns"  # the instance attribute the step sets while it runs
_OTHERS: set[str] = set()  # further modules given the step's columns (register_counted_from_cache)


def _qualified(module: torch.nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def counted_from_cache(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The positional embeddings in `lm` whose positions count from the cache's length (this module's stand-ins)."""
    known = {*_TABLES, _TROCR_SINUSOIDAL, *_OTHERS}
    return [m for m in lm.modules() if _qualified(m) in known]


def register_counted_from_cache(qualified_name: str, function: Any) -> None:
    """While tracing, the class `qualified_name` runs `function` as its forward and is given the step's columns, which
    it reads with step_columns(self): for stand-ins kept in their own modules (RoFormer's, FSMT's)."""
    _OTHERS.add(qualified_name)
    trace_forwards.register(qualified_name, function)


def step_columns(module: torch.nn.Module) -> torch.Tensor | None:
    """The columns the running step gives `module` (batch_columns'), or None outside the step."""
    return module.__dict__.get(_GIVEN)


def batch_columns(position_ids: torch.Tensor, write_at: torch.Tensor) -> torch.Tensor:
    """Each written slot's column in transformers' batch (the batch left-padded to its longest row): the slot less the
    bucket's extra padding, which is the last slot minus the largest position any row has there; [T] for a step whose
    rows share their slots. A step whose rows write apart ([B, T] slots) gives [B, T]: the batch's columns where every
    row writes the same slots (`generate`'s left-padded batch), else each row's own slots, which are its positions
    (the server's rows, each a request alone from slot 0)."""
    if write_at.dim() == 1:
        return write_at - (write_at[-1] - position_ids[:, -1].max())
    shared = write_at[0] - (write_at[0, -1] - position_ids[:, -1].max())
    return torch.where(one_run(write_at), shared[None].expand_as(write_at), write_at)


def one_run(slots: torch.Tensor) -> torch.Tensor:
    """Whether [B, T] slots (or columns) are `generate`'s: every row the same consecutive run. The server's rows write
    apart, and a row's pad columns write past its real tokens, so its slots are neither."""
    return (slots == slots[:1]).all() & (slots[0, -1] - slots[0, 0] == slots.shape[1] - 1)


@contextmanager
def columns_given(modules: list[torch.nn.Module], columns: torch.Tensor) -> Iterator[None]:
    """While the step runs, `modules` (counted_from_cache's) look up `columns` instead of their own positions."""
    for module in modules:
        module.__dict__[_GIVEN] = columns
    try:
        yield
    finally:
        for module in modules:
            module.__dict__.pop(_GIVEN, None)


def table_at_columns(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    columns = self.__dict__.get(_GIVEN)
    if columns is None:
        return type(self).forward(self, *args, **kwargs)
    rows = columns.clamp(min=0) + getattr(self, "offset", 0)
    # [1, T, D] or [B, T, D]: added to the [B, T, D] token embeddings
    return torch.nn.Embedding.forward(self, rows if rows.dim() == 2 else rows[None])


def trocr_sinusoidal_at_columns(self: Any, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    columns = self.__dict__.get(_GIVEN)
    if columns is None:
        return type(self).forward(self, input_ids, *args, **kwargs)
    # transformers' cache holds the batch's columns before this call's first one (none before the prompt)
    if columns.dim() == 1:
        first = columns[0]
    else:  # the batch's first column where rows share their slots, else each row's tokens before its real ones here
        own = columns[:, -1:] + 1 - input_ids.ne(self.padding_idx).sum(1, keepdim=True)
        first = torch.where(one_run(columns), columns[:1, :1].expand_as(own), own)
    rows = self.create_position_ids_from_input_ids(input_ids, self.padding_idx, first.clamp(min=0))
    table = self.weights.to(input_ids.device)
    return table.index_select(0, rows.reshape(-1)).view(*input_ids.shape, table.shape[-1])


def git_model_with_given_positions(self: Any, *args: Any, **kwargs: Any) -> Any:
    """transformers' GitModel.forward over the step's cache with its length read as 0. GIT reads the cache's length
    only to number positions when none are given and to widen a 2-D padding mask over the cached image tokens; the
    step gives both positions and a 4-D mask, but `cache_length > 0` is still asked first, of the step's cache length
    (a tensor: its first slot written), which torch.export cannot branch on ("Could not guard on data-dependent
    expression"). With an image (`pixel_values`) or without the step's cache, transformers' own forward runs."""
    cache = kwargs.get("cache")
    if (kv_cache.step_layer(cache, 0) is None or kwargs.get("position_ids") is None
            or kwargs.get("pixel_values") is not None):
        return type(self).forward(self, *args, **kwargs)
    cache.get_seq_length = lambda layer_idx=0: 0  # this call's Cache object only (the step builds one per call)
    try:
        return type(self).forward(self, *args, **kwargs)
    finally:
        del cache.get_seq_length


for _name in _TABLES:
    trace_forwards.register(_name, table_at_columns)
trace_forwards.register(_TROCR_SINUSOIDAL, trocr_sinusoidal_at_columns)
trace_forwards.register(f"{_MODELS}.git.modeling_git.GitModel", git_model_with_given_positions)
