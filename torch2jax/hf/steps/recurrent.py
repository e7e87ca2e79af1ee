"""A causal LM whose cache keeps a recurrent state (Mamba, Mamba2, and hybrids of them with attention layers) as one
step over explicit per-layer state, served as prefill and decode like an attention-only LM (hf/steps/causal_lm.py).

The step's signature is the causal-LM step's: (input_ids, position_ids, write_at, kv_valid, cache) -> (last logits,
new cache), and `cache` is a flat list of tensors, so the generator's token loop runs it unchanged:

    attention layer   keys, values  [B, kv_heads, max_cache_len + 1, head_dim]   slots, written at `write_at`
    state-space layer conv          [B, channels, kernel - 1]                   overwritten by each step
                      ssm           [B, ...] float32 (transformers' own shape)   overwritten by each step
    other mixers      the states their registry entry lists (hf/stand_ins/mixers.py)
    hybrid layer      a mixer's states, then keys and values
    MLP-only layer    none

A state layer's size does not grow with the context: a decode step costs the same at any length (its graph reads
`kv_valid` only at the written slots). Which tokens are real comes from the same inputs the attention mask is built
from: token t of row b is real when `kv_valid[b, write_at[t]]`, so left padding (and a length bucket's extra padding)
never enters the state (hf/stand_ins/state_space.py). The prompt runs as one scan over its tokens, starting from the
given state: a prompt filled in chunks equals it filled at once. The generation spec marks each cache tensor's kind
(`"kv"` or `"state"`) and dtype. A model that keeps its state outside a transformers Cache (RWKV's `state`, xLSTM's
`cache`) or insists on its own Cache subclass (MiniMax) is given the step's entries by the keyword or in the class its
mixers' registry entries name.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from ...capture.converter import StageTimer, cast_module, model_from, tp_plan_hints, trace
from ...capture.fx import dtype_name
from ...errors import ExportError
from ...generate.generator import GenerationSpec, Generator
from ...runtime.model import Model
from ...runtime.quantize import DEFAULT_GROUP_SIZE, check_scheme, quantize_model
from ..stand_ins import mixers
from .causal_lm import FULL, SLIDING, DecoderStep, example_step_inputs
from .kv_cache import check_limits, generation_fields

ATTENTION, STATE = "kv", "state"
LINEAR = "linear_attention"  # the mask name transformers' hybrids give their recurrent mixers


@dataclass(frozen=True)
class StateLayout:
    """Each layer's cache tensors, in order: keys and values of an attention layer; the mixer's states of a state layer
    (conv and SSM for Mamba); states then keys and values of a layer with both (Zamba's hybrid layers); none for a
    layer without a cache (an MLP-only layer). Shapes without the batch dim; an attention tensor's is
    [kv_heads, max_cache_len + 1, head_dim]."""

    layer_kinds: tuple[tuple[str, ...], ...]  # per layer, per tensor: ATTENTION or STATE
    tensor_shapes: tuple[tuple[int, ...], ...]  # per tensor, all layers in order
    tensor_dtypes: tuple[torch.dtype, ...]
    dtype: torch.dtype  # the model's (the attention mask's and the conv state's)
    max_cache_len: int

    @property
    def layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def slots(self) -> int:
        return self.max_cache_len + 1

    def tensor_kinds(self) -> tuple[str, ...]:
        return tuple(kind for layer in self.layer_kinds for kind in layer)

    def shapes(self, batch: int) -> list[tuple[int, ...]]:
        return [(batch, *shape) for shape in self.tensor_shapes]

    def zeros(self, batch: int) -> list[torch.Tensor]:
        return [torch.zeros(shape, dtype=dtype) for shape, dtype in zip(self.shapes(batch), self.tensor_dtypes)]


def state_mixers(lm: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """The recurrent mixers of `lm` this module converts (stand_ins/mixers.py), by the index of the layer whose cache
    entry they own."""
    found = {}
    for name, module in lm.named_modules():
        mixer = mixers.mixer_of(module)
        if mixer is not None:
            try:
                index = mixer.layer_index(module)
            except AttributeError:  # RecurrentGemma's blocks keep no index: their decoder layer's
                module.layer_idx = index = decoder_layer_index(lm, name)
            found[index] = module
            for again in mixer.later_layers(module):  # Inkling2-Loop's later loop passes
                found[again] = module
    return found


def decoder_layer_index(lm: torch.nn.Module, name: str) -> int:
    """The index of the decoder layer holding the submodule `name` (`model.layers.3.temporal_block` -> 3, xLSTM's
    `backbone.blocks.1` -> 1)."""
    parts = name.split(".")
    for at in range(len(parts) - 1, 0, -1):
        if parts[at].isdigit() and parts[at - 1] in ("layers", "blocks"):
            return int(parts[at])
    raise ExportError(f"{type(lm).__name__}'s recurrent mixer {name} is not inside a decoder layer (`layers.N`, `blocks.N`)")


def keeps_recurrent_state(lm: torch.nn.Module) -> bool:
    """Whether `lm` has recurrent mixers this module converts (the dispatch's question: hf/convert.py)."""
    return bool(state_mixers(lm))


def state_layout(lm: torch.nn.Module, max_cache_len: int) -> StateLayout:
    """Each layer's cache: one token run through transformers' own cache says which layers keep keys and values and
    their shapes, and which keep a recurrent state; a state's tensors come from its mixer's registry entry."""
    from transformers import DynamicCache
    from transformers.cache_utils import DummyLayer, LinearAttentionCacheLayerMixin

    found = state_mixers(lm)
    dtype = next(p.dtype for p in lm.parameters() if p.is_floating_point())
    if own_state_keyword(lm) is not None:
        return own_state_layout(lm, found, dtype, max_cache_len)
    own_class = required_cache_class(lm)
    cache = own_class() if own_class is not None else DynamicCache(config=lm.config)
    with torch.no_grad():
        lm(input_ids=torch.zeros((1, 1), dtype=torch.long), use_cache=True, **{cache_keyword(lm): cache})
    layer_kinds, shapes, dtypes = [], [], []
    # MiniMax's own cache makes no layer for a trailing linear-attention layer and keeps its state beside the layers
    layers = [*cache.layers, *[DummyLayer()] * (max(found, default=-1) + 1 - len(cache.layers))]
    for i, layer in enumerate(layers):
        kinds: list[str] = []
        if isinstance(layer, LinearAttentionCacheLayerMixin) or i in found:
            if i not in found:
                raise ExportError(
                    f"{type(lm).__name__}'s layer {i} keeps a recurrent state ({type(layer).__name__}) of a kind "
                    f"text-generation artifacts do not hold yet (supported: {', '.join(mixers.kinds())} mixers); its "
                    "forward converts: torch2jax.convert(model, args), or "
                    "`torch2jax convert hf:DIR --task feature-extraction`.")
            for shape, state_dtype in mixers.mixer_of(found[i]).states(found[i]):
                kinds.append(STATE)
                shapes.append(tuple(int(d) for d in shape))
                dtypes.append(state_dtype or dtype)
        if getattr(layer, "keys", None) is not None:
            kinds += [ATTENTION, ATTENTION]
            shapes += [(layer.keys.shape[1], max_cache_len + 1, layer.keys.shape[3]),
                       (layer.values.shape[1], max_cache_len + 1, layer.values.shape[3])]
            dtypes += [layer.keys.dtype, layer.values.dtype]
        if not kinds and not isinstance(layer, DummyLayer):
            raise ExportError(f"{type(lm).__name__}'s layer {i} filled neither keys and values nor a recurrent state")
        layer_kinds.append(tuple(kinds))
    return StateLayout(tuple(layer_kinds), tuple(shapes), tuple(dtypes), dtype, max_cache_len)


def own_state_layout(lm: torch.nn.Module, found: dict[int, torch.nn.Module], dtype: torch.dtype,
                     max_cache_len: int) -> StateLayout:
    """The layout of an LM that keeps its recurrent state in a structure of its own, not a transformers Cache (RWKV's
    `state` list): every layer's cache is its mixer's states (no forward runs: RWKV's first forward in eval mode
    would rescale its weights in place)."""
    if sorted(found) != list(range(len(found))):
        raise ExportError(f"{type(lm).__name__} keeps its own recurrent state but only layers {sorted(found)} have a "
                          "registered mixer; text-generation artifacts need one per layer")
    layer_kinds, shapes, dtypes = [], [], []
    for i in range(len(found)):
        states = mixers.mixer_of(found[i]).states(found[i])
        layer_kinds.append((STATE,) * len(states))
        shapes += [tuple(int(d) for d in shape) for shape, _ in states]
        dtypes += [state_dtype or dtype for _, state_dtype in states]
    return StateLayout(tuple(layer_kinds), tuple(shapes), tuple(dtypes), dtype, max_cache_len)


def required_cache_class(lm: torch.nn.Module) -> type | None:
    """The Cache subclass the LM's forward insists on (its mixers' registry entries name it), or None for any."""
    import importlib

    for module in state_mixers(lm).values():
        name = mixers.mixer_of(module).cache_class
        if name is not None:
            path, _, qualname = name.rpartition(".")
            return getattr(importlib.import_module(path), qualname)
    return None


def own_state_keyword(lm: torch.nn.Module) -> str | None:
    """The keyword an LM that keeps its recurrent state in a structure of its own takes it by (its mixers' registry
    entries say), or None for one whose cache is a transformers Cache."""
    for module in state_mixers(lm).values():
        keyword = mixers.mixer_of(module).state_keyword
        if keyword is not None:
            return keyword
    return None


def cache_keyword(lm: torch.nn.Module) -> str:
    """The name the LM's forward takes its cache by: its mixers' own keyword (RWKV's `state`), `cache` (Mamba,
    Mamba2), else `past_key_values`."""
    own = own_state_keyword(lm)
    if own is not None:
        return own
    parameters = inspect.signature(lm.forward).parameters
    return "cache" if "cache" in parameters and "past_key_values" not in parameters else "past_key_values"


def state_layer_classes():
    """(StateLayer, HybridLayer): a state layer's entry, and a layer's with both a state and keys and values."""
    from transformers.cache_utils import LinearAttentionLayer

    from .kv_cache import explicit_layer_class

    class StateLayer(LinearAttentionLayer):
        """One recurrent layer's states given as tensors (`states`, as its mixer's registry entry lists them) and which
        of the step's tokens are real (`keep` [B, T]); the mixer's stand-in replaces `states` with the new ones."""

        def __init__(self, states: list[torch.Tensor], keep: torch.Tensor):
            LinearAttentionLayer.__init__(self)
            self.states, self.keep = list(states), keep
            setattr(self, mixers.STATE_ATTRIBUTE, True)
            self.is_conv_states_initialized[0] = self.is_recurrent_states_initialized[0] = True
            self.has_previous_state[0] = True

    explicit = explicit_layer_class()

    class HybridLayer(StateLayer, explicit):
        """A layer whose mixer keeps a state and whose attention keeps keys and values (Zamba, Falcon-H1)."""

        def __init__(self, states: list[torch.Tensor], keep: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     write_at: torch.Tensor, span: int):
            explicit.__init__(self, keys, values, write_at, span)
            StateLayer.__init__(self, states, keep)

    return StateLayer, HybridLayer


class RecurrentStep(DecoderStep):
    """forward(input_ids, position_ids, write_at, kv_valid, cache) -> (last logits [B, V] float32, new cache), over a
    StateLayout's cache (a flat list of each layer's tensors)."""

    def __init__(self, lm: torch.nn.Module, layout: StateLayout, owner: torch.nn.Module | None = None):
        super().__init__(lm, layout, owner)
        self._state_layer, self._hybrid_layer = state_layer_classes()
        self._keyword = cache_keyword(lm)
        self._cache_class = required_cache_class(lm)
        self._attends = ATTENTION in layout.tensor_kinds()
        if self._attends and self.layer_types and FULL not in self.layer_types:
            # Zamba's layer types call its attention layers "hybrid"; the model reads the "full_attention" mask
            self.layer_types = sorted({*self.layer_types, FULL})
        if self._attends and self.layer_types and LINEAR not in self.layer_types:
            # Falcon-H1 (layer type "hybrid") reads a "linear_attention" mask for its mixers too; their stand-ins
            # read which tokens are real from the step's state entry, not from it
            self.layer_types = sorted({*self.layer_types, LINEAR})
        # ZAYA's windowed layers are "hybrid_sliding": they read the sliding-window mask under their own name
        self._sliding_names = [kind for kind in self.layer_types or () if kind != SLIDING and "sliding" in kind]
        if self._sliding_names and self.window:
            self.layer_types = sorted({*self.layer_types, SLIDING})

    def _masks(self, write_at: torch.Tensor, kv_valid: torch.Tensor, also: torch.Tensor | None = None) -> Any:
        masks = super()._masks(write_at, kv_valid, also)
        if isinstance(masks, dict) and self._sliding_names and self.window:
            masks.update({kind: masks[SLIDING] for kind in self._sliding_names})
        return masks

    def step(self, tokens: dict, position_ids, write_at, kv_valid, cache, also=None):
        from transformers.cache_utils import Cache, DummyLayer

        span = kv_valid.shape[1]
        keep = kv_valid.gather(1, write_at.expand(kv_valid.shape[0], -1))  # [B, T]: the real tokens
        layers, at = [], 0
        for kinds in self.layout.layer_kinds:
            tensors, at = cache[at:at + len(kinds)], at + len(kinds)
            states = [t for t, kind in zip(tensors, kinds) if kind == STATE]
            if not kinds:
                layers.append(DummyLayer())
            elif not states:
                layers.append(self._layer(*tensors, write_at, span))
            elif len(states) == len(kinds):
                layers.append(self._state_layer(states, keep))
            else:
                layers.append(self._hybrid_layer(states, keep, *tensors[len(states):], write_at, span))
        extra = dict(position_ids=position_ids, attention_mask=self._masks(write_at, kv_valid, also),
                     cache_position=write_at if write_at.dim() == 1 else write_at[0]) if self._attends else {}
        if self._cache_class is None:
            cache_given = Cache(layers=layers)
        else:  # the LM's own Cache subclass (MiniMax), holding the step's layers
            cache_given = self._cache_class()
            cache_given.layers = layers
        out = self.lm(**tokens, **extra, **{self._keyword: cache_given}, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1].float()
        new = []
        for layer, kinds in zip(layers, self.layout.layer_kinds):
            if STATE in kinds:
                new += layer.states
            if ATTENTION in kinds:
                new += [layer.keys, layer.values]
        return logits, new


def dynamic_shapes(layout: StateLayout, max_batch: int) -> tuple:
    """As the causal-LM step's: batch, tokens and the attended span symbolic; state tensors symbolic in batch only."""
    batch = {"name": "batch", "min": 1, "max": max_batch} if max_batch > 1 else None
    tokens = {"name": "tokens", "min": 1, "max": layout.max_cache_len}
    span = {"name": "span", "min": 1, "max": layout.max_cache_len}

    def dims(*axes: Any) -> dict | None:
        return {axis: d for axis, d in enumerate(axes) if d is not None} or None

    row = dims(batch, tokens)
    return (row, row, row, dims(batch, span), [dims(batch)] * len(layout.tensor_shapes))


def convert_recurrent_lm(lm: torch.nn.Module, *, max_cache_len: int = 512, max_batch: int = 8, dtype: Any = None,
                         progress: Any = None, weights: Any = None, repeat_layers: bool | int = True,
                         quantize: str | None = None, group_size: int = DEFAULT_GROUP_SIZE) -> Generator:
    """A transformers causal LM with state-space layers -> a `Generator`, as hf/steps/causal_lm.convert_causal_lm
    (same options; every layer is traced: `repeat_layers` does not apply to these models yet)."""
    check_limits(max_cache_len, max_batch)
    if quantize is not None:
        check_scheme(quantize, group_size)
    lm = lm.eval()
    if dtype is not None:
        lm = cast_module(lm, dtype, weights)
    layout = state_layout(lm, max_cache_len)
    timer = StageTimer(progress)
    batch = min(max_batch, 2)  # torch.export specializes a dim of 1
    captured, _ = trace(RecurrentStep(lm, layout).eval(), example_step_inputs(layout, batch, 3), None,
                        dynamic_shapes(layout, max_batch), timer)
    prefill = model_from(captured, timer, weights)
    if quantize is not None:
        with timer.stage("quantize", f"quantize the matmul weights to {quantize}"):
            prefill = quantize_model(prefill, quantize, group_size)
    decode = Model(prefill._run, prefill.params, prefill.graph.with_fixed_dims({"tokens": 1}))
    decode.quantization = prefill.quantization
    prefill.sharding_hints = decode.sharding_hints = tp_plan_hints(lm)
    return Generator(prefill, decode, GenerationSpec(**spec_fields(lm, layout, max_batch)))


def spec_fields(lm: torch.nn.Module, layout: StateLayout, max_batch: int) -> dict:
    """generation_fields with this layout's shapes, and each cache tensor's kind and dtype."""
    fields = generation_fields(lm, _AsKV(layout), max_batch)
    fields.update(cache_shapes=layout.tensor_shapes, cache_dtype=dtype_name(layout.dtype),
                  cache_kinds=layout.tensor_kinds(), cache_dtypes=tuple(dtype_name(d) for d in layout.tensor_dtypes))
    return fields


class _AsKV:
    """What generation_fields reads of a layout (its limits; the shapes are replaced after)."""

    def __init__(self, layout: StateLayout):
        self.max_cache_len, self.dtype = layout.max_cache_len, layout.dtype

    def shapes(self, batch: int) -> list:
        return []
