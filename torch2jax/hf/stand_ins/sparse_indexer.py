"""DeepSeek sparse attention's indexer (DeepSeek V3.2, GLM-MoE-DSA, HY-V4, AXK2 and kin) over the converted step's
cache, while tracing.

The indexer scores every cached key for each query and returns the indices of the best `index_topk`, found by
`topk(min(index_topk, keys))`; the attention scatters them into a mask (eager and sdpa). Over the step's cache the
key count is the attended span, a symbol, and torch.export cannot show `min(index_topk, span) <= span`, so it stops.
This stand-in runs the model's own forward with `index_topk` set to the span itself (every key, ordered best first)
and keeps the first `index_topk` of that order, repeating the best key in the places after them. The mask built from
the indices then keeps the same keys as transformers': all of them where there are at most `index_topk`, else the
`index_topk` best. The keys' own cache is the step's (ExplicitLayer.update_indexer in hf/steps/kv_cache.py).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ...capture import trace_forwards
from ..steps.kv_cache import step_layer

# the indexers that pick their keys as `index_scores.topk(min(self.index_topk, ...))` from the cache's update_indexer
_INDEXERS = [
    "transformers.models.deepseek_v32.modeling_deepseek_v32.DeepseekV32Indexer",
    "transformers.models.glm_moe_dsa.modeling_glm_moe_dsa.GlmMoeDsaIndexer",
    "transformers.models.hy_v4.modeling_hy_v4.HYV4Indexer",
    "transformers.models.hy_v4_vl.modeling_hy_v4_vl.HYV4VLIndexer",
    "transformers.models.axk2.modeling_axk2.AXK2Indexer",
    "transformers.models.dots3_note.modeling_dots3_note.Dots3NoteTextIndexer",
    "transformers.models.mistral_large4.modeling_mistral_large4.MistralLarge4TextIndexer",
]


def picks_top_keys(cls: type) -> bool:
    """Whether the class's forward is the one written for: it caches its keys with update_indexer and keeps the
    `min(self.index_topk, ...)` best (a later transformers that does otherwise keeps its own forward)."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "update_indexer" in source and "min(self.index_topk" in source and ".topk(" in source


def indexer_forward(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    own = type(self).forward
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    layer = step_layer(cache, self.layer_idx)
    if layer is None or getattr(layer, "indexer_keys", None) is None:
        return own(self, *args, **kwargs)
    keep = self.index_topk
    self.index_topk = layer.span  # every key of the span, best first
    try:
        order = own(self, *args, **kwargs)
    finally:
        self.index_topk = keep
    if keep >= layer.max_cache_len:  # no span has more keys than are kept
        return order
    rank = torch.arange(order.shape[-1], device=order.device)
    return torch.where(rank < keep, order, order[..., :1])


for _name in _INDEXERS:
    trace_forwards.register(_name, indexer_forward, applies=picks_top_keys)
