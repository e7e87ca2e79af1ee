"""`torch2jax serve` over models whose cache holds a recurrent state (Mamba2, and the Bamba hybrid): requests of
different lengths share a batch and each reply is what `generate` gives its prompt alone. The state has no slots, so the
engine copies it whole where it rolls the KV slots (a roll along the state's axis 2 would scramble it)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from tokenizers import Tokenizer

import torch2jax
from torch2jax.serve.api import build_service

from ..generate.lms import write_tokenizer
from ..hf.test_recurrent_generation import tiny_lm
from .test_lora_serving import ask_together, words

NEW = 6
PROMPTS = [[5, 9, 33, 17], [40, 41, 42, 43, 44, 45, 46, 47, 48], [7, 8]]


# Mamba2 alone in the slow tier: Bamba holds its Mamba2 layers' states beside attention layers' keys and values
@pytest.mark.parametrize("kind", [pytest.param("mamba2", marks=pytest.mark.slow), "bamba"])
def test_rows_of_other_lengths_in_one_batch_each_equal_generating_alone(kind, tmp_path):
    source = tmp_path / f"{kind}-hf"
    tiny_lm(kind).save_pretrained(source)
    write_tokenizer(source)
    g = torch2jax.convert_hf(f"hf:{source}", max_cache_len=48, max_batch=4)
    artifact = torch2jax.save(g, tmp_path / kind)
    want = [g.generate(np.array([p]), max_new_tokens=NEW, eos_token_id=[])[0, len(p):].tolist() for p in PROMPTS]
    assert len({tuple(w) for w in want}) == len(PROMPTS), "the prompts must be answered differently"
    service = build_service(artifact, warm_up="short", chunk=16)
    bodies = [{"prompt": words(p), "max_tokens": NEW, "temperature": 0, "ignore_eos": True} for p in PROMPTS]
    answers, _ = asyncio.run(ask_together(service, bodies))
    tokenizer = Tokenizer.from_file(str(source / "tokenizer.json"))
    for answer, tokens in zip(answers, want):
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == tokenizer.decode(tokens, skip_special_tokens=False)
