"""A causal language model as one step over an explicit KV cache, traced once and served as two entry points:
prefill (any number of tokens) and decode (one token per row, the same graph with that dim pinned to 1).

The step takes the cache as inputs and returns the updated cache as outputs, so the cache is state
that the caller owns and donates (never a buffer, never saved as weights). Its attention mask is
built here from two things the caller tracks, so left-padded batches are right by construction:

    input_ids     [B, T]    tokens to run (T symbolic for prefill, 1 for decode)
    position_ids  [B, T]    each row's own positions (a left-padded row starts later)
    write_at      [B, T]    the cache slots each row's T tokens are written to (rows apart: a server's rows each
                            hold their own tokens from slot 0); artifacts converted before this took [T], shared by
                            all rows, and the step still runs either (example_step_inputs' `rows_apart`)
    kv_valid      [B, L]    which of the first L cache slots hold real tokens, the T new ones included
    cache         2 x layers tensors [B, kv_heads, S + 1, head_dim]: keys, values of layer 0, 1, ... (3 x layers
                  where the model's sparse attention caches indexer keys, [B, 1, S + 1, index_dim] after each
                  layer's values: hf/steps/kv_cache.py)

and it returns the last position's logits [B, V] (float32) and the cache. Attention reads only the
first L slots (L symbolic, at most S): the caller passes the span its tokens need, so a step costs
O(tokens so far) rather than O(max_cache_len). A query may attend to slot j
when j holds a real token, j <= its own slot (causal) and, for sliding-window layers, j is within the
window; it always attends to its own slot, so a pad row never has every key masked (no NaN).
Decoders that count positions from the cache's length rather than taking `position_ids` (BART and kin) are given
each query's column in the batch instead (hf/stand_ins/positions.py), so the length bucket's padding is not counted.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...capture.converter import StageTimer, cast_module, model_from, tp_plan_hints, trace
from ...capture.fx import Captured, treespec_to_json
from ...generate.generator import GenerationSpec, Generator
from ...ir.graph import Graph
from ...runtime.model import Model
from ...runtime.quantize import DEFAULT_GROUP_SIZE, check_scheme, quantize_model
from . import layer_repeat
from .kv_cache import (
    CacheLayout,
    adopt_parts,
    cache_argument,
    cache_layout,
    check_head,
    check_limits,
    cut_layout,
    explicit_layer_class,
    generation_fields,
    query_slots,
    step_layers,
)

FULL, SLIDING = "full_attention", "sliding_attention"


class DecoderStep(torch.nn.Module):
    """forward(input_ids, position_ids, write_at, kv_valid, cache) -> (last logits [B, V] float32, new cache).

    `cache` is a list: keys and values (and indexer keys, where the model has them) of layer 0, then layer 1, ...
    """

    def __init__(self, lm: torch.nn.Module, layout: CacheLayout, owner: torch.nn.Module | None = None):
        """`owner`: the model whose parts (and so state_dict names) the step takes when `lm` is a part of it (BLIP-2's
        language_model, a whole causal LM the step calls)."""
        super().__init__()
        # the LM's parts registered here directly: params keep the LM's own state_dict names
        adopt_parts(self, lm if owner is None else owner)
        object.__setattr__(self, "lm", lm)  # called, not registered (it would prefix every name with "lm.")
        self.layout = layout
        config = lm.config.get_text_config()  # a vision-language model's language part (the config itself for an LM)
        self.layer_types = sorted(set(getattr(config, "layer_types", None) or ())) or None
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", True) is False:
            window = None
        self.window = int(window) if window else None
        self.additive_mask = getattr(config, "_attn_implementation", None) == "eager" or \
            getattr(lm.config, "_attn_implementation", None) == "eager"
        self._layer = explicit_layer_class()
        from ..stand_ins import positions  # imported here: the stand-ins import this package's kv_cache

        self._positions = positions
        # decoders that count positions from the cache's length (BART and kin): given each query's batch column
        object.__setattr__(self, "_counted_from_cache", positions.counted_from_cache(lm))

    def forward(self, input_ids, position_ids, write_at, kv_valid, cache):
        return self.step({"input_ids": input_ids}, position_ids, write_at, kv_valid, cache)

    def step(self, tokens: dict, position_ids, write_at, kv_valid, cache, also=None):
        """The step over `tokens` ({"input_ids": ...} or {"inputs_embeds": ...}); `also` [B, T, L] marks further keys
        each query may attend to besides the causal ones (a vision-language model's bidirectional image blocks)."""
        from transformers.cache_utils import Cache

        span = kv_valid.shape[1]
        layers = step_layers(self._layer, self.layout, cache, write_at, span)
        columns = self._positions.batch_columns(position_ids, write_at) if self._counted_from_cache else None
        # transformers' cache_position is [T]: a row-apart step gives row 0's slots (the masks and positions, given
        # here, are what models read it for)
        shared = write_at if write_at.dim() == 1 else write_at[0]
        with self._positions.columns_given(self._counted_from_cache, columns):
            out = self.lm(
                **tokens,
                position_ids=position_ids,
                attention_mask=self._masks(write_at, kv_valid, also),
                **cache_argument(self.lm, Cache(layers=layers)),
                cache_position=shared,
                use_cache=True,
                logits_to_keep=1,
            )
        logits = out.logits[:, -1].float()
        return logits, [t for layer in layers for t in layer.tensors()]

    def _masks(self, write_at: torch.Tensor, kv_valid: torch.Tensor, also: torch.Tensor | None = None) -> Any:
        slot = torch.arange(kv_valid.shape[1], device=kv_valid.device)
        at = query_slots(write_at)[:, :, None]  # [B or 1, T, 1]: each query's slot
        causal = slot <= at  # [B or 1, T, S]
        if also is not None:
            causal = causal | also  # [B, T, S]
        own = slot == at

        def mask(window: int | None) -> torch.Tensor:
            allowed = causal if window is None else causal & (slot > at - window)
            keep = ((kv_valid[:, None, :] & allowed) | own)[:, None]  # [B, 1, T, S]
            if self.additive_mask:  # eager attention adds the mask to the scores
                zero = torch.zeros((), dtype=self.layout.dtype)
                return torch.where(keep, zero, torch.finfo(self.layout.dtype).min)
            return keep

        if self.layer_types:  # models that take one mask per layer type (Gemma2, Qwen2, ...)
            return {kind: mask(self.window if kind == SLIDING else None) for kind in self.layer_types}
        return mask(self.window)


def example_step_inputs(layout: CacheLayout, batch: int, tokens: int, rows_apart: bool = True) -> tuple:
    """Inputs of the step's shapes (what torch.export traces with): a prompt written from slot 0, attending to
    a span of the cache that is neither 1 nor the whole cache (torch.export would specialize either). `rows_apart`:
    `write_at` [B, T], each row's own slots, else [T] shared by every row."""
    span = max(tokens + 1, layout.max_cache_len // 2)
    positions = torch.arange(tokens).expand(batch, tokens).clone()
    return (
        torch.zeros((batch, tokens), dtype=torch.long),
        positions,
        positions.clone() if rows_apart else torch.arange(tokens),
        torch.ones((batch, span), dtype=torch.bool),
        layout.zeros(batch),
    )


def step_dynamic_shapes(layout: CacheLayout, max_batch: int, rows_apart: bool = True) -> tuple:
    """batch symbolic (1..max_batch) everywhere; the token count symbolic (1..max_cache_len). `rows_apart` as in
    example_step_inputs."""
    batch = {"name": "batch", "min": 1, "max": max_batch} if max_batch > 1 else None  # max_batch 1: batch is static 1
    tokens = {"name": "tokens", "min": 1, "max": layout.max_cache_len}

    def dims(*axes: Any) -> dict | None:  # the symbolic axes only (a None dim is deprecated in torch.export)
        return {axis: d for axis, d in enumerate(axes) if d is not None} or None

    span = {"name": "span", "min": 1, "max": layout.max_cache_len}  # the attended prefix of the cache
    row = dims(batch, tokens)
    return (row, row, row if rows_apart else dims(tokens), dims(batch, span),
            [dims(batch)] * (layout.per_layer * layout.layers))


def convert_causal_lm(lm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None, progress: Any = None,
                      weights: Any = None, repeat_layers: bool | int = True, quantize: str | None = None,
                      group_size: int = DEFAULT_GROUP_SIZE) -> Generator:
    """A transformers causal LM -> a `Generator` (torch-free prefill/decode over one params tree).

    `weights` (a capture.weight_source.WeightSource) streams the params of an LM built with fake parameters.
    `repeat_layers`: True traces a stack of REPEAT_FROM_UNITS alike units or more at 3 and 4 units and repeats the
    middle one (capture_step); an int sets that many units instead; False traces every layer.
    `quantize` ("int8", "int4" with `group_size`, "int8-dynamic") stores the matmul weights quantized (runtime/quantize.py)."""
    check_limits(max_cache_len, max_batch)
    if quantize is not None:
        check_scheme(quantize, group_size)
    check_head(lm)
    lm = lm.eval()
    if dtype is not None:
        lm = cast_module(lm, dtype, weights)
    layout = cache_layout(lm, max_cache_len)
    timer = StageTimer(progress)
    prefill = model_from(capture_step(lm, layout, max_batch, timer, repeat=repeat_layers), timer, weights)
    if quantize is not None:
        with timer.stage("quantize", f"quantize the matmul weights to {quantize}"):
            prefill = quantize_model(prefill, quantize, group_size)
    # decode is the same traced step with one token per row: torch.export runs once, not twice (it is most of a
    # conversion's time, and grows with the number of layers); the pinned size is exported as a constant
    decode = Model(prefill._run, prefill.params, prefill.graph.with_fixed_dims({"tokens": 1}))
    decode.quantization = prefill.quantization
    prefill.sharding_hints = decode.sharding_hints = tp_plan_hints(lm)  # the step module has no config of its own
    return Generator(prefill, decode, GenerationSpec(**generation_fields(lm, layout, max_batch)))


# Tracing 3 and 4 units costs 7 units' traces plus two traces' fixed cost: measured even with tracing every layer at
# about 9 layers (0.8 s a layer, 1.3 s a trace), so shallower stacks are traced whole.
REPEAT_FROM_UNITS = 10
SLICE_UNITS = 5  # the shallowest stack whose repetition makes copies (first, three middles, last): verification slices


def capture_step(lm: torch.nn.Module, layout: CacheLayout, max_batch: int, timer: StageTimer,
                 repeat: bool | int = True) -> Captured:
    """The step's portable graph. torch.export's time grows with every layer it traces, so with `repeat` a deep
    stack of alike layers (or of alike blocks, where layer kinds alternate) is traced at 3 and 4 units and the
    middle unit's graph repeated for the rest (hf/steps/layer_repeat.py); where that cannot be shown right, every layer
    is traced and the progress line says why. `repeat` as in convert_causal_lm."""
    what = ""
    min_units = REPEAT_FROM_UNITS if repeat is True else int(repeat)
    if repeat is not False and min_units and layout.layers >= min_units:
        def trace_layers(layers: int, what: str) -> tuple:
            return _trace_step(lm, cut_layout(layout, layers), max_batch, timer, what)

        def state() -> dict:
            step = DecoderStep(lm, layout)
            return {**dict(step.named_parameters(remove_duplicate=False)), **dict(step.named_buffers(remove_duplicate=False))}

        caches = [(layout.key_shapes[i], layout.value_shapes[i], layout.indexer_dims[i:i + 1])
                  for i in range(layout.layers)]
        try:
            return layer_repeat.capture_repeated(lm, layout.layers, min_units, timer, trace=trace_layers,
                                                 with_specs=_with_specs(layout.per_layer), layer_state=caches,
                                                 state=state, user_inputs=CacheInputs(layout.per_layer))
        except layer_repeat.NotRepeatable as why:
            what = f" of all {layout.layers} layers ({why})"
    return _trace_step(lm, layout, max_batch, timer, what)[0]


def _trace_step(lm: torch.nn.Module, layout: CacheLayout, max_batch: int, timer: StageTimer, what: str) -> tuple:
    """(Captured, ExportedProgram) of the step over `layout`'s layers."""
    batch = min(max_batch, 2)  # traced at 2 where the batch is symbolic: torch.export specializes a dim of 1
    return trace(DecoderStep(lm, layout).eval(), example_step_inputs(layout, batch, 3), None,
                 step_dynamic_shapes(layout, max_batch), timer, what=what)


def repeat_slice(lm: torch.nn.Module) -> int | None:
    """The depth of a verification slice that converts by repetition as the whole of `lm` does (SLICE_UNITS units,
    with repeat_layers=SLICE_UNITS), or None where `lm`'s layers are traced one by one."""
    layers = getattr(lm.config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers < REPEAT_FROM_UNITS:
        return None
    try:
        return SLICE_UNITS * layer_repeat.repeat_unit(lm, layers, REPEAT_FROM_UNITS)[1]
    except layer_repeat.NotRepeatable:
        return None


def _with_specs(per_layer: int = 2) -> Any:
    """with_specs(graph, layers): the step's input and output structure for `layers` layers of `per_layer` cache
    tensors each (what torch.export would record for that many)."""

    def with_specs(graph: Graph, layers: int) -> Graph:
        cache = [0] * (per_layer * layers)
        graph.in_spec = treespec_to_json(pytree.tree_flatten(((0, 0, 0, 0, cache), {}))[1])
        graph.out_spec = treespec_to_json(pytree.tree_flatten((0, cache))[1])
        return graph

    return with_specs


class CacheInputs:
    """The step's own inputs that belong to a layer: with `per_layer` tensors a layer, `cache_{n i}` (keys),
    `cache_{n i + 1}` (values) and, with an indexer, `cache_{n i + 2}` (its keys) are layer i's."""

    def __init__(self, per_layer: int = 2):
        self.per_layer = per_layer

    def layer(self, input_name: str) -> int | None:
        match = re.fullmatch(r"cache_(\d+)", input_name)
        return int(match.group(1)) // self.per_layer if match else None

    def renamed(self, input_name: str, shift: int) -> str:
        """The name of the same cache input `shift` layers later."""
        return f"cache_{int(input_name.removeprefix('cache_')) + self.per_layer * shift}"
