"""The KV cache both generators share, as explicit state: per layer keys and values of
[batch, kv_heads, max_cache_len + 1, head_dim], given to each step as inputs and returned as outputs
(never a buffer, never saved as weights), and what a generator's spec holds besides (limits, vocabulary,
special tokens).

A model with DeepSeek sparse attention (DeepSeek V3.2, GLM-MoE-DSA: transformers' "indexed_attention" layers) also
caches each layer's indexer keys, which score the cached tokens to pick those a query attends to. They are a third
tensor per layer, [batch, 1, max_cache_len + 1, index_head_dim]: one head, so that it is laid out, written at
`write_at`, donated and carried as the keys and values are."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from ...capture.fx import dtype_name
from ...errors import ExportError, InputSpecError


@dataclass(frozen=True)
class CacheLayout:
    """What the cache looks like: per layer keys and values of [batch, heads, max_cache_len + 1, head_dim]."""

    layers: int
    key_shapes: tuple[tuple[int, int], ...]  # per layer (kv_heads, head_dim) of keys
    value_shapes: tuple[tuple[int, int], ...]
    dtype: torch.dtype
    max_cache_len: int
    # per layer the width of its sparse-attention indexer's keys, cached as a third tensor of the layer; empty where
    # the model has no indexer (every layer then holds keys and values only)
    indexer_dims: tuple[int, ...] = ()

    @property
    def per_layer(self) -> int:
        """How many cache tensors each layer holds: keys, values and, with an indexer, its keys."""
        return 3 if self.indexer_dims else 2

    def names(self) -> list[str]:
        kinds = ("keys", "values", "indexer_keys")[: self.per_layer]
        return [f"cache.{i}.{kind}" for i in range(self.layers) for kind in kinds]

    @property
    def slots(self) -> int:
        """max_cache_len + 1: one spare slot, never written, so that the attended span (at most max_cache_len)
        is always a strict prefix; torch.export refuses a slice with a symbolic end that may be the whole dim."""
        return self.max_cache_len + 1

    def shapes(self, batch: int) -> list[tuple[int, ...]]:
        out = []
        for i, ((kh, kd), (vh, vd)) in enumerate(zip(self.key_shapes, self.value_shapes)):
            out += [(batch, kh, self.slots, kd), (batch, vh, self.slots, vd)]
            if self.indexer_dims:
                out.append((batch, 1, self.slots, self.indexer_dims[i]))
        return out

    def layer_tensors(self, cache: list, layer: int) -> list:
        """Layer `layer`'s tensors in the flat `cache` list (keys, values, and the indexer's keys where there are)."""
        return cache[self.per_layer * layer: self.per_layer * (layer + 1)]

    def zeros(self, batch: int) -> list[torch.Tensor]:
        return [torch.zeros(shape, dtype=self.dtype) for shape in self.shapes(batch)]


def cache_argument(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The cache as the model's forward takes it: `cache=` where the forward has that parameter (transformers 5.24 on;
    its `past_key_values=` is deprecated and goes in 5.40), `past_key_values=` for models that have only the old name."""
    import inspect

    try:
        takes = "cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        takes = False
    return {"cache": cache} if takes else {"past_key_values": cache}


def check_decoder(lm: torch.nn.Module) -> None:
    """Refuse a model whose layers read `config.is_decoder` and were built with it False (BERT-like LM heads): they
    attend both ways and keep no cache, so transformers' generate recomputes the whole text at every new token, which
    a cached step cannot reproduce; converting them as a decoder would generate other tokens silently."""
    config = lm.config.get_text_config()
    if getattr(config, "is_decoder", None) is not False:
        return
    try:
        text = lm.get_decoder()  # the language part: an audio or vision tower's encoder layers say False rightly
    except (AttributeError, NotImplementedError, ValueError):
        text = lm
    if any(getattr(module, "is_decoder", None) is False for module in text.modules() if module is not lm):
        raise ExportError(
            f"{type(lm).__name__}'s config has is_decoder=False: its attention runs both ways and transformers "
            "recomputes every token at each step instead of caching, so it is not a causal decoder as configured. "
            "Build it with is_decoder=True (config.is_decoder = True before the model is made) to generate with it.")


