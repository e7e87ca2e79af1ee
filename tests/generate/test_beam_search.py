"""Beam search (generate/beam.py) against transformers' own generate(num_beams=...), token for token, same weights
(tiny random configs): a causal LM (Llama, a left-padded batch) and encoder-decoders (T5, BART, Marian, a right-padded
batch), 4 beams, 24 new tokens. Random tiny models repeat a token or two; the end token of each model (END) is one its
beams emit after some tokens, so that beams end at different lengths and the finished set, the length penalty and
early stopping decide the result (each test checks that a sequence ended before the last new token, or that the
settings changed the result). T5's and BART's weights are drawn larger than their init (which makes one token win
every step), so that their rows differ."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.generator import left_pad
from torch2jax.generate.processors import GenerationSettings
from torch2jax.generate.seq2seq import right_pad

from .lms import build_lm
from .seq2seqs import build_seq2seq

PAD, NEW, BEAMS = 0, 24, 4
END = {"llama": 12, "t5": 16, "bart": 45, "marian": 45}  # measured with transformers: beams end at 6, 20, 8, 11 and 17
WEIGHT_STD = {"t5": 0.3, "bart": 0.15}


def marian():
    import transformers as tf

    return tf.MarianMTModel(tf.MarianConfig(
        vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128, pad_token_id=PAD, eos_token_id=2,
        decoder_start_token_id=PAD, forced_eos_token_id=2))  # Marian starts from its pad token


@pytest.fixture(scope="module")
def models():
    """name -> (the transformers model, its converted generator, a batch of two prompts / sources), converted once."""
    done: dict = {}

    def get(name: str):
        if name not in done:
            rng = np.random.default_rng(0)
            rows = [rng.integers(3, 128, 9).tolist(), rng.integers(3, 128, 5).tolist()]
            if name == "llama":
                lm = build_lm("llama")
                g = torch2jax.convert_hf(lm, max_cache_len=64, max_batch=2 * BEAMS)
                batch = left_pad(rows, PAD)
            else:
                torch.manual_seed(0)
                lm = (marian() if name == "marian" else build_seq2seq(name)).eval()
                with torch.no_grad():
                    for param in lm.parameters() if name in WEIGHT_STD else ():
                        if param.dim() > 1:
                            param.normal_(0, WEIGHT_STD[name])
                    if name == "bart":  # a nonzero final_logits_bias, as in test_seq2seq
                        lm.final_logits_bias.normal_(0, 0.5)
                g = torch2jax.convert_hf(lm, task="text2text-generation", max_cache_len=32, max_batch=2 * BEAMS,
                                         max_source_len=16)
                batch = right_pad(rows, PAD)
            done[name] = lm, g, batch
        return done[name]

    return get


def theirs(lm, batch, eos, **settings) -> np.ndarray:
    ids, mask = batch
    with torch.no_grad():
        return lm.generate(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask).long(), max_new_tokens=NEW,
                           do_sample=False, pad_token_id=PAD, eos_token_id=eos, **settings).numpy()


def ours(g, batch, eos, **settings) -> np.ndarray:
    ids, mask = batch
    return g.generate(ids, attention_mask=mask, max_new_tokens=NEW, eos_token_id=[] if eos is None else eos, **settings)


def both(lm, g, batch, eos, **settings) -> np.ndarray:
    want = theirs(lm, batch, eos, num_beams=BEAMS, **settings)
    got = ours(g, batch, eos, num_beams=BEAMS, **settings)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
    return got


def ended_early(out: np.ndarray, prefix: int, eos: int) -> bool:
    """Whether some row's sequence ends before its 24th new token."""
    return any(eos in row[prefix : prefix + NEW - 1].tolist() for row in out)


# T5 and Marian with the slow tests: BART covers encoder-decoder beams by default (Marian is its architecture with
# sinusoidal positions, which the seq2seq generation tests cover)
@pytest.mark.parametrize("name", ["llama", pytest.param("t5", marks=pytest.mark.slow), "bart",
                                  pytest.param("marian", marks=pytest.mark.slow)])
def test_beam_search_equals_transformers(name, models):
    """4 beams, 24 new tokens, a batch of two prompts of different lengths, equal to transformers' generate."""
    lm, g, batch = models(name)
    prefix, eos = batch[0].shape[1] if name == "llama" else 1, END[name]
    got = both(lm, g, batch, eos)
    assert got.shape[0] == 2 and ended_early(got, prefix, eos)
    greedy = theirs(lm, batch, eos)
    assert greedy.shape != got.shape or (greedy != got).any(), "beam search gives the greedy tokens here: it proves little"
    if name == "llama":  # a left-padded batch gives each prompt what it gives alone
        ids, mask = batch
        for row in range(2):
            alone = ids[row][mask[row]][None]
            new = g.generate(alone, max_new_tokens=NEW, eos_token_id=eos, num_beams=BEAMS)[0, alone.shape[1]:]
            mine = got[row, ids.shape[1]:]
            np.testing.assert_array_equal(mine[: len(new)], new)
            assert (mine[len(new):] == eos).all()  # after its end, transformers' fill (the end token where pad is 0)


