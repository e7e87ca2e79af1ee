"""An encoder-decoder (T5, BART, Whisper, VisionEncoderDecoderModel: TrOCR, Donut) as two steps over explicit state:
encode once, then decode one token at a time.

    encode(input_ids [B, S], attention_mask [B, S]) -> cross    the cross-attention keys and values of every
                                                                decoder layer, [B, heads, S, head_dim] each
    encode(input_features [B, mel, frames]) -> cross            (Whisper: a fixed number of frames, no mask)
    encode(pixel_values [B, C, H, W]) -> cross                  (VisionEncoderDecoderModel: a fixed image size, no mask)
    decode(input_ids [B, 1], write_at [1], kv_valid [B, L], source_mask [B, S], cache, cross)
                                                            -> (logits [B, V] float32, cache)

`cache` is the decoder's self-attention cache, laid out as hf/steps/kv_cache.py lays a causal LM's (per layer
keys and values of [B, heads, max_cache_len + 1, head_dim], updated out of place at `write_at`, attention over
the first L slots). `cross` is state too: computed by encode from the source, read by every decode step, never
saved. The decode step hands transformers an EncoderDecoderCache whose cross layers are already filled
(`is_updated` True), so each layer's attention reads the given keys and values instead of projecting the
encoder's output, and both attention masks are built here as 4-D masks (transformers passes those through).
The decoder prompt is the one start token, so a separate decoder prefill is not needed: decode runs it at slot 0.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...capture.converter import StageTimer, cast_module, convert, tp_plan_hints
from ...errors import ExportError, InputSpecError
from ...generate.seq2seq import Seq2SeqGenerator, Seq2SeqSpec
from ...runtime.quantize import DEFAULT_GROUP_SIZE, check_scheme, quantize_entry_points
from .kv_cache import CacheLayout, adopt_parts, cache_argument, check_limits, explicit_layer_class, generation_fields


@dataclass(frozen=True)
class Source:
    """What the encoder reads: token ids and their mask ([B, S], S symbolic), or a fixed-size float array per row
    (Whisper's log-mel frames, [B, mel, frames]; a vision encoder's pixels, [B, C, H, W]): the encoder's output length is
    then the model's own, so no mask."""

    names: tuple[str, ...]
    feature_shape: tuple[int, ...] | None = None
    dtype: torch.dtype = torch.float32  # the features' (the model's)

    def example(self, batch: int, length: int) -> tuple:
        if self.feature_shape is not None:
            features = torch.randn((batch, *self.feature_shape), generator=torch.Generator().manual_seed(0))
            return (features.to(self.dtype),)
        return torch.zeros((batch, length), dtype=torch.long), torch.ones((batch, length), dtype=torch.long)

    def dynamic_shapes(self, max_batch: int, max_source_len: int, fixed: bool = False) -> tuple:
        """`fixed`: the source length is max_source_len, not a symbol (see convert_seq2seq)."""
        batch = {"name": "batch", "min": 1, "max": max_batch} if max_batch > 1 else None
        if self.feature_shape is not None:
            return (_dims(batch),)
        source = None if fixed else {"name": "source", "min": 1, "max": max_source_len}
        return (_dims(batch, source), _dims(batch, source))


def source_of(lm: torch.nn.Module) -> Source:
    """Token ids for text encoders; Whisper-style audio encoders take [mel bins, 2 x max_source_positions] frames
    (two convolutions, the second of stride 2, give max_source_positions encoder positions); a VisionEncoderDecoderModel's
    image encoder (ViT, DeiT, Swin) [channels, height, width] pixels at its config's image_size, the size its processor
    resizes to (a ViT's position table is that size's)."""
    name = getattr(lm, "main_input_name", "input_ids")
    if name == "input_ids":
        return Source(("input_ids", "attention_mask"))
    config = lm.config
    if name == "pixel_values":
        return Source(("pixel_values",), pixel_shape(lm), next(lm.parameters()).dtype)
    mel, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    if name != "input_features" or not isinstance(mel, int) or not isinstance(positions, int):
        raise ExportError(f"{type(lm).__name__} reads {name!r}: text2text-generation supports token-id encoders (T5, BART), "
                          "Whisper-style log-mel features (input_features with num_mel_bins, max_source_positions) and "
                          "image encoders' pixel_values (VisionEncoderDecoderModel)")
    return Source(("input_features",), (mel, 2 * positions), next(lm.parameters()).dtype)


