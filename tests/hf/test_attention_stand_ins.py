"""Attention written for transformers' growing cache, traced over the converted steps' fixed cache through stand-ins:
GPT-Neo's causal table read by cache slot (hf/stand_ins/local_attention.py), BLOOM's ALiBi positions from the step's mask and
MPT's bias sliced by keys alone (hf/stand_ins/alibi.py). Greedy generation over a left-padded batch equals transformers' on the
model testers' configs. Before: GPT-Neo's padded row parted from transformers at its second token (window 7), and
BLOOM and MPT did not convert (torch.export stopped in their attention)."""

from __future__ import annotations

import pytest

import torch2jax
from benchmarks.hf_sweep import run
from torch2jax.hf.verify import verify_generation


@pytest.mark.parametrize("model_type,class_name", [("gpt_neo", "GPTNeoForCausalLM"), ("bloom", "BloomForCausalLM"),
                                                   ("mpt", "MptForCausalLM")])
def test_left_padded_generation_equals_transformers(model_type, class_name):
    model = run.build(run.load_configs()[model_type], class_name)
    model.config.use_cache = True
    generator = torch2jax.convert_hf(model, max_cache_len=64, max_batch=2)
    check = verify_generation(model, generator, tokens=12)
    assert len(check.rows) == 2 and all(ours == theirs for ours, theirs in check.rows), check.rows
