"""Importing this registers every trace-time stand-in for transformers code that torch.export cannot capture as
written (capture/trace_forwards.py): expert loops (experts.py), the Qwen2-VL family's rotary positions
(rope_index.py), the vision helpers over fixed image grids (vision_grids.py), the gated delta rule's triangular
solve (delta_rule.py), GPT-Neo's causal table read by cache slot (local_attention.py), BLOOM's ALiBi positions
from the step's mask (alibi.py) and the positions of BART-like decoders, which count from the cache's length, given
by the step (positions.py; RoFormer's rotary table, rotary_from_cache.py), FSMT's masks and positions over the decode
step (fsmt.py), LED's Longformer encoder without its value-dependent branch and its one-token decoder mask (led.py),
X-MOD's per-language adapters run densely (language_adapters.py), DeepSeek sparse attention's top-key indexer over
the step's span (sparse_indexer.py), and recurrent mixers over the step's explicit state: their registry (mixers.py) and
each family's (state_space.py, mamba_kin.py, mamba2_kin.py, rg_lru.py, gated_delta.py, short_conv.py, rwkv.py, xlstm.py, zaya.py,
minimax.py, linear_attention.py). Models whose forward does not fit the step at all (CPM-Ant, BLT, XLM, ProphetNet) refuse
over its cache with their own reason (refused.py)."""

from . import (  # noqa: F401 - registered on import
    alibi,
    delta_rule,
    experts,
    fsmt,
    gated_delta,
    language_adapters,
    led,
    linear_attention,
    local_attention,
    mamba2_kin,
    mamba_kin,
    minimax,
    mixers,
    positions,
    refused,
    rg_lru,
    rope_index,
    rotary_from_cache,
    rwkv,
    short_conv,
    sparse_indexer,
    state_space,
    vision_grids,
    xlstm,
    zaya,
)
