"""Greedy generation against transformers' own generate (tiny configs, random weights wide enough that the tokens vary),
before and after save+load, for text models whose transformers code torch.export could not capture over the steps'
caches until a stand-in replaced it: RoFormer's rotary positions counted from the cache's length
(hf/stand_ins/rotary_from_cache.py), X-MOD's per-language adapters (language_adapters.py), FSMT's masks and positions
(fsmt.py) and LED's encoder branch, chunks and one-token decoder mask (led.py); T5Gemma 2, whose merged attention's
decode step exports with SDPA's grouped heads (hf/steps/seq2seq.py sdpa_grouped_heads); and XLM, which transformers generates
as a masked LM, and ProphetNet, whose n-gram attention has no stand-in over the step's cache, refused with their
reasons (refused.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import ExportError
from torch2jax.generate.generator import left_pad
from torch2jax.generate.seq2seq import right_pad
from torch2jax.hf.verify import transformers_greedy

VOCAB, PAD = 96, 0
NEW, CACHE = 10, 32
# weights drawn wider than transformers' 0.02, which makes a tiny model repeat one token and would hide a wrong lowering
# (too wide saturates the post-norm layers into one token again): each model's found to vary its tokens
_STD = {"roformer": 0.3, "xmod": 0.1, "fsmt": 0.1, "led": 0.1, "t5gemma2": 0.04}


def _causal_lm(name: str) -> torch.nn.Module:
    import transformers as tf

    small = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=64, initializer_range=_STD[name], pad_token_id=PAD, is_decoder=True,
                 tie_word_embeddings=False)
    if name == "roformer":
        return tf.RoFormerForCausalLM(tf.RoFormerConfig(**small, embedding_size=32))
    if name == "xmod":  # the second language's adapters: a token routed to the first would show
        return tf.XmodForCausalLM(tf.XmodConfig(**small, languages=["en_XX", "de_DE"], default_language="de_DE"))
    raise KeyError(name)


def _seq2seq(name: str) -> torch.nn.Module:
    import transformers as tf

    if name == "fsmt":
        config = tf.FSMTConfig(langs=["ru", "en"], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32,
                               encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                               decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48,
                               max_position_embeddings=CACHE, init_std=_STD[name], pad_token_id=PAD, bos_token_id=1,
                               eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
                               tie_word_embeddings=False)
        return tf.FSMTForConditionalGeneration(config)
    if name == "led":  # a source of 7 is padded to the attention window (4) inside the encoder
        config = tf.LEDConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=48,
                              decoder_ffn_dim=48, max_encoder_position_embeddings=16,
                              max_decoder_position_embeddings=CACHE, attention_window=4, init_std=_STD[name],
                              pad_token_id=PAD, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                              forced_eos_token_id=None, tie_word_embeddings=False)
        return tf.LEDForConditionalGeneration(config)
    if name == "t5gemma2":  # transformers' tester config (as the sweep records it), its weights but the norms' wider
        from benchmarks.hf_sweep import run

        lm = run.build(run.load_configs()["t5gemma2"], "T5Gemma2ForConditionalGeneration")
        with torch.no_grad():
            for key, param in lm.named_parameters():
                if "norm" not in key:
                    param.normal_(std=_STD[name])
        return lm
    raise KeyError(name)


@pytest.mark.parametrize("name", ["roformer", "xmod"])
def test_causal_lm_left_padded_batch_equals_transformers_generate(name, tmp_path):
    torch.manual_seed(0)
    lm = _causal_lm(name).eval()
    rng = np.random.default_rng(0)
    ids, mask = left_pad([rng.integers(3, VOCAB, n) for n in (9, 5)], PAD)
    want = transformers_greedy(lm, ids, NEW, PAD, mask)
    assert len(np.unique(want[:, ids.shape[1]:])) > 4  # the tokens vary: a wrong lowering would show
    g = torch2jax.convert_hf(lm, task="text-generation", max_cache_len=CACHE, max_batch=2)
    for generator in (g, torch2jax.load(torch2jax.save(g, tmp_path / name))):
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[])
        np.testing.assert_array_equal(got, want)


# LED runs with the slow tests: its encode step is exported twice (a symbolic source length first, which its padding
# to the attention window refuses, then at max_source_len: hf/stand_ins/led.py), 50 s here on a shared machine
@pytest.mark.parametrize("name", ["fsmt", "t5gemma2", pytest.param("led", marks=pytest.mark.slow)])
def test_seq2seq_padded_sources_equal_transformers_generate(name, tmp_path):
    torch.manual_seed(0)
    lm = _seq2seq(name).eval()
    rng = np.random.default_rng(0)
    ids, mask = right_pad([rng.integers(3, VOCAB, n).tolist() for n in (7, 4)], PAD)
    want = transformers_greedy(lm, ids, NEW, PAD, mask)
    assert len(np.unique(want[:, 1:])) > 4 and not np.array_equal(want[0], want[1])  # the source matters
    g = torch2jax.convert_hf(lm, task="text2text-generation", max_cache_len=CACHE, max_batch=2, max_source_len=8)
    for generator in (g, torch2jax.load(torch2jax.save(g, tmp_path / name))):
        got = generator.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[], num_beams=1)
        np.testing.assert_array_equal(got, want)


def test_xlm_generating_as_a_masked_lm_is_refused_with_its_reason():
    import transformers as tf

    lm = tf.XLMWithLMHeadModel(tf.XLMConfig(vocab_size=VOCAB, emb_dim=32, n_layers=1, n_heads=4,
                                            max_position_embeddings=64)).eval()
    with pytest.raises(ExportError, match="XLM generates as a masked LM") as refused:
        torch2jax.convert_hf(lm, task="text-generation", max_cache_len=CACHE, max_batch=2)
    assert "mask token" in str(refused.value) and "torch2jax.convert(model, args)" in str(refused.value)


@pytest.mark.parametrize("task", ["text-generation", "text2text-generation"])
def test_prophetnet_refused_with_its_reason(task):
    import transformers as tf

    config = tf.ProphetNetConfig(vocab_size=VOCAB, hidden_size=32, encoder_ffn_dim=48, decoder_ffn_dim=48,
                                 num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=4,
                                 num_decoder_attention_heads=4, ngram=2, num_buckets=8, relative_max_distance=16,
                                 max_position_embeddings=64, pad_token_id=PAD, decoder_start_token_id=PAD)
    cls = tf.ProphetNetForCausalLM if task == "text-generation" else tf.ProphetNetForConditionalGeneration
    lm = cls(config).eval()
    extra = {"max_source_len": 16} if task == "text2text-generation" else {}
    with pytest.raises(ExportError, match="ProphetNet predicts each token from the first of its n-gram streams"):
        torch2jax.convert_hf(lm, task=task, max_cache_len=CACHE, max_batch=2, **extra)