def pixel_shape(lm: torch.nn.Module) -> tuple[int, int, int]:
    """[channels, height, width] of the images an image encoder was configured for (`image_size`: one side or
    [height, width], as Donut's Swin gives it)."""
    encoder = getattr(lm.config, "encoder", None) or lm.config
    size, channels = getattr(encoder, "image_size", None), getattr(encoder, "num_channels", 3)
    sides = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
    if len(sides) != 2 or not all(isinstance(side, int) and side > 0 for side in sides) or not isinstance(channels, int):
        raise ExportError(f"{type(lm).__name__}'s encoder config gives no image_size (got {size!r}): the encoder's pixels "
                          "are exported at one fixed size, set config.encoder.image_size to the processor's")
    return (channels, *sides)


@dataclass(frozen=True)
class CrossLayout:
    """The cross-attention state: per decoder layer keys and values of [batch, heads, source_len, head_dim]."""

    layers: int
    key_shapes: tuple[tuple[int, int], ...]  # per layer (heads, head_dim)
    value_shapes: tuple[tuple[int, int], ...]

    def names(self) -> list[str]:
        return [f"cross.{i}.{kind}" for i in range(self.layers) for kind in ("keys", "values")]

    def shapes(self) -> list[tuple[int, int]]:
        """(heads, head_dim) per cross tensor: keys and values of layer 0, then layer 1, ..."""
        return [shape for pair in zip(self.key_shapes, self.value_shapes) for shape in pair]


