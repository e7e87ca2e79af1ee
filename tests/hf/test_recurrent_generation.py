"""Causal LMs whose cache keeps a recurrent state (Mamba, Mamba2, and Bamba: Mamba2 layers beside attention layers)
generate what transformers' own `generate` does, before and after save + load, with the state as the artifact's
donated cache; left padding never enters the state."""

from __future__ import annotations

import pytest
import torch

import torch2jax
from torch2jax.generate.generator import GenerationSpec

from .recurrent_checks import check_left_padding, check_round_trip, check_two_chunks, widened


def _configs() -> dict:
    import transformers

    special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, vocab_size=96)
    return {
        "mamba": transformers.MambaConfig(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                                          time_step_rank=4, tie_word_embeddings=False, **special),
        "mamba2": transformers.Mamba2Config(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                                            num_heads=8, head_dim=8, n_groups=2, chunk_size=4, **special),
        "bamba": transformers.BambaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2,
                                          mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4,
                                          attn_layer_indices=[1], tie_word_embeddings=False, **special),
    }


def tiny_lm(kind: str) -> torch.nn.Module:
    """A random tiny model whose greedy tokens vary (recurrent_checks.widened)."""
    import transformers

    torch.manual_seed(0)
    return widened(transformers.AutoModelForCausalLM.from_config(_configs()[kind]))


KINDS = ("mamba", "mamba2", "bamba")


@pytest.fixture(scope="module", params=KINDS)
def converted(request):
    lm = tiny_lm(request.param)
    return request.param, lm, torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)


def test_greedy_tokens_equal_transformers_before_and_after_save_and_load(converted, tmp_path):
    kind, lm, g = converted
    expected_kinds = {"mamba": ("state",) * 4, "mamba2": ("state",) * 4, "bamba": ("state", "state", "kv", "kv")}[kind]
    check_round_trip(lm, g, tmp_path / kind, expected_kinds)
    assert g.spec.cache_dtypes[1] == "float32"  # the SSM state: float32




def test_left_padding_does_not_enter_the_state(converted):
    check_left_padding(converted[2], 96)


def test_a_prompt_in_two_chunks_leaves_the_state_of_the_whole_prompt(converted):
    check_two_chunks(converted[2], 96)


def test_generation_spec_without_kinds_reads_as_a_kv_cache_and_kinds_round_trip():
    """Artifacts written before recurrent state have no `kinds` / `dtypes`: every tensor is a KV tensor of `dtype`."""
    old = {"max_cache_len": 8, "max_batch": 1, "vocab_size": 10, "eos_token_ids": [1], "pad_token_id": 0,
           "cache": {"shapes": [["batch", 2, 9, 4], ["batch", 2, 9, 4]], "dtype": "bfloat16", "donated": True}}
    spec = GenerationSpec.from_json(old)
    assert spec.cache_kinds == () and spec.tensor_dtypes() == ("bfloat16", "bfloat16")
    assert "kinds" not in spec.to_json()["cache"]
    new = GenerationSpec(8, 1, 10, (1,), 0, ((6, 3), (6, 4)), "bfloat16", cache_kinds=("state", "state"),
                         cache_dtypes=("bfloat16", "float32"))
    assert GenerationSpec.from_json(new.to_json()) == new