def test_length_penalty_and_early_stopping(models):
    """length_penalty 0.3 and 2.0, early_stopping False, True and "never": each equal to transformers'; here a short
    sequence wins at 0.3 and a long one at 2.0, where early_stopping=True settles for the first four finished."""
    lm, g, batch = models("llama")
    eos = END["llama"]
    short = both(lm, g, batch, eos, length_penalty=0.3)
    long = both(lm, g, batch, eos, length_penalty=2.0, early_stopping=False)
    first_four = both(lm, g, batch, eos, length_penalty=2.0, early_stopping=True)
    both(lm, g, batch, eos, length_penalty=2.0, early_stopping="never")
    assert short.shape[1] < long.shape[1] and ended_early(short, batch[0].shape[1], eos)
    assert (long != first_four).any()


def test_num_return_sequences(models):
    """num_return_sequences=2: [2B, 1 + new], each source's best two finished beams, in transformers' order."""
    lm, g, batch = models("bart")
    eos = END["bart"]
    got = both(lm, g, batch, eos, num_return_sequences=2)
    assert got.shape[0] == 4 and (got[0] != got[1]).any() and (got[2] != got[3]).any()


def test_no_repeat_ngram_with_beams(models):
    """A logits processor over each beam's own tokens (no_repeat_ngram_size=2), applied to the log-probabilities."""
    lm, g, batch = models("bart")
    eos = END["bart"]
    plain = both(lm, g, batch, eos)
    processed = both(lm, g, batch, eos, no_repeat_ngram_size=2)
    assert plain.shape != processed.shape or (plain != processed).any()
    for row in processed:  # no bigram twice in a row's new tokens (up to its end)
        tokens = row[1:].tolist()
        tokens = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
        bigrams = list(zip(tokens, tokens[1:]))
        assert len(bigrams) == len(set(bigrams))


def test_generation_config_beams_are_the_default(models):
    """A checkpoint whose generation config sets num_beams / length_penalty beam-searches by default, as
    transformers' generate does; the config values survive the manifest."""
    import transformers

    settings = GenerationSettings.from_config(transformers.GenerationConfig(num_beams=4, length_penalty=0.6,
                                                                            early_stopping="never"))
    assert (settings.num_beams, settings.length_penalty, settings.early_stopping, settings.not_applied) == (4, 0.6, "never", ())
    assert GenerationSettings.from_json(settings.to_json()) == settings
    lm, g, batch = models("marian")
    eos = END["marian"]
    saved = g.spec
    g.spec = dataclasses.replace(saved, settings=dataclasses.replace(saved.settings, num_beams=BEAMS, length_penalty=0.6))
    try:
        by_default = ours(g, batch, eos)
    finally:
        g.spec = saved
    want = theirs(lm, batch, eos, num_beams=BEAMS, length_penalty=0.6)
    np.testing.assert_array_equal(by_default, want)
    greedy = theirs(lm, batch, eos)
    assert greedy.shape != want.shape or (greedy != want).any(), "beam search gives the greedy tokens here: it proves little"


def test_beam_settings_refused_clearly(models):
    _, g, batch = models("llama")
    ids, mask = batch
    cases = [
        (dict(num_beams=4, do_sample=True), r"beam sampling .* not supported"),
        (dict(num_beams=4, stream=True), r"stream=True .* beam search"),
        (dict(num_beams=2, num_return_sequences=3), r"num_return_sequences \(3\) must be at most num_beams \(2\)"),
        (dict(num_return_sequences=2), r"num_return_sequences=2 needs beam search"),
        (dict(num_beams=5), r"2 prompt\(s\) x num_beams=5 make 10 rows, more than this artifact's max_batch \(8\)"),
        (dict(num_beams=0), r"num_beams must be an integer >= 1"),
        (dict(num_beams=2, early_stopping="sometimes"), r"early_stopping must be True, False or \"never\""),
        (dict(num_beams=2, length_penalty=float("nan")), r"length_penalty must be a finite number"),
        (dict(num_beams=2, repetition_penalty=[1.1, 1.2, 1.3]), r"repetition_penalty must be .* one value per prompt"),
    ]
    for settings, message in cases:
        with pytest.raises(InputSpecError, match=message):
            g.generate(ids, attention_mask=mask, max_new_tokens=4, **settings)