def filled_layer_class():
    from transformers.cache_utils import CacheLayerMixin

    class FilledLayer(CacheLayerMixin):
        """A cross-attention layer holding given keys/values; when empty, `update` stores what the model computes."""

        is_compileable = True
        is_sliding = False

        def __init__(self, keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
            super().__init__()
            self.keys, self.values = keys, values
            self.is_initialized = keys is not None

        def lazy_initialization(self, key_states, value_states) -> None:
            pass

        def update(self, key_states, value_states, *args, **kwargs):
            self.keys, self.values, self.is_initialized = key_states, value_states, True
            return key_states, value_states

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return (self.keys.shape[2] if self.keys is not None else query_length), 0

        def get_seq_length(self):
            return 0 if self.keys is None else self.keys.shape[2]

        def get_max_length(self) -> int:
            return -1

    return FilledLayer


def decoder_layers(lm: torch.nn.Module) -> int:
    """How many layers the decoder's cache holds: the config's count, or its decoder sub-config's (T5Gemma,
    EncoderDecoderModel: `config.decoder.num_hidden_layers`)."""
    config = lm.config
    for name in ("decoder_layers", "num_decoder_layers", "num_layers"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    decoder = getattr(config, "decoder", None)
    value = getattr(decoder, "num_hidden_layers", None) if decoder is not None else None
    if isinstance(value, int) and value > 0:
        return value
    raise ExportError(f"{type(lm).__name__}'s config names no decoder layer count (decoder_layers / num_decoder_layers)")


def start_token(lm: torch.nn.Module) -> int:
    """The decoder's first input, as transformers' generate picks it: decoder_start_token_id, else bos."""
    sources = [getattr(lm, "generation_config", None), lm.config]
    for attr in ("decoder_start_token_id", "bos_token_id"):
        for source in sources:
            value = getattr(source, attr, None) if source is not None else None
            if isinstance(value, int):
                return value
    raise ExportError(f"{type(lm).__name__} has no decoder_start_token_id or bos_token_id in its config: set "
                      "config.decoder_start_token_id to the token the decoder starts from")


def _mask(keep: torch.Tensor, additive: bool, dtype: torch.dtype) -> torch.Tensor:
    """A boolean [B, 1, T, S] mask as the attention takes it: bool for sdpa, added to the scores for eager."""
    if not additive:
        return keep
    return torch.where(keep, torch.zeros((), dtype=dtype), torch.finfo(dtype).min)


class EncodeStep(torch.nn.Module):
    """forward(source, attention_mask) -> the cross keys/values of every decoder layer; `source` is the token ids
    [B, S] (with their mask) or, for Whisper, the features [B, mel, frames] (no mask).

    Runs the model once over the decoder's start token with an empty cross cache: each decoder layer projects
    the encoder's output into its keys and values and stores them there. Only those are returned, so the
    decoder's own work on the start token is dead code that XLA drops."""

    def __init__(self, lm: torch.nn.Module, layers: int, start: int, source: Source):
        super().__init__()
        adopt_parts(self, lm)  # params keep the model's own state_dict names
        object.__setattr__(self, "lm", lm)
        self.layers, self.start, self.source = layers, start, source
        self.additive = getattr(lm.config, "_attn_implementation", None) == "eager"
        self._filled = filled_layer_class()

    def forward(self, source, attention_mask=None):
        from transformers.cache_utils import Cache, EncoderDecoderCache

        inputs = (source,) if attention_mask is None else (source, attention_mask)
        named = dict(zip(self.source.names, inputs))
        batch = source.shape[0]
        cross = [self._filled() for _ in range(self.layers)]
        cache = EncoderDecoderCache(Cache(layers=[self._filled() for _ in range(self.layers)]), Cache(layers=cross))
        start = torch.full((batch, 1), self.start, dtype=torch.long, device=source.device)
        dtype = self.lm.get_input_embeddings().weight.dtype
        self.lm(**encoded_inputs(self.lm, named), decoder_input_ids=start,
                decoder_attention_mask=_mask(torch.ones((batch, 1, 1, 1), dtype=torch.bool), self.additive, dtype),
                **cache_argument(self.lm, cache), use_cache=True)
        if any(layer.keys is None for layer in cross):
            raise ExportError(f"{type(self.lm).__name__} did not fill its cross-attention cache: only encoder-decoders "
                              "whose decoder layers cache the encoder's keys/values (T5, BART, Whisper, TrOCR) are "
                              "supported")
        return [t for layer in cross for t in (layer.keys, layer.values)]


class Seq2SeqDecodeStep(torch.nn.Module):
    """forward(input_ids [B, 1], write_at [1], kv_valid [B, L], source_mask [B, S], cache, cross) -> (logits, cache)."""

    def __init__(self, lm: torch.nn.Module, layout: CacheLayout, hidden: int, encoder_output: type):
        super().__init__()
        adopt_parts(self, lm)  # params keep the model's own state_dict names
        object.__setattr__(self, "lm", lm)
        self.layout, self.hidden = layout, hidden
        # the class of the encoder's output, which the model reads by index or by name (NLLB-MoE's last_hidden_state,
        # Switch Transformers' router_logits): the zeros standing for it here are given in it
        object.__setattr__(self, "_encoder_output", encoder_output)
        self.additive = getattr(lm.config, "_attn_implementation", None) == "eager"
        self.window = sliding_window(lm)
        self._layer, self._filled = explicit_layer_class(), filled_layer_class()
        from ..stand_ins import positions

        self._positions = positions
        # decoders that count positions from the cache's length (BART and kin; MVP's own count does not trace): given
        # the slots (the encoder's tables are not run here: its output is given)
        object.__setattr__(self, "_counted_from_cache", positions.counted_from_cache(lm))
        self.routes_decoder_keywords = routes_decoder_positions(lm)

    def forward(self, input_ids, write_at, kv_valid, source_mask, cache, cross):
        from transformers.cache_utils import Cache, EncoderDecoderCache

        span = kv_valid.shape[1]
        layers = [self._layer(cache[2 * i], cache[2 * i + 1], write_at, span) for i in range(self.layout.layers)]
        filled = [self._filled(cross[2 * i], cross[2 * i + 1]) for i in range(self.layout.layers)]
        state = EncoderDecoderCache(Cache(layers=layers), Cache(layers=filled))
        state.is_updated = dict.fromkeys(range(self.layout.layers), True)  # read the given cross keys/values
        slot = torch.arange(span, device=kv_valid.device)[None, :]
        at = write_at[0]
        keep_self = (kv_valid & (slot <= at)) | (slot == at)
        dtype = self.layout.dtype
        self_mask = _mask(keep_self[:, None, None, :], self.additive, dtype)
        if self.window is not None:  # the model takes one mask per layer type: its sliding layers' keeps the window
            in_window = (kv_valid & (slot <= at) & (slot > at - self.window)) | (slot == at)
            self_mask = {FULL: self_mask, SLIDING: _mask(in_window[:, None, None, :], self.additive, dtype)}
        batch, source = source_mask.shape
        # the encoder's output is not read (the cross keys/values replace its projections); transformers uses it
        # for the cross mask's shape and to tell cross from self attention
        hidden = torch.zeros((batch, source, self.hidden), dtype=dtype, device=source_mask.device)
        # EncoderDecoderModel and VisionEncoderDecoderModel hand decoder_* keywords to their decoder (BERT-like or GPT-2,
        # whose own positions slice a table at the cache's length): its positions are the slots too
        routed = {"decoder_position_ids": write_at[None].expand(batch, -1)} if self.routes_decoder_keywords else {}
        with self._positions.columns_given(self._counted_from_cache, write_at):  # no padding before the start token
            out = self.lm(
                **routed,
                encoder_outputs=self._encoder_output(last_hidden_state=hidden),
                attention_mask=_mask(source_mask[:, None, None, :], self.additive, dtype),
                decoder_input_ids=input_ids,
                decoder_attention_mask=self_mask,
                **cache_argument(self.lm, state),
                use_cache=True,
            )
        logits = out.logits[:, -1].float()
        return logits, [t for layer in layers for t in (layer.keys, layer.values)]


FULL, SLIDING = "full_attention", "sliding_attention"
_ROUTING_DECODER_KEYWORDS = ("EncoderDecoderModel", "VisionEncoderDecoderModel")


def routes_decoder_positions(lm: torch.nn.Module) -> bool:
    """Whether the model hands `decoder_position_ids` to a decoder that reads position_ids (a TrOCR decoder reads
    none: its tables count from the cache, which hf/stand_ins/positions.py answers)."""
    import inspect

    if type(lm).__name__ not in _ROUTING_DECODER_KEYWORDS:
        return False
    decoder = getattr(lm, "decoder", None)
    return decoder is None or "position_ids" in inspect.signature(decoder.forward).parameters


def sliding_window(lm: torch.nn.Module) -> int | None:
    """The decoder's sliding window where some of its layers attend over one (T5Gemma's, named in its decoder
    sub-config's layer_types), else None. Such a decoder builds one self-attention mask per layer type unless it is
    given them as a dict; a single 4-d mask would reach the sliding layers as it is, without the window."""
    config = lm.config.get_text_config(decoder=True)
    window = getattr(config, "sliding_window", None)
    if SLIDING not in (getattr(config, "layer_types", None) or ()) or not isinstance(window, int):
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return window


def encoded_inputs(lm: torch.nn.Module, source: dict) -> dict:
    """The model's arguments for `source` (input_ids and attention_mask, or input_features) with the encoder already
    run, as transformers' generate calls it: a model's forward may hand its own arguments (use_cache) to an encoder
    that refuses them (Switch Transformers)."""
    mask = {"attention_mask": source["attention_mask"]} if "attention_mask" in source else {}
    return {"encoder_outputs": lm.get_encoder()(**source), **mask}


def cross_layout(step: EncodeStep) -> tuple[CrossLayout, int]:
    """Measure the cross state (and the encoder's output length, fixed for features): encode run once in torch."""
    with torch.no_grad():
        cross = step(*step.source.example(1, 3))
    keys, values = cross[0::2], cross[1::2]
    layout = CrossLayout(layers=len(keys), key_shapes=tuple((k.shape[1], k.shape[3]) for k in keys),
                         value_shapes=tuple((v.shape[1], v.shape[3]) for v in values))
    return layout, int(keys[0].shape[2])


def self_layout(lm: torch.nn.Module, source: Source, layers: int, max_cache_len: int) -> tuple[CacheLayout, type, int]:
    """The decoder's self-attention cache: the start token through a DynamicCache, read back per layer; the class
    of the encoder's output and its width (a VisionEncoderDecoderModel projects an encoder's output of another width
    than its decoder's before the decoder reads it)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    cache = EncoderDecoderCache(DynamicCache(config=lm.config), DynamicCache(config=lm.config))
    ids = torch.zeros((1, 1), dtype=torch.long)
    with torch.no_grad():
        inputs = encoded_inputs(lm, dict(zip(source.names, source.example(1, 3))))
        lm(**inputs, decoder_input_ids=ids, **cache_argument(lm, cache), use_cache=True)
    found = cache.self_attention_cache.layers
    if len(found) != layers or any(layer.keys is None for layer in found):
        raise ExportError(f"{type(lm).__name__} did not fill a self-attention cache for its {layers} decoder layers")
    layout = CacheLayout(
        layers=layers,
        key_shapes=tuple((layer.keys.shape[1], layer.keys.shape[3]) for layer in found),
        value_shapes=tuple((layer.values.shape[1], layer.values.shape[3]) for layer in found),
        dtype=found[0].keys.dtype,
        max_cache_len=max_cache_len,
    )
    encoder_output = type(inputs["encoder_outputs"])
    if isinstance(inputs["encoder_outputs"], tuple):  # an encoder returning a plain tuple: its output given as one
        encoder_output = lambda last_hidden_state: (last_hidden_state,)  # noqa: E731
    return layout, encoder_output, int(inputs["encoder_outputs"][0].shape[-1])


def _dims(*axes: Any) -> dict | None:
    """The symbolic axes only (a None dim is deprecated in torch.export)."""
    return {axis: d for axis, d in enumerate(axes) if d is not None} or None


def decode_inputs(layout: CacheLayout, cross: CrossLayout, batch: int, source: int) -> tuple:
    """Inputs of the decode step's shapes: a token at slot 1 over a span neither 1 nor the whole cache."""
    span = max(2, layout.max_cache_len // 2)
    return (
        torch.zeros((batch, 1), dtype=torch.long),
        torch.ones((1,), dtype=torch.long),
        torch.ones((batch, span), dtype=torch.bool),
        torch.ones((batch, source), dtype=torch.bool),
        layout.zeros(batch),
        [torch.zeros((batch, h, source, d), dtype=layout.dtype) for h, d in cross.shapes()],
    )


def decode_dynamic_shapes(layout: CacheLayout, max_batch: int, max_source_len: int, fixed: bool = False) -> tuple:
    batch = {"name": "batch", "min": 1, "max": max_batch} if max_batch > 1 else None
    span = {"name": "span", "min": 1, "max": layout.max_cache_len}
    source = None if fixed else {"name": "source", "min": 1, "max": max_source_len}
    return (_dims(batch), None, _dims(batch, span), _dims(batch, source), [_dims(batch)] * (2 * layout.layers),
            [_dims(batch, None, source)] * (2 * layout.layers))


def convert_seq2seq(lm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, max_source_len: int = 512,
                    dtype: Any = None, progress: Any = None, quantize: str | None = None,
                    group_size: int = DEFAULT_GROUP_SIZE, weights: Any = None) -> Seq2SeqGenerator:
    """A transformers encoder-decoder -> a `Seq2SeqGenerator` (torch-free encode/decode over one params tree).
    `quantize` ("int8", "int4" with `group_size`, "int8-dynamic"): the matmul weights of both, the encoder's
    projections and the decoder's (and its LM head, unless tied to the embedding), stored quantized. `weights`: a
    model built with fake params reads its params from these safetensors files when it is saved (hf/streamed.py)."""
    check_limits(max_cache_len, max_batch)
    if quantize is not None:
        check_scheme(quantize, group_size)
    if not isinstance(max_source_len, int) or max_source_len < 2:
        raise InputSpecError(f"max_source_len must be an integer >= 2 (got {max_source_len!r})")
    if not getattr(lm.config, "is_encoder_decoder", False):
        raise InputSpecError(f"{type(lm).__name__} is not an encoder-decoder: convert it with --task text-generation")
    lm = lm.eval()
    if dtype is not None:
        lm = cast_module(lm, dtype, weights)
    from ..stand_ins import refused  # imported here: the stand-ins import this package's kv_cache

    refused.refuse_seq2seq(lm)
    source = source_of(lm)
    check_positions(lm.config, max_cache_len, max_source_len, fixed_source=source.feature_shape is not None)
    layers = decoder_layers(lm)
    start = start_token(lm)
    encode_step = EncodeStep(lm, layers, start, source).eval()
    cross, encoded_len = cross_layout(encode_step)
    if source.feature_shape is not None:
        max_source_len = encoded_len  # the encoder's output length is fixed by the model, not a limit to choose
    layout, encoder_output, hidden = self_layout(lm, source, layers, max_cache_len)
    decode_step = Seq2SeqDecodeStep(lm, layout, hidden, encoder_output).eval()
    batch, length = min(max_batch, 2), min(max_source_len, 5)  # not 1: torch.export would specialize a dim of 1
    fixed = False
    try:
        encode = convert(encode_step, source.example(batch, length), dynamic_shapes=source.dynamic_shapes(max_batch, max_source_len),
                         progress=progress, weights=weights)
    except ExportError:
        if source.feature_shape is not None:
            raise
        # encoders that pad the source to a multiple of their attention block (LongT5, PEGASUS-X) branch on its
        # length, which torch.export cannot keep symbolic: export both steps at max_source_len instead; generate pads
        # every source to it (masked, so the real tokens' outputs are the same)
        fixed, length = True, max_source_len
        encode = convert(encode_step, source.example(batch, length), progress=progress, weights=weights,
                         dynamic_shapes=source.dynamic_shapes(max_batch, max_source_len, fixed=True))
    decode_args = decode_inputs(layout, cross, batch, length)
    decode_dims = decode_dynamic_shapes(layout, max_batch, max_source_len, fixed)
    try:
        decode = convert(decode_step, decode_args, dynamic_shapes=decode_dims, progress=progress, weights=weights)
    except ExportError as err:
        if "Constraints violated" not in str(err):
            raise
        # T5Gemma 2's merged attention concatenates the cached span with the source, and transformers' repeat_kv
        # reshapes that sum after an expand: torch.export then asks a contiguity guard (Min(a, 2a) == a) it cannot
        # prove over the symbolic span. SDPA's own grouped-query heads (enable_gqa) read the keys as they are.
        with sdpa_grouped_heads():
            decode = convert(decode_step, decode_args, dynamic_shapes=decode_dims, progress=progress, weights=weights)
    _share_params(encode, decode)
    encode.sharding_hints = decode.sharding_hints = tp_plan_hints(lm)
    if quantize is not None:
        with StageTimer(progress).stage("quantize", f"quantize the encoder's and decoder's matmul weights to {quantize}"):
            encode, decode = quantize_entry_points([encode, decode], quantize, group_size)
    generation = getattr(lm, "generation_config", None)
    spec = Seq2SeqSpec(
        **generation_fields(lm, layout, max_batch),
        max_source_len=max_source_len,
        decoder_start_token_id=start,
        cross_shapes=tuple(cross.shapes()),
        forced_bos_token_id=_token(generation, "forced_bos_token_id"),
        forced_eos_token_id=_token(generation, "forced_eos_token_id"),
        source_input=source.names[0],
        feature_shape=source.feature_shape,
        fixed_source=fixed,
    )
    return Seq2SeqGenerator(encode, decode, spec)


@contextmanager
def sdpa_grouped_heads() -> Iterator[None]:
    """transformers' SDPA attention passes grouped key/value heads to torch's SDPA (enable_gqa) instead of repeating
    them (its TRANSFORMERS_SDPA_FORCE_GQA switch, read at each call), within this block."""
    before = os.environ.get(_FORCE_GQA)
    os.environ[_FORCE_GQA] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[_FORCE_GQA]
        else:
            os.environ[_FORCE_GQA] = before


_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


def check_positions(config: Any, max_cache_len: int, max_source_len: int, fixed_source: bool = False) -> None:
    """Learned position tables bound the decoder's length and the source's (T5's relative positions bound neither);
    beyond them a position would index past the table, so refuse before exporting. A VisionEncoderDecoderModel's
    decoder table is its decoder sub-config's; `fixed_source`: features or pixels, whose length is the model's own."""
    shared = getattr(config, "max_position_embeddings", None)
    decoder = getattr(config, "decoder", None) if type(config).__name__ == "VisionEncoderDecoderConfig" else None
    decoder_limit = getattr(decoder, "max_position_embeddings", None) if decoder is not None else None
    for what, value, flag, limit in (
        ("max_cache_len", max_cache_len, "--max-cache-len",
         getattr(config, "max_target_positions", None) or shared or decoder_limit),
        ("max_source_len", max_source_len, "--max-source-len", getattr(config, "max_source_positions", None) or shared),
    ):
        if what == "max_source_len" and (fixed_source or getattr(config, "num_mel_bins", None)):
            continue
        if isinstance(limit, int) and value > limit:
            raise InputSpecError(f"{what}={value} is more than the model's {limit} learned positions: pass {flag} {limit} or less")


def _share_params(encode: Any, decode: Any) -> None:
    """One params dict, one copy of the weights, for both entry points. Both steps register every child of the
    model, so torch.export lifts the same params for each (encode does not read the decoder's self-attention,
    decode not the encoder: those are unused inputs of that function). Constants that torch.export lifts from the
    model's code (`torch.tensor(...)` in a forward: T5Gemma's embedding normalizer) are numbered per trace, so each
    step keeps its own, and the shared dict holds both steps' (under another name where the two differ)."""
    constants = {inp.target for model in (encode, decode) for inp in model.graph.inputs if inp.kind == "constant"}
    weights = [set(model.params) - constants for model in (encode, decode)]
    if weights[0] != weights[1]:
        missing = sorted(weights[0] ^ weights[1])
        raise ExportError(f"the encode and decode steps hold different params ({missing[:5]}...); they must share one tree")
    for inp in decode.graph.inputs:
        if inp.kind != "constant" or inp.target not in encode.params:
            continue
        mine, theirs = decode.params[inp.target], encode.params[inp.target]
        if mine.shape == theirs.shape and mine.dtype == theirs.dtype and bool(np.array_equal(mine, theirs)):
            continue
        renamed = f"{inp.target}.decode"
        decode.params = {**{k: v for k, v in decode.params.items() if k != inp.target}, renamed: mine}
        inp.target = renamed
    shared = {**encode.params, **{k: v for k, v in decode.params.items() if k not in encode.params}}
    encode.params = decode.params = shared


def _token(config: Any, name: str) -> int | None:
    value = getattr(config, name, None) if config is not None else None
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) else None
