"""A causal language model as one step over an explicit KV cache, traced once and served as two entry points:
prefill (any number of tokens) and decode (one token per row, the same graph with that dim pinned to 1).

The step takes the cache as inputs and returns the updated cache as outputs, so the cache is state
that the caller owns and donates (never a buffer, never saved as weights). Its attention mask is
built here from two things the caller tracks, so left-padded batches are right by construction:

    input_ids     [B, T]    tokens to run (T symbolic for prefill, 1 for decode)
    position_ids  [B, T]    each row's own positions (a left-padded row starts later)
    write_at      [T]       the cache slots the T tokens are written to (shared by all rows)
    kv_valid      [B, L]    which of the first L cache slots hold real tokens, the T new ones included
    cache         2 x layers tensors [B, kv_heads, S + 1, head_dim]: keys, values of layer 0, 1, ...

and it returns the last position's logits [B, V] (float32) and the cache. Attention reads only the
first L slots (L symbolic, at most S): the caller passes the span its tokens need, so a step costs
O(tokens so far) rather than O(max_cache_len). A query may attend to slot j
when j holds a real token, j <= its own slot (causal) and, for sliding-window layers, j is within the
window; it always attends to its own slot, so a pad row never has every key masked (no NaN).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ExportError, InputSpecError

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class CacheLayout:
    """What the cache looks like: per layer keys and values of [batch, heads, max_cache_len + 1, head_dim]."""

    layers: int
    key_shapes: tuple[tuple[int, int], ...]  # per layer (kv_heads, head_dim) of keys
    value_shapes: tuple[tuple[int, int], ...]
    dtype: torch.dtype
    max_cache_len: int

    def names(self) -> list[str]:
        return [f"cache.{i}.{kind}" for i in range(self.layers) for kind in ("keys", "values")]

    @property
    def slots(self) -> int:
        """max_cache_len + 1: one spare slot, never written, so that the attended span (at most max_cache_len)
        is always a strict prefix; torch.export refuses a slice with a symbolic end that may be the whole dim."""
        return self.max_cache_len + 1

    def shapes(self, batch: int) -> list[tuple[int, ...]]:
        out = []
        for (kh, kd), (vh, vd) in zip(self.key_shapes, self.value_shapes):
            out += [(batch, kh, self.slots, kd), (batch, vh, self.slots, vd)]
        return out

    def zeros(self, batch: int) -> list[torch.Tensor]:
        return [torch.zeros(shape, dtype=self.dtype) for shape in self.shapes(batch)]


def cache_layout(lm: torch.nn.Module, max_cache_len: int) -> CacheLayout:
    """Measure the cache the model writes: one token through a dynamic cache, read back per layer."""
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.config)
    with torch.no_grad():
        lm(input_ids=torch.zeros((1, 1), dtype=torch.long), past_key_values=cache, use_cache=True)
    keys = [layer.keys for layer in cache.layers]
    values = [layer.values for layer in cache.layers]
    if not keys or any(k is None for k in keys):
        raise ExportError(f"{type(lm).__name__} did not fill a key/value cache; only attention-cache decoders are supported")
    return CacheLayout(
        layers=len(keys),
        key_shapes=tuple((k.shape[1], k.shape[3]) for k in keys),
        value_shapes=tuple((v.shape[1], v.shape[3]) for v in values),
        dtype=keys[0].dtype,
        max_cache_len=max_cache_len,
    )


def explicit_layer_class():
    from transformers.cache_utils import CacheLayerMixin

    class ExplicitLayer(CacheLayerMixin):
        """One layer's keys and values given as tensors and updated out of place at `write_at`."""

        is_compileable = True
        is_sliding = False

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, write_at: torch.Tensor, span: int):
            super().__init__()
            self.keys, self.values, self.write_at, self.span = keys, values, write_at, span
            self.max_cache_len = keys.shape[2]
            self.is_initialized = True

        def lazy_initialization(self, key_states, value_states) -> None:
            pass

        def update(self, key_states, value_states, *args, **kwargs):
            """Write the new keys/values into the whole cache; attention gets the first `span` slots."""
            self.keys = self.keys.index_copy(2, self.write_at, key_states.to(self.keys.dtype))
            self.values = self.values.index_copy(2, self.write_at, value_states.to(self.values.dtype))
            return self.keys[:, :, : self.span], self.values[:, :, : self.span]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.span, 0

        def get_seq_length(self):
            return self.write_at[0]

        def get_max_length(self) -> int:
            return self.max_cache_len

    return ExplicitLayer


