"""Causal LMs whose cache keeps a recurrent state (Mamba, Mamba2, and Bamba: Mamba2 layers beside attention layers)
generate what transformers' own `generate` does, before and after save + load, with the state as the artifact's
donated cache; left padding never enters the state."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.generate.generator import GenerationSpec
from torch2jax.hf.verify import check_generation, verify_generation


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
    """A random tiny model whose greedy tokens vary: transformers' init leaves the residual stream near each token's
    embedding, so every step would repeat the last token; projections and embeddings are drawn wider."""
    import transformers

    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(_configs()[kind]).eval()
    with torch.no_grad():
        for module in lm.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0, module.weight.shape[-1] ** -0.5)
            elif isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0, 1)
    return lm


KINDS = ("mamba", "mamba2", "bamba")


@pytest.fixture(scope="module", params=KINDS)
def converted(request):
    lm = tiny_lm(request.param)
    return request.param, lm, torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)


def test_greedy_tokens_equal_transformers_before_and_after_save_and_load(converted, tmp_path):
    kind, lm, g = converted
    expected_kinds = {"mamba": ("state",) * 4, "mamba2": ("state",) * 4, "bamba": ("state", "state", "kv", "kv")}[kind]
    assert g.spec.cache_kinds == expected_kinds
    check_generation(verify_generation(lm, g, tokens=12))
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / kind))
    cache = json.loads((tmp_path / kind / "manifest.json").read_text())["generation"]["cache"]
    assert cache["kinds"] == list(expected_kinds) and cache["dtypes"][1] == "float32"  # the SSM state: float32
    assert loaded.spec.cache_kinds == expected_kinds and loaded.spec.cache_shapes == g.spec.cache_shapes
    check_generation(verify_generation(lm, loaded, tokens=12))


def _prefill(g, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits, cache = g.prefill(g.new_cache(ids.shape[0]), jnp.asarray(ids), jnp.asarray(positions),
                              jnp.arange(ids.shape[1]), jnp.asarray(mask))
    return np.asarray(logits), [np.asarray(c) for c in cache]


def test_left_padding_does_not_enter_the_state(converted):
    """A row padded on the left with arbitrary (non-pad) tokens ends its prompt with the state, and logits, of the row
    alone; the other row of the batch is the longer prompt."""
    kind, _, g = converted
    rng = np.random.default_rng(1)
    short, long = rng.integers(3, 96, 5), rng.integers(3, 96, 9)
    ids = np.stack([np.concatenate([rng.integers(3, 96, 4), short]), long])
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False
    logits, cache = _prefill(g, ids, mask)
    alone_logits, alone_cache = _prefill(g, short[None], np.ones((1, 5), bool))
    np.testing.assert_allclose(logits[0], alone_logits[0], atol=1e-5)
    for kind_of, padded, alone in zip(g.spec.cache_kinds, cache, alone_cache):
        if kind_of == "state":  # a key/value cache keeps the pads' slots (masked); a state has no slots
            np.testing.assert_allclose(padded[0], alone[0], atol=1e-5)
    # and the padded row generates what the row alone does
    together = g.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])[0, 9:]
    assert together.tolist() == g.generate(short[None], max_new_tokens=8, eos_token_id=[])[0, 5:].tolist()


def test_a_prompt_in_two_chunks_leaves_the_state_of_the_whole_prompt(converted):
    """Prefill continues from the cache it is given (as the server's chunked prefill needs), so a prompt run as two
    calls ends with the cache and logits of one call."""
    _, _, g = converted
    ids = np.random.default_rng(2).integers(3, 96, (1, 10))
    whole_logits, whole_cache = _prefill(g, ids, np.ones((1, 10), bool))
    valid = jnp.ones((1, 10), bool)
    positions = jnp.arange(10)[None]
    _, cache = g.prefill(g.new_cache(1), jnp.asarray(ids[:, :6]), positions[:, :6], jnp.arange(6), valid[:, :6])
    logits, cache = g.prefill(cache, jnp.asarray(ids[:, 6:]), positions[:, 6:], jnp.arange(6, 10), valid)
    np.testing.assert_allclose(np.asarray(logits), whole_logits, atol=1e-5)
    for chunked, whole in zip(cache, whole_cache):
        np.testing.assert_allclose(np.asarray(chunked), whole, atol=1e-5)


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
