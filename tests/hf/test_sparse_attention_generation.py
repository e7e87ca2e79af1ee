"""Generation of two families whose cache is more than one set of keys and values per layer, against transformers'
own `generate` on a left-padded batch of two, before and after save + load:

- DeepSeek sparse attention (DeepSeek V3.2, GLM-MoE-DSA): each layer's indexer caches its own keys, a third cache
  tensor written at the step's slots (hf/steps/kv_cache.py), and keeps the `index_topk` best cached keys per query
  (hf/stand_ins/sparse_indexer.py). `index_topk` is smaller than the text here, so the choice of keys shows.
- T5Gemma: an encoder-decoder whose layer counts sit in its encoder/decoder sub-configs, whose code lifts a constant
  in each step's trace, and whose decoder's sliding layers need their own mask (hf/steps/seq2seq.py); the window is
  shorter than the generated text here, so a missing window shows."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import torch2jax
from torch2jax.errors import ExportError
from torch2jax.hf.steps.causal_lm import CacheInputs
from torch2jax.hf.steps.kv_cache import indexer_dims
from torch2jax.hf.verify import check_generation, verify_generation, verify_seq2seq

from .recurrent_checks import check_two_chunks, widened

VOCAB = 96
_SPECIAL = dict(vocab_size=VOCAB, pad_token_id=0, eos_token_id=1, bos_token_id=2)
# multi-head latent attention and a 4-head indexer of width 16 that keeps 3 keys per query
_DSA = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
            n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, index_topk=3, index_head_dim=16,
            index_n_heads=4, mlp_layer_types=["dense", "sparse"], tie_word_embeddings=False, **_SPECIAL)


def _dsa_lm(kind: str) -> torch.nn.Module:
    import transformers

    config = {"deepseek_v32": transformers.DeepseekV32Config,
              "glm_moe_dsa": transformers.GlmMoeDsaConfig}[kind](**_DSA)
    torch.manual_seed(0)
    return widened(transformers.AutoModelForCausalLM.from_config(config))


@pytest.fixture(scope="module", params=["deepseek_v32", pytest.param("glm_moe_dsa", marks=pytest.mark.slow)])
def dsa(request):
    lm = _dsa_lm(request.param)
    return lm, torch2jax.convert_hf(lm, task="text-generation", max_cache_len=32, max_batch=2)


def test_sparse_attention_generates_as_transformers(dsa, tmp_path):
    lm, g = dsa
    # keys, values and the indexer's keys [1, slots, 16] per layer, in the spec and the saved manifest
    assert len(g.spec.cache_shapes) == 3 * 2 and g.spec.cache_shapes[2] == (1, 33, 16)
    result = verify_generation(lm, g, tokens=12)
    check_generation(result)
    # the 3 keys kept per query matter: generating with every key kept gives other tokens
    with torch.no_grad():
        for module in lm.modules():
            if hasattr(module, "index_topk"):
                module.index_topk = 64
        every = verify_generation(lm, g, tokens=12)
        for module in lm.modules():
            if hasattr(module, "index_topk"):
                module.index_topk = 3
    assert [t for _, t in every.rows] != [t for _, t in result.rows]
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / "dsa"))
    cache = json.loads((tmp_path / "dsa" / "manifest.json").read_text())["generation"]["cache"]
    assert len(cache["shapes"]) == 6 and cache["donated"]
    check_generation(verify_generation(lm, loaded, tokens=12))


def test_sparse_attention_prefills_in_chunks(dsa):
    """The indexer's keys are written where the keys are: a prompt prefilled in two calls ends as one call does."""
    check_two_chunks(dsa[1], VOCAB)


def test_indexer_cache_layout_refusals():
    def layer(width=16, dtype=torch.float32, positions=None):
        return SimpleNamespace(indexer_keys=None if width is None else torch.zeros((1, 1, width), dtype=dtype),
                               indexer_position_ids=positions)

    lm = torch.nn.Linear(1, 1)
    assert indexer_dims(lm, [SimpleNamespace(), SimpleNamespace()], torch.float32) == ()
    assert indexer_dims(lm, [layer(), layer(8)], torch.float32) == (16, 8)
    with pytest.raises(ExportError, match="some layers only"):
        indexer_dims(lm, [layer(), layer(None)], torch.float32)
    with pytest.raises(ExportError, match="one dtype"):
        indexer_dims(lm, [layer(dtype=torch.bfloat16)], torch.float32)
    with pytest.raises(ExportError, match="positions"):
        indexer_dims(lm, [layer(positions=torch.zeros(1))], torch.float32)


def test_cache_inputs_with_an_indexer():
    """Layer repetition (deep stacks) reads three cache inputs per layer where the model has an indexer."""
    inputs = CacheInputs(3)
    assert [inputs.layer(f"cache_{i}") for i in range(6)] == [0, 0, 0, 1, 1, 1]
    assert inputs.renamed("cache_2", 2) == "cache_8" and inputs.layer("input_ids") is None
    assert CacheInputs().layer("cache_3") == 1


def _t5gemma() -> torch.nn.Module:
    import transformers

    side = dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, sliding_window=3, layer_types=["sliding_attention", "full_attention"], **_SPECIAL)
    config = transformers.T5GemmaConfig(encoder=dict(side), decoder=dict(side), **_SPECIAL)
    torch.manual_seed(0)
    return transformers.T5GemmaForConditionalGeneration(config).eval()


def test_t5gemma_generates_as_transformers():
    lm = _t5gemma()
    g = torch2jax.convert_hf(lm, task="text2text-generation", max_cache_len=24, max_batch=2, max_source_len=16)
    result = verify_seq2seq(lm, g, tokens=16)
    check_generation(result)
    assert len(set(result.rows[0][1])) > 4  # tokens that vary, past the window of 3
    # (a saved and loaded encoder-decoder is tests/generate/test_seq2seq.py's; the generation sweep checks T5Gemma's)


@pytest.mark.slow  # traces 3 and 4 layers of a 6-layer stack (~2 CPU-minutes)
def test_sparse_attention_layers_repeat():
    """A deep stack traced at 3 and 4 layers and its middle layer repeated reads each layer's three cache tensors."""
    import transformers

    config = dict(_DSA, num_hidden_layers=6, mlp_layer_types=["dense"] * 6)
    torch.manual_seed(0)
    lm = widened(transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV32Config(**config)))
    stages = []
    g = torch2jax.convert_hf(lm, task="text-generation", max_cache_len=32, max_batch=2, repeat_layers=5,
                             progress=lambda stage, *rest, **more: stages.append(stage))
    assert "repeat" in stages
    check_generation(verify_generation(lm, g, tokens=12))