def check_one_stream(lm: torch.nn.Module) -> None:
    """Refuse a decoder that embeds several token streams per row (MusicGen's codebooks: input_ids [batch * codebooks,
    T], one embedding table per codebook): a text-generation artifact's rows are one stream each."""
    embeddings = lm.get_input_embeddings()
    if isinstance(embeddings, torch.nn.ModuleList):
        raise ExportError(
            f"{type(lm).__name__} embeds {len(embeddings)} token streams per row (one table each: audio codebooks, "
            "input_ids of batch * streams rows), and text-generation artifacts generate one stream per row, so it "
            "cannot generate yet. Its forward converts: torch2jax.convert(model, args).")


def check_chunked_attention(lm: torch.nn.Module, max_cache_len: int) -> None:
    """Llama 4's chunked-attention layers attend only within chunks of attention_chunk_size positions; the step's mask
    (hf/steps/causal_lm.py) is causal over the whole cache, the same while every position is in the first chunk. A
    cache longer than a chunk is refused rather than attended across chunks (a causal LM's or a VLM's text model)."""
    text = lm.config.get_text_config()
    chunk = getattr(text, "attention_chunk_size", None)
    if chunk and "chunked_attention" in (getattr(text, "layer_types", None) or ()) and max_cache_len > int(chunk):
        raise InputSpecError(f"{type(lm).__name__}'s chunked-attention layers attend within chunks of {chunk} positions, "
                             "and the converted step attends across the whole cache: pass --max-cache-len "
                             f"{chunk} or less (every position then lies in the first chunk)")


def cache_layout(lm: torch.nn.Module, max_cache_len: int) -> CacheLayout:
    """Measure the cache the model writes: one token through a dynamic cache, read back per layer."""
    from transformers import DynamicCache

    check_decoder(lm)
    check_one_stream(lm)
    check_chunked_attention(lm, max_cache_len)
    check_reference_window(lm, max_cache_len)

    cache = DynamicCache(config=lm.config)
    with torch.no_grad():
        lm(input_ids=torch.zeros((1, 1), dtype=torch.long), **cache_argument(lm, cache), use_cache=True)
    stateful = sorted({type(layer).__name__ for layer in cache.layers if not hasattr(layer, "keys") or holds_state(layer)})
    if stateful:
        raise ExportError(
            f"{type(lm).__name__} keeps a recurrent state in its cache ({', '.join(stateful)}: linear-attention, "
            "state-space or short-convolution layers) besides attention keys and values, from mixers torch2jax has no "
            "generation stand-in for (hf/stand_ins/mixers.py), so it cannot generate yet. Its forward converts: "
            "torch2jax.convert(model, args), or `torch2jax convert hf:DIR --task feature-extraction`.")
    # transformers' DummyLayer stands for a layer that keeps no cache of its own (Gemma 3n's layers that reuse an
    # earlier layer's keys and values within the step): an empty entry (no heads) keeps the layers' numbering
    empty = torch.zeros((1, 0, 1, 1))
    # Mllama's text model skips its cross-attention layers when there is no image and none is cached (an empty entry
    # reads as none cached): a text-only step has no use for them
    skipped = set(getattr(lm.config.get_text_config(), "cross_attention_layers", None) or ())
    own = [type(layer).__name__ != "DummyLayer" and not (i in skipped and getattr(layer, "keys", None) is None)
           for i, layer in enumerate(cache.layers)]
    keys = [prefilled(layer, "keys") if mine else empty for layer, mine in zip(cache.layers, own)]
    values = [prefilled(layer, "values") if mine else empty for layer, mine in zip(cache.layers, own)]
    if not any(own) or any(k is None for k in keys):
        raise ExportError(f"{type(lm).__name__} did not fill a key/value cache; only attention-cache decoders are supported")
    dtype = next(k.dtype for k, mine in zip(keys, own) if mine)
    return CacheLayout(
        layers=len(keys),
        key_shapes=tuple((k.shape[1], k.shape[3]) for k in keys),
        value_shapes=tuple((v.shape[1], v.shape[3]) for v in values),
        dtype=dtype,
        max_cache_len=max_cache_len,
        indexer_dims=indexer_dims(lm, cache.layers, dtype),
    )


def check_reference_window(lm: torch.nn.Module, max_cache_len: int) -> None:
    """Unlimited-OCR's reference sliding-window layers attend to every prompt position and to the last sliding_window
    positions; the step's mask (hf/steps/causal_lm.py) is causal over the whole cache, the same while the cache is no
    longer than the window. A longer cache is refused rather than attended past the window."""
    text = lm.config.get_text_config()
    window = getattr(text, "sliding_window", None)
    if window and "reference_sliding_attention" in (getattr(text, "layer_types", None) or ()) and max_cache_len > int(window):
        raise InputSpecError(f"{type(lm).__name__}'s reference sliding-window layers keep the prompt and a window of "
                             f"{window} decoded positions, and the converted step attends across the whole cache: pass "
                             f"--max-cache-len {window} or less (every position then lies in the window)")


