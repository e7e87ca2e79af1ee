"""GPT-Neo's local layers read their causal table by cache slot (hf/local_attention.py): greedy generation over a
left-padded batch equals transformers'. On the model tester's config (window 7) the padded row parted from
transformers at its second token before."""

from __future__ import annotations

import torch2jax
from benchmarks.hf_sweep import run
from torch2jax.hf.verify import verify_generation


def test_gpt_neo_left_padded_generation_equals_transformers():
    model = run.build(run.load_configs()["gpt_neo"], "GPTNeoForCausalLM")
    model.config.use_cache = True
    generator = torch2jax.convert_hf(model, max_cache_len=64, max_batch=2)
    check = verify_generation(model, generator, tokens=12)
    assert len(check.rows) == 2 and all(ours == theirs for ours, theirs in check.rows), check.rows