class DecoderStep(torch.nn.Module):
    """forward(input_ids, position_ids, write_at, kv_valid, cache) -> (last logits [B, V] float32, new cache).

    `cache` is a list: keys and values of layer 0, then layer 1, ...
    """

    def __init__(self, lm: torch.nn.Module, layout: CacheLayout):
        super().__init__()
        # the LM's children registered here directly, so params keep the LM's own state_dict names
        for name, child in lm.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "lm", lm)  # called, not registered (it would prefix every name with "lm.")
        self.layout = layout
        config = lm.config
        self.layer_types = sorted(set(getattr(config, "layer_types", None) or ())) or None
        window = getattr(config, "sliding_window", None)
        if getattr(config, "use_sliding_window", True) is False:
            window = None
        self.window = int(window) if window else None
        self.additive_mask = getattr(config, "_attn_implementation", None) == "eager"
        self._layer = explicit_layer_class()

    def forward(self, input_ids, position_ids, write_at, kv_valid, cache):
        from transformers.cache_utils import Cache

        span = kv_valid.shape[1]
        layers = [self._layer(cache[2 * i], cache[2 * i + 1], write_at, span) for i in range(self.layout.layers)]
        out = self.lm(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=self._masks(write_at, kv_valid),
            past_key_values=Cache(layers=layers),
            cache_position=write_at,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1].float()
        return logits, [t for layer in layers for t in (layer.keys, layer.values)]

    def _masks(self, write_at: torch.Tensor, kv_valid: torch.Tensor) -> Any:
        slot = torch.arange(kv_valid.shape[1], device=kv_valid.device)
        causal = slot[None, :] <= write_at[:, None]  # [T, S]
        own = slot[None, :] == write_at[:, None]

        def mask(window: int | None) -> torch.Tensor:
            allowed = causal if window is None else causal & (slot[None, :] > write_at[:, None] - window)
            keep = ((kv_valid[:, None, :] & allowed[None]) | own[None])[:, None]  # [B, 1, T, S]
            if self.additive_mask:  # eager attention adds the mask to the scores
                zero = torch.zeros((), dtype=self.layout.dtype)
                return torch.where(keep, zero, torch.finfo(self.layout.dtype).min)
            return keep

        if self.layer_types:  # models that take one mask per layer type (Gemma2, Qwen2, ...)
            return {kind: mask(self.window if kind == SLIDING else None) for kind in self.layer_types}
        return mask(self.window)


