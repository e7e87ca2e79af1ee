"""Greedy generation on a left-padded batch against transformers' own generate (tiny configs, random weights wide enough
that the tokens vary), before and after save+load, for causal LMs that torch.export refused until a stand-in replaced
the code it could not capture: Aria's text MoE layer (hf/stand_ins/experts.py) and GIT's model, which branches on the
cache's length (hf/stand_ins/positions.py); and Mllama's text model, whose cross-attention layers keep no cache without an
image (hf/steps/kv_cache.py cache_layout: an empty entry each).

GIT's reference is each row generated alone: on a cached step transformers' GitModel widens a 2-D padding mask by its
image's patch tokens, which a text-only cache does not hold, so a left-padded row of a batch attends to its padding and
not to its first tokens there (its tokens differ from the same row's alone, with or without the cache); the converted
step masks by the row's own padding, and gives the row's tokens alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.generate.generator import left_pad
from torch2jax.hf.verify import transformers_greedy

VOCAB, PAD, BOS, EOS = 96, 0, 1, 2
LENGTHS, NEW, CACHE = (9, 5), 12, 48
_STD = 0.3  # transformers' 0.02 makes a tiny model repeat one token, which would hide a wrong lowering


def _build(name: str) -> torch.nn.Module:
    import transformers as tf

    if name == "aria_text":
        config = tf.AriaTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, moe_num_experts=8, moe_topk=2,
                                   moe_num_shared_experts=2, max_position_embeddings=64, initializer_range=_STD,
                                   pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
        return tf.AriaTextForCausalLM(config)
    if name == "git":
        vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "image_size": 8, "patch_size": 4}
        config = tf.GitConfig(vision_config=vision, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                              num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                              initializer_range=_STD, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
        return tf.GitForCausalLM(config)
    if name == "mllama_text":  # layer 1 a cross-attention layer, which the text-only model skips
        config = tf.MllamaTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, cross_attention_layers=[1],
                                     max_position_embeddings=64, initializer_range=_STD, pad_token_id=PAD,
                                     bos_token_id=BOS, eos_token_id=EOS)
        return tf.MllamaForCausalLM(config)
    raise KeyError(name)


def _padded_batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return left_pad([rng.integers(3, VOCAB, n) for n in LENGTHS], PAD)


# Aria runs with the slow tests: 19-21 s here (its modeling module's first import ~4 s, transformers' generate over its
# experts ~2 s, the export ~5 s and two JAX compiles of the generate loop, before and after load, ~4 s each)
@pytest.mark.parametrize("name", [pytest.param("aria_text", marks=pytest.mark.slow), "git", "mllama_text"])
def test_left_padded_batch_equals_transformers_generate_before_and_after_save_and_load(name, tmp_path):
    torch.manual_seed(0)
    lm = _build(name).eval()
    ids, mask = _padded_batch()
    if name == "git":  # each row alone (see the module's docstring), left-padded back to the batch
        alone = [transformers_greedy(lm, ids[r:r + 1, real], NEW, PAD, mask[r:r + 1, real])[0]
                 for r, real in enumerate(mask)]
        want = np.stack([np.concatenate([ids[r, ~real], alone[r]]) for r, real in enumerate(mask)])
    else:
        want = transformers_greedy(lm, ids, NEW, PAD, mask)
    assert len(np.unique(want[:, ids.shape[1]:])) > 4  # the tokens vary: a wrong lowering would show
    g = torch2jax.convert_hf(lm, task="text-generation", max_cache_len=CACHE, max_batch=2)
    for generator in (g, torch2jax.load(torch2jax.save(g, tmp_path / name))):
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
        assert got.shape == want.shape == (2, ids.shape[1] + NEW)
        np.testing.assert_array_equal(got, want)


def _refused(name: str) -> torch.nn.Module:
    import transformers as tf

    if name == "cpmant":
        return tf.CpmAntForCausalLM(tf.CpmAntConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, dim_head=8,
                                                    dim_ff=64, num_hidden_layers=2, prompt_length=4, prompt_types=3))
    if name == "blt":
        small = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
                 "intermediate_size": 32, "max_position_embeddings": 64}
        return tf.BltForCausalLM(tf.BltConfig(
            vocab_size=VOCAB, max_position_embeddings=64, patch_in_forward=False, cross_attn_k=2, hidden_size=16,
            num_attention_heads=2, num_hidden_layers=1,
            encoder_hash_byte_group_size=[2, 3], encoder_hash_byte_group_vocab=64,
            encoder_config={**small, "vocab_size": 260, "cross_attn_k": 2, "hidden_size_global": 32},
            decoder_config={**small, "vocab_size": VOCAB, "cross_attn_k": 2, "hidden_size_global": 32},
            global_config={**small, "hidden_size": 32}, patcher_config={**small, "vocab_size": 260}))
    raise KeyError(name)


@pytest.mark.parametrize(("name", "cause"), [("cpmant", "prepends its 4 prompt tokens"),
                                             ("blt", "caches two stacks of attention layers")])
def test_models_that_do_not_fit_the_step_are_refused_with_their_own_cause(name, cause):
    from torch2jax.errors import ExportError

    torch.manual_seed(0)
    with pytest.raises(ExportError, match=cause):
        torch2jax.convert_hf(_refused(name).eval(), task="text-generation", max_cache_len=CACHE, max_batch=2)