def prefilled(layer: Any, name: str) -> Any:
    """A cache layer's keys or values; a reference sliding-window layer's (Unlimited-OCR) are its prefill_keys or
    prefill_values, where the first call's states go (its keys hold decoded positions only)."""
    prefill = getattr(layer, f"prefill_{name}", None)
    return prefill if isinstance(prefill, torch.Tensor) else getattr(layer, name)


def holds_state(layer: Any) -> bool:
    """Whether a cache layer with keys and values also holds a filled recurrent state (transformers' linear-attention
    hybrids: Inkling's short convolutions over its keys and values), which the step's layers would not carry."""
    states = [getattr(layer, name, None) for name in ("conv_states", "recurrent_states")]
    return any(isinstance(value, torch.Tensor) for found in states if isinstance(found, dict) for value in found.values())


def indexer_dims(lm: torch.nn.Module, layers: list, dtype: torch.dtype) -> tuple[int, ...]:
    """Each layer's indexer key width where the model cached indexer keys (DeepSeek sparse attention), else ().
    Refused: indexer keys in some layers only, of another dtype than the keys, or indexer positions kept beside them
    (a model whose indexer reads them would see none from the step's cache)."""
    found = [getattr(layer, "indexer_keys", None) for layer in layers]
    if all(k is None or k.numel() == 0 for k in found):
        return ()
    name = type(lm).__name__
    if any(k is None or k.dim() != 3 for k in found):
        raise ExportError(f"{name} caches sparse-attention indexer keys in some layers only (or not as [batch, tokens, "
                          "dim]); text-generation artifacts hold them for every layer or none, so it cannot generate yet")
    if any(k.dtype != dtype for k in found):
        raise ExportError(f"{name}'s sparse-attention indexer keys are {found[0].dtype}, its keys {dtype}; the "
                          "artifact's cache holds one dtype, so it cannot generate yet")
    if any(getattr(layer, "indexer_position_ids", None) is not None for layer in layers):
        raise ExportError(f"{name}'s sparse-attention indexer caches its positions beside its keys; the artifact's cache "
                          "does not hold them, so it cannot generate yet")
    return tuple(int(k.shape[2]) for k in found)


def adopt_parts(step: torch.nn.Module, model: torch.nn.Module) -> None:
    """Register `model`'s children, and its own params and buffers (BART's `final_logits_bias`), on the step that
    wraps it, so torch.export lifts every one under the model's own state_dict name. A tensor attribute of an
    unregistered model would be lifted as a nameless constant, its value the model's at trace time: wrong for a
    model built with fake params whose weights stream from the checkpoint."""
    for name, child in model.named_children():
        step.add_module(name, child)
    for name, param in model.named_parameters(recurse=False):
        step.register_parameter(name, param)
    for name, buffer in model.named_buffers(recurse=False):
        step.register_buffer(name, buffer, persistent=name not in model._non_persistent_buffers_set)


def explicit_layer_class():
    from transformers.cache_utils import CacheLayerMixin

    class ExplicitLayer(CacheLayerMixin):
        """One layer's keys and values (and its sparse-attention indexer's keys, where it has an indexer) given as
        tensors and updated out of place at `write_at`."""

        is_compileable = True
        is_sliding = False

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, write_at: torch.Tensor, span: int,
                     indexer_keys: torch.Tensor | None = None):
            super().__init__()
            self.keys, self.values, self.write_at, self.span = keys, values, write_at, span
            self.indexer_keys = indexer_keys  # [B, 1, slots, dim]
            self.max_cache_len = keys.shape[2]
            self.is_initialized = True

        def tensors(self) -> list[torch.Tensor]:
            """The layer's cache tensors as the step returns them: keys, values (, the indexer's keys)."""
            return [self.keys, self.values] + ([] if self.indexer_keys is None else [self.indexer_keys])

        def lazy_initialization(self, key_states, value_states) -> None:
            pass

        def update(self, key_states, value_states, *args, **kwargs):
            """Write the new keys/values into the whole cache; attention gets the first `span` slots."""
            self.keys = write_slots(self.keys, self.write_at, key_states)
            self.values = write_slots(self.values, self.write_at, value_states)
            return self.keys[:, :, : self.span], self.values[:, :, : self.span]

        def update_indexer(self, indexer_key_states: torch.Tensor) -> torch.Tensor:
            """Write the new indexer keys [B, T, dim] at the keys' slots; the indexer scores the first `span` slots,
            the same keys the attention reads, so its mask (the step's) applies to both alike."""
            if self.indexer_keys is None:
                raise ExportError("the model wrote sparse-attention indexer keys, but the step's cache holds none for "
                                  "this layer (its layout was measured without them)")
            self.indexer_keys = write_slots(self.indexer_keys, self.write_at, indexer_key_states[:, None])
            return self.indexer_keys[:, 0, : self.span]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.span, 0

        def get_seq_length(self):
            return self.write_at[0] if self.write_at.dim() == 1 else self.write_at[:, 0].min()

        def get_max_length(self) -> int:
            return self.max_cache_len

    return ExplicitLayer