def example_step_inputs(layout: CacheLayout, batch: int, tokens: int) -> tuple:
    """Inputs of the step's shapes (what torch.export traces with): a prompt written from slot 0, attending to
    a span of the cache that is neither 1 nor the whole cache (torch.export would specialize either)."""
    span = max(tokens + 1, layout.max_cache_len // 2)
    return (
        torch.zeros((batch, tokens), dtype=torch.long),
        torch.arange(tokens).expand(batch, tokens).clone(),
        torch.arange(tokens),
        torch.ones((batch, span), dtype=torch.bool),
        layout.zeros(batch),
    )


def step_dynamic_shapes(layout: CacheLayout, max_batch: int) -> tuple:
    """batch symbolic (1..max_batch) everywhere; the token count symbolic (1..max_cache_len)."""
    batch = {"name": "batch", "min": 1, "max": max_batch} if max_batch > 1 else None  # max_batch 1: batch is static 1
    tokens = {"name": "tokens", "min": 1, "max": layout.max_cache_len}

    def dims(*axes: Any) -> dict | None:  # the symbolic axes only (a None dim is deprecated in torch.export)
        return {axis: d for axis, d in enumerate(axes) if d is not None} or None

    span = {"name": "span", "min": 1, "max": layout.max_cache_len}  # the attended prefix of the cache
    row = dims(batch, tokens)
    return (row, row, dims(tokens), dims(batch, span), [dims(batch)] * (2 * layout.layers))


def check_limits(max_cache_len: int, max_batch: int) -> None:
    if not isinstance(max_cache_len, int) or max_cache_len < 2:
        raise InputSpecError(f"max_cache_len must be an integer >= 2 (got {max_cache_len!r})")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise InputSpecError(f"max_batch must be an integer >= 1 (got {max_batch!r})")


def convert_causal_lm(lm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None, progress: Any = None,
                      weights: Any = None, repeat_layers: bool | int = True):
    """A transformers causal LM -> a `Generator` (torch-free prefill/decode over one params tree).

    `weights` (a capture.streaming.WeightSource) streams the params of an LM built with fake parameters.
    `repeat_layers`: True traces a stack of REPEAT_FROM_UNITS alike units or more at 3 and 4 units and repeats the
    middle one (capture_step); an int sets that many units instead; False traces every layer."""
    from ..runtime.model import Model
    from ..serve.generator import GenerationSpec, Generator
    from .converter import StageTimer, model_from
    from .hf import tp_plan_hints

    check_limits(max_cache_len, max_batch)
    lm = lm.eval()
    if dtype is not None:
        lm = lm.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        if weights is not None:
            weights.cast = True  # the checkpoint's floating tensors are converted to `dtype` as they are read
    layout = cache_layout(lm, max_cache_len)
    timer = StageTimer(progress)
    prefill = model_from(capture_step(lm, layout, max_batch, timer, repeat=repeat_layers), timer, weights)
    # decode is the same traced step with one token per row: torch.export runs once, not twice (it is most of a
    # conversion's time, and grows with the number of layers); the pinned size is exported as a constant
    decode = Model(prefill._run, prefill.params, prefill.graph.with_fixed_dims({"tokens": 1}))
    prefill.sharding_hints = decode.sharding_hints = tp_plan_hints(lm)  # the step module has no config of its own
    return Generator(prefill, decode, GenerationSpec(**generation_fields(lm, layout, max_batch)))


# Tracing 3 and 4 units costs 7 units' traces plus two traces' fixed cost: measured even with tracing every layer at
# about 9 layers (0.8 s a layer, 1.3 s a trace), so shallower stacks are traced whole.
REPEAT_FROM_UNITS = 10
SLICE_UNITS = 5  # the shallowest stack whose repetition makes copies (first, three middles, last): verification slices


def capture_step(lm: torch.nn.Module, layout: CacheLayout, max_batch: int, timer: Any, repeat: bool | int = True):
    """The step's portable graph (a capture.fx.Captured). torch.export's time grows with every layer it traces,
    so with `repeat` a deep stack of alike layers (or of alike blocks, where layer kinds alternate) is traced at 3
    and 4 units and the middle unit's graph repeated for the rest (capture/repeat.py); where that cannot be shown
    right, every layer is traced and the progress line says why. `repeat` as in convert_causal_lm."""
    from .repeat import NotRepeatable

    what = ""
    min_units = REPEAT_FROM_UNITS if repeat is True else int(repeat)
    if repeat is not False and min_units and layout.layers >= min_units:
        try:
            return _capture_repeated(lm, layout, max_batch, timer, min_units)
        except NotRepeatable as why:
            what = f" of all {layout.layers} layers ({why})"
    return _trace_step(lm, layout, max_batch, timer, what)[0]


def _trace_step(lm: torch.nn.Module, layout: CacheLayout, max_batch: int, timer: Any, what: str) -> tuple:
    """(Captured, ExportedProgram) of the step over `layout`'s layers."""
    from .converter import trace

    batch = min(max_batch, 2)  # traced at 2 where the batch is symbolic: torch.export specializes a dim of 1
    return trace(DecoderStep(lm, layout).eval(), example_step_inputs(layout, batch, 3), None,
                 step_dynamic_shapes(layout, max_batch), timer, what=what)


def repeat_slice(lm: torch.nn.Module) -> int | None:
    """The depth of a verification slice that converts by repetition as the whole of `lm` does (SLICE_UNITS units,
    with repeat_layers=SLICE_UNITS), or None where `lm`'s layers are traced one by one."""
    from .repeat import NotRepeatable

    layers = getattr(lm.config, "num_hidden_layers", None)
    if not isinstance(layers, int) or layers < REPEAT_FROM_UNITS:
        return None
    try:
        return SLICE_UNITS * repeat_unit(lm, layers, REPEAT_FROM_UNITS)[1]
    except NotRepeatable:
        return None


def repeat_unit(lm: torch.nn.Module, layers: int, min_units: int) -> tuple[str, int]:
    """(the layer stack's dotted name, the layers per repeated unit) of a model whose stack is at least `min_units`
    units that repeat; raises capture.repeat.NotRepeatable otherwise."""
    from .repeat import NotRepeatable, layer_stack, period

    stack = layer_stack(lm, layers)
    size = period(lm.get_submodule(stack), layers // min_units)
    if layers % size:
        raise NotRepeatable(f"{layers} layers are not a whole number of {size}-layer blocks")
    return stack, size


def _capture_repeated(lm: torch.nn.Module, layout: CacheLayout, max_batch: int, timer: Any, min_units: int):
    from .fx import Captured, state_tensors
    from .repeat import TRACED_UNITS, NotRepeatable, cut_to, first_difference, layer_of_inputs, layer_of_nodes, repeat_layers

    layers = layout.layers
    stack, size = repeat_unit(lm, layers, min_units)
    if any(layout.key_shapes[i] != layout.key_shapes[i % size] or layout.value_shapes[i] != layout.value_shapes[i % size]
           for i in range(layers)):
        raise NotRepeatable("the layers' caches differ in shape")
    traced = {}
    for units in (TRACED_UNITS, TRACED_UNITS + 1):
        with cut_to(lm, stack, units * size):
            captured, ep = _trace_step(lm, _cut_layout(layout, units * size), max_batch, timer,
                                       f" of {units * size} of the {layers} layers")
        layer_of = layer_of_nodes(ep.graph_module, stack) | layer_of_inputs(captured.graph, stack, _cache_layer)
        traced[units] = captured, ep, {name: layer // size for name, layer in layer_of.items()}
    captured, ep, unit_of = traced[TRACED_UNITS]
    rename = _layer_input_renamer(stack, size)
    more = TRACED_UNITS + 1
    unit = "layer" if size == 1 else f"block of {size} layers"
    with timer.stage("repeat", f"repeat a middle {unit} for layers {size} to {layers - size - 1}, first checking that "
                               f"{TRACED_UNITS * size} layers repeated to {more * size} equal {more * size} traced"):
        check = _with_specs(repeat_layers(captured.graph, unit_of, more, rename), _cut_layout(layout, more * size))
        difference = first_difference(check, traced[more][0].graph)
        if difference:
            raise NotRepeatable(f"{TRACED_UNITS * size} layers repeated to {more * size} differ from {more * size} traced: "
                                f"{difference}")
        graph = _with_specs(repeat_layers(captured.graph, unit_of, layers // size, rename), layout)
        step = DecoderStep(lm, layout)
        state = {**dict(step.named_parameters(remove_duplicate=False)), **dict(step.named_buffers(remove_duplicate=False))}
        tensors, graph.aliases = state_tensors(graph, state, ep.constants)
    return Captured(graph, tensors, captured.schemas)


def _cut_layout(layout: CacheLayout, layers: int) -> CacheLayout:
    return dataclasses.replace(layout, layers=layers, key_shapes=layout.key_shapes[:layers],
                               value_shapes=layout.value_shapes[:layers])


def _with_specs(graph: Any, layout: CacheLayout) -> Any:
    """The step's input and output structure for `layout` (what torch.export would record for that many layers)."""
    import torch.utils._pytree as pytree

    from .fx import treespec_to_json

    cache = [0] * (2 * layout.layers)
    graph.in_spec = treespec_to_json(pytree.tree_flatten(((0, 0, 0, 0, cache), {}))[1])
    graph.out_spec = treespec_to_json(pytree.tree_flatten((0, cache))[1])
    return graph


def _cache_layer(input_name: str) -> int | None:
    """The layer of a step input: `cache_{2i}` (keys) and `cache_{2i+1}` (values) are layer i's."""
    match = re.fullmatch(r"cache_(\d+)", input_name)
    return int(match.group(1)) // 2 if match else None


def _layer_input_renamer(stack: str, size: int):
    """How an input of unit `src` is named in unit `dst` (units of `size` layers): `model.layers.3.mlp.up_proj.weight`
    (placeholder `p_model_layers_3_mlp_up_proj_weight`) and cache slots, as torch.export names them."""
    from ..ir.graph import GraphInput

    flat = stack.replace(".", "_")
    pattern = re.compile(re.escape(stack) + r"\.(\d+)\.")

    def rename(inp: GraphInput, src: int, dst: int) -> GraphInput:
        shift = size * (dst - src)
        if inp.kind == "user_input":
            return GraphInput(f"cache_{int(inp.name.removeprefix('cache_')) + 2 * shift}", inp.kind, inp.meta, inp.target)
        layer = int(pattern.match(inp.target or "").group(1))
        target = f"{stack}.{layer + shift}." + inp.target[len(f"{stack}.{layer}."):]
        name = inp.name.replace(f"_{flat}_{layer}_", f"_{flat}_{layer + shift}_", 1)
        return GraphInput(name, inp.kind, inp.meta, target)

    return rename


def generation_fields(lm: torch.nn.Module, layout: CacheLayout, max_batch: int) -> dict:
    """What every generator's spec holds: the limits, the vocabulary, the special tokens and the self-attention
    cache (serve.generator.GenerationSpec's fields)."""
    from .fx import dtype_name

    eos, pad = special_tokens(lm)
    return dict(
        max_cache_len=layout.max_cache_len,
        max_batch=max_batch,
        vocab_size=int(lm.get_output_embeddings().weight.shape[0]),
        eos_token_ids=eos,
        pad_token_id=pad,
        cache_shapes=tuple(shape[1:] for shape in layout.shapes(1)),
        cache_dtype=dtype_name(layout.dtype),
    )


def special_tokens(lm: torch.nn.Module) -> tuple[tuple[int, ...], int]:
    """(end-of-sequence ids, pad id) from the generation config, else the model config; pad falls back to
    the first end token, as transformers' generate does."""
    sources = [getattr(lm, "generation_config", None), lm.config]
    eos = next((s.eos_token_id for s in sources if s is not None and getattr(s, "eos_token_id", None) is not None), None)
    eos_ids = tuple(int(t) for t in (eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos]))
    pad = next((s.pad_token_id for s in sources if s is not None and getattr(s, "pad_token_id", None) is not None), None)
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    return eos_ids, int(pad)