def write_slots(cache: torch.Tensor, write_at: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """`cache` [B, heads, slots, dim] with the T new entries `new` [B, heads, T, dim] written out of place at `write_at`:
    [T] slots shared by every row, or [B, T] each row's own."""
    new = new.to(cache.dtype)
    if write_at.dim() == 1:
        return cache.index_copy(2, write_at, new)
    return cache.scatter(2, write_at[:, None, :, None].expand(-1, new.shape[1], -1, new.shape[3]), new)


def query_slots(write_at: torch.Tensor) -> torch.Tensor:
    """Each query's slot as [B, T] (B = 1 where `write_at` is one [T] shared by every row)."""
    return write_at[None] if write_at.dim() == 1 else write_at


def step_slots(cache: Any, layer: int) -> Any:
    """The cache slots the converted step writes this call (`write_at`) where `cache` is the step's own (ExplicitLayer
    layers), else None: attention stand-ins that mask by slot run only over the step's fixed cache."""
    return getattr(step_layer(cache, layer), "write_at", None)


def step_layer(cache: Any, layer: int) -> Any:
    """Layer `layer` of `cache` where it is the converted step's own (an ExplicitLayer, which has `write_at`), else
    None."""
    layers = getattr(cache, "layers", None)
    found = layers[layer] if layers and layer < len(layers) else None
    return found if hasattr(found, "write_at") else None


def step_layers(layer_class: type, layout: CacheLayout, cache: list, write_at: torch.Tensor, span: Any) -> list:
    """The step's cache layers (`layer_class`: explicit_layer_class()) over the flat `cache` list."""
    return [layer_class(*tensors[:2], write_at, span, *tensors[2:])
            for tensors in (layout.layer_tensors(cache, i) for i in range(layout.layers))]


def cut_layout(layout: CacheLayout, layers: int) -> CacheLayout:
    """The layout of the first `layers` layers."""
    return dataclasses.replace(layout, layers=layers, key_shapes=layout.key_shapes[:layers],
                               value_shapes=layout.value_shapes[:layers], indexer_dims=layout.indexer_dims[:layers])


def check_limits(max_cache_len: int, max_batch: int) -> None:
    if not isinstance(max_cache_len, int) or max_cache_len < 2:
        raise InputSpecError(f"max_cache_len must be an integer >= 2 (got {max_cache_len!r})")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise InputSpecError(f"max_batch must be an integer >= 1 (got {max_batch!r})")


def check_head(lm: torch.nn.Module) -> torch.nn.Module:
    """The model's language-model head; ExportError naming the fix for a model without one (a base model such as
    LlamaModel, or a class whose head is not where transformers' get_output_embeddings looks)."""
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if head is None:
        raise ExportError(f"{type(lm).__name__} has no language-model head (get_output_embeddings() is None): it makes "
                          "no token logits to generate from; convert its generating class (a *ForCausalLM or "
                          "*ForConditionalGeneration) instead")
    return head


def generation_fields(lm: torch.nn.Module, layout: CacheLayout, max_batch: int) -> dict:
    """What every generator's spec holds: the limits, the vocabulary, the special tokens and the self-attention
    cache (serve.generator.GenerationSpec's fields)."""
    eos, pad = special_tokens(lm)
    return dict(
        max_cache_len=layout.max_cache_len,
        max_batch=max_batch,
        vocab_size=int(check_head(lm).weight.shape[0]),
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
