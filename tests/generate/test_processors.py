"""torch2jax.generate.processors (and sampling's min-p / typical-p): each processor against transformers' own
LogitsProcessor class on random logits, whole generate calls against transformers' generate with the same setting
(a tiny random Llama and T5), the checkpoint's generation config as the artifact's defaults, and bad settings."""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from scipy import stats
from transformers.generation import logits_process as lp

import torch2jax
from torch2jax.errors import Torch2JaxError
from torch2jax.generate import processors
from torch2jax.generate.generator import GenerationSpec
from torch2jax.generate.processors import GenerationSettings
from torch2jax.generate.sampling import filter_logits, sample
from torch2jax.generate.seq2seq import right_pad

from .lms import PAD, build_lm
from .seq2seqs import load_seq2seq, write_seq2seq

V = 40
PENALTY = 1.3  # the Llama fixture's generation config sets it: every call's default


def torch_scores(logits: np.ndarray) -> torch.Tensor:
    return torch.tensor(logits, dtype=torch.float32)


def history_of(rng: np.random.Generator, batch: int, length: int, width: int, vocab: int = 6) -> np.ndarray:
    """[batch, width] ids: `length` real ones from a small alphabet (so n-grams repeat), then junk that must be ignored."""
    out = rng.integers(0, V, (batch, width))
    out[:, :length] = rng.integers(0, vocab, (batch, length))
    return out.astype(np.int32)


# -- each processor against transformers' class, random logits ------------------------------------------------------
def test_repetition_penalty_matches_transformers_per_row_with_left_padding():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, V)).astype(np.float32) * 3
    history = history_of(rng, 3, 9, 16, vocab=V)
    pads = np.array([0, 2, 5])
    penalties = [1.3, 0.7, 2.0]
    ours = np.asarray(processors.repetition_penalty(jnp.asarray(logits), jnp.asarray(history), jnp.asarray(9),
                                                    jnp.asarray(pads), jnp.asarray(penalties, jnp.float32)))
    for r, penalty in enumerate(penalties):
        want = lp.RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=torch.tensor(pads[r:r + 1]))(
            torch.tensor(history[r:r + 1, :9], dtype=torch.long), torch_scores(logits[r:r + 1])).numpy()[0]
        np.testing.assert_array_equal(ours[r], want)
    assert (ours != logits).any(axis=1).all()


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_no_repeat_ngram_matches_transformers(size):
    rng = np.random.default_rng(size)
    logits = rng.standard_normal((4, V)).astype(np.float32)
    for length in (size - 1, size, 7, 12):
        history = history_of(rng, 4, length, 16, vocab=3)
        if length == 12 and size > 1:  # the last n - 1 tokens open the sequence too: their successor there is banned
            history[:, 12 - (size - 1):12] = history[:, : size - 1]
        ours = np.asarray(processors.no_repeat_ngram(jnp.asarray(logits), jnp.asarray(history), jnp.asarray(length), size))
        want = lp.NoRepeatNGramLogitsProcessor(size)(torch.tensor(history[:, :length], dtype=torch.long),
                                                     torch_scores(logits)).numpy()
        np.testing.assert_array_equal(ours, want, err_msg=f"n={size}, length={length}")
        if length == 12:
            assert np.isinf(ours).all(axis=1).any() or np.isinf(ours).any(axis=1).all(), "the test data bans nothing"


def test_bad_words_match_transformers_one_token_and_longer_and_drop_a_lone_end_token():
    rng = np.random.default_rng(3)
    words = [[4], [1, 2], [0, 1, 2], [2, 0, 5], [7], [3, 3]]  # [7] is the end token: transformers drops it
    eos = [7]
    logits = rng.standard_normal((4, V)).astype(np.float32)
    for length in (0, 1, 2, 5, 10):
        history = history_of(rng, 4, length, 16, vocab=4)
        resolved = processors.resolve({"bad_words_ids": words}, GenerationSettings(), 4, V, eos, 0, np.zeros(4), 0)
        assert resolved.processing == processors.Processing(banned=True, bad_sequences=True)
        ours = np.asarray(processors.apply(jnp.asarray(logits), resolved.processing, resolved.arrays, jnp.asarray(history),
                                           jnp.asarray(length)))
        want = lp.NoBadWordsLogitsProcessor(words, eos_token_id=eos)(torch.tensor(history[:, :length], dtype=torch.long),
                                                                      torch_scores(logits)).numpy()
        np.testing.assert_array_equal(ours, want, err_msg=f"length={length}")
    assert np.isfinite(ours[:, 7]).all()


def test_min_length_and_min_new_tokens_match_transformers():
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((2, V)).astype(np.float32)
    eos, prompt = [2, 9], 5
    for setting, cls in (({"min_length": 8}, lambda: lp.MinLengthLogitsProcessor(8, eos)),
                         ({"min_new_tokens": 3}, lambda: lp.MinNewTokensLengthLogitsProcessor(prompt, 3, eos))):
        resolved = processors.resolve(setting, GenerationSettings(), 2, V, eos, prompt, np.zeros(2), prompt)
        for length in range(prompt, 10):
            ours = np.asarray(processors.apply(jnp.asarray(logits), resolved.processing, resolved.arrays, None,
                                               jnp.asarray(length)))
            want = cls()(torch.zeros((2, length), dtype=torch.long), torch_scores(logits)).numpy()
            np.testing.assert_array_equal(ours, want, err_msg=f"{setting}, length={length}")
    per_row = processors.resolve({"min_new_tokens": [1, 4]}, GenerationSettings(), 2, V, eos, prompt, np.zeros(2), prompt)
    ours = np.asarray(processors.apply(jnp.asarray(logits), per_row.processing, per_row.arrays, None, jnp.asarray(prompt + 2)))
    assert np.isfinite(ours[0, eos]).all() and np.isinf(ours[1, eos]).all()


def test_suppress_and_begin_suppress_match_transformers():
    """Ids past the vocabulary (Whisper's generation config on a model built with a smaller one) are ignored, as
    transformers' processors ignore them."""
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((2, V)).astype(np.float32)
    suppress, begin = [1, 5, V + 7], [3, 8, V, V + 100]
    resolved = processors.resolve({"suppress_tokens": suppress, "begin_suppress_tokens": begin}, GenerationSettings(), 2,
                                  V, [], 6, np.zeros(2), 6)
    chain = lp.LogitsProcessorList([lp.SuppressTokensLogitsProcessor(suppress), lp.SuppressTokensAtBeginLogitsProcessor(begin, 6)])
    for length in (5, 6, 7):
        ours = np.asarray(processors.apply(jnp.asarray(logits), resolved.processing, resolved.arrays, None, jnp.asarray(length)))
        want = chain(torch.zeros((2, length), dtype=torch.long), torch_scores(logits)).numpy()
        np.testing.assert_array_equal(ours, want, err_msg=f"length={length}")


# -- min-p and typical-p against transformers' warpers -----------------------------------------------------------------
def hf_warped(row: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float, typical_p: float) -> np.ndarray:
    """One row through transformers' warpers in _get_logits_processor's order, skipping the ones that are off."""
    chain = [lp.TemperatureLogitsWarper(temperature)]
    chain += [lp.TopKLogitsWarper(top_k)] if top_k else []
    chain += [lp.TopPLogitsWarper(top_p)] if top_p < 1 else []
    chain += [lp.MinPLogitsWarper(min_p)]
    chain += [lp.TypicalLogitsWarper(typical_p)] if typical_p < 1 else []
    return lp.LogitsProcessorList(chain)(None, torch_scores(row[None])).numpy()[0]


CASES = [  # temperature, top_k, top_p, min_p, typical_p
    (1.0, 0, 1.0, 0.05, 1.0), (1.0, 0, 1.0, 0.3, 1.0), (0.7, 0, 1.0, 0.1, 1.0), (1.0, 0, 1.0, 0.0, 0.5),
    (1.0, 0, 1.0, 0.0, 0.9), (1.3, 0, 1.0, 0.0, 0.2), (1.0, 20, 0.9, 0.05, 0.8), (0.8, 10, 1.0, 0.2, 0.6),
]


def test_min_p_and_typical_p_keep_transformers_tokens_and_probabilities():
    rng = np.random.default_rng(6)
    logits = (rng.standard_normal((len(CASES), 4, V)) * rng.uniform(0.5, 4, (len(CASES), 4, 1))).astype(np.float32)
    for case, rows in zip(CASES, logits):
        t, k, p, m, typical = case
        ours = np.asarray(filter_logits(jnp.asarray(rows), t, k, p, min_p=jnp.full((4,), m), typical_p=jnp.full((4,), typical)))
        for row, got in zip(rows, ours):
            want = hf_warped(row, t, k, p, m, typical)
            kept = np.isfinite(want)
            np.testing.assert_array_equal(np.isfinite(got), kept, err_msg=f"kept set differs: {case}")
            assert 1 <= kept.sum() < V or (m == 0 and typical == 1), f"the case filters nothing: {case}"
            np.testing.assert_allclose(jax.nn.softmax(got), torch.softmax(torch.tensor(want), -1).numpy(), rtol=0, atol=1e-6)


def test_min_p_and_typical_p_per_row_with_rows_off():
    rng = np.random.default_rng(7)
    rows = (rng.standard_normal((3, V)) * 3).astype(np.float32)
    ours = np.asarray(filter_logits(jnp.asarray(rows), 1.0, 0, 1.0, min_p=jnp.asarray([0.2, 0.0, 0.0]),
                                    typical_p=jnp.asarray([1.0, 0.5, 1.0])))
    for r, (m, typical) in enumerate([(0.2, 1.0), (0.0, 0.5), (0.0, 1.0)]):
        np.testing.assert_array_equal(np.isfinite(ours[r]), np.isfinite(hf_warped(rows[r], 1.0, 0, 1.0, m, typical)))
    assert np.isfinite(ours[2]).all()


@pytest.mark.parametrize("setting", [{"min_p": 0.15}, {"typical_p": 0.6}])
def test_draws_follow_the_filtered_distribution(setting):
    """40,000 draws of one row: tokens transformers' warper removes never come, and the kept tokens' frequencies fit
    its probabilities (chi-square, p > 1e-4: a correct sampler fails 1 run in 10,000)."""
    rows = np.random.default_rng(8).standard_normal((1, 12)).astype(np.float32) * 1.5
    want = torch.softmax(torch.tensor(hf_warped(rows[0], 1.0, 0, 1.0, setting.get("min_p", 0.0), setting.get("typical_p", 1.0))),
                         -1).numpy()
    kept = want > 0
    assert 2 <= kept.sum() < 12
    args = {k: jnp.asarray([v]) for k, v in setting.items()}
    draw = jax.jit(jax.vmap(lambda key: sample(jnp.asarray(rows), key, 1.0, 0, 1.0, **args)[0]))
    tokens = np.asarray(draw(jax.random.split(jax.random.key(11), 40_000)))
    counts = np.bincount(tokens, minlength=12)
    assert counts[~kept].sum() == 0
    expected = want[kept].astype(np.float64) / want[kept].sum() * counts.sum()
    statistic = (((counts[kept] - expected) ** 2) / expected).sum()
    assert stats.chi2.sf(statistic, df=kept.sum() - 1) > 1e-4


# -- settings: validation, the generation config ----------------------------------------------------------------------
@pytest.mark.parametrize("setting, message", [
    ({"repetition_penalty": 0.0}, r"repetition_penalty must be a finite number > 0 \(1.0 turns it off"),
    ({"repetition_penalty": [1.2, -1.0]}, r"repetition_penalty .* \(got -1.0 at row 1\)"),
    ({"no_repeat_ngram_size": -1}, r"no_repeat_ngram_size must be an integer >= 0"),
    ({"no_repeat_ngram_size": 2.5}, r"no_repeat_ngram_size must be an integer >= 0"),
    ({"min_new_tokens": 1.5}, r"min_new_tokens must be an integer >= 0"),
    ({"min_length": -3}, r"min_length must be an integer >= 0"),
    ({"suppress_tokens": [3, -1]}, r"suppress_tokens must be a list of token ids >= 0 .* \(got -1"),
    ({"begin_suppress_tokens": 5}, r"begin_suppress_tokens must be a list of token ids"),
    ({"bad_words_ids": [[3, 40]]}, r"bad_words_ids must be a list of token ids >= 0 and < 40 \(got 40"),
    ({"bad_words_ids": []}, r"bad_words_ids must be a non-empty list of token id lists"),
    ({"bad_words_ids": [[1], []]}, r"bad_words_ids must not hold an empty word"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
    ({"typical_p": 0.0}, r"typical_p must be in \(0, 1\]"),
    ({"num_beams": 4}, r"unknown generation settings \['num_beams'\]"),
])
def test_bad_settings_name_the_argument_and_range(setting, message):
    with pytest.raises(Torch2JaxError, match=message):
        processors.resolve(setting, GenerationSettings(), 2, V, [2], 3, np.zeros(2), 3)


def test_generation_config_becomes_settings_and_survives_the_manifest():
    config = transformers.GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9, repetition_penalty=1.1,
                                           suppress_tokens=[5], bad_words_ids=[[3, 4]], min_new_tokens=2)
    settings = GenerationSettings.from_config(config)
    assert settings == GenerationSettings(do_sample=True, temperature=0.6, top_p=0.9, repetition_penalty=1.1,
                                          suppress_tokens=(5,), bad_words_ids=((3, 4),), min_new_tokens=2)
    spec = GenerationSpec(64, 2, 128, (2,), 0, ((2, 64, 16),), "float32", settings=settings)
    assert GenerationSpec.from_json(spec.to_json()) == spec
    resolved = processors.resolve({"temperature": 1.5, "repetition_penalty": 1.0}, settings, 1, 128, [2], 3, np.zeros(1), 3)
    assert (resolved.do_sample, resolved.temperature, resolved.top_p) == (True, 1.5, 0.9)  # the call's value wins
    assert not resolved.processing.repetition and resolved.processing.banned and resolved.processing.min_length
    with pytest.warns(UserWarning, match=r"sets encoder_repetition_penalty=1.2, which torch2jax's generate does not apply"):
        unapplied = GenerationSettings.from_config(transformers.GenerationConfig(encoder_repetition_penalty=1.2))
    assert unapplied.not_applied == ("encoder_repetition_penalty=1.2",)


# -- whole generate calls against transformers' generate --------------------------------------------------------------
@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama whose generation config sets repetition_penalty (converted: the artifact's default)."""
    lm = build_lm("llama")
    lm.generation_config.repetition_penalty = PENALTY
    return lm, torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)


def prompts():
    ids = np.random.default_rng(0).integers(3, 128, (2, 7))
    mask = np.ones_like(ids)
    mask[1, :3] = 0
    ids[1, :3] = PAD
    return ids, mask


def ours_and_theirs(g, lm, new: int = 12, ids=None, mask=None, **setting):
    if ids is None:
        ids, mask = prompts()
    ours = g.generate(ids, attention_mask=mask, max_new_tokens=new, **setting)
    with torch.no_grad():
        theirs = lm.generate(torch.tensor(ids), attention_mask=None if mask is None else torch.tensor(mask), max_new_tokens=new,
                             do_sample=False, pad_token_id=PAD, **setting).numpy()
    np.testing.assert_array_equal(ours, theirs, err_msg=f"differs from transformers with {setting}")
    return ours


def test_llama_repetition_penalty_default_from_the_generation_config(llama):
    lm, g = llama
    assert g.spec.settings.repetition_penalty == PENALTY
    default = ours_and_theirs(g, lm)  # transformers reads the same generation config
    off = ours_and_theirs(g, lm, repetition_penalty=1.0)
    assert (default != off).any()


def test_llama_no_repeat_ngram_size(llama):
    lm, g = llama
    plain = ours_and_theirs(g, lm, repetition_penalty=1.0)
    grams = {tuple(plain[1, i:i + 2]) for i in range(plain.shape[1] - 1)}
    assert len(grams) < plain.shape[1] - 1, "the plain output repeats no bigram: the test would prove nothing"
    banned = ours_and_theirs(g, lm, repetition_penalty=1.0, no_repeat_ngram_size=2)
    assert (banned != plain).any()
    for row, pad in zip(banned, (0, 3)):
        grams = [tuple(row[i:i + 2]) for i in range(pad, len(row) - 1)]
        assert len(set(grams)) == len(grams)


def test_llama_min_new_tokens_and_min_length(llama):
    lm, g = llama
    ids, mask = prompts()
    plain = ours_and_theirs(g, lm, eos_token_id=[])
    end = int(plain[0, 7 + 2])  # row 0's third new token, made the end token: row 0 stops there
    assert end not in plain[0, 7:9]
    stopped = ours_and_theirs(g, lm, eos_token_id=end)
    assert (stopped[0, 10:] == PAD).all()
    longer = ours_and_theirs(g, lm, eos_token_id=end, min_new_tokens=6)
    assert (longer[0, 10:13] != PAD).all() and end not in longer[0, 7:13]
    np.testing.assert_array_equal(ours_and_theirs(g, lm, eos_token_id=end, min_length=13), longer)
    per_row = g.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=end, min_new_tokens=[6, 0])
    np.testing.assert_array_equal(per_row[0], longer[0])


def test_llama_bad_words(llama):
    lm, g = llama
    plain = ours_and_theirs(g, lm)
    word, pair = int(plain[0, 7]), [int(t) for t in plain[1, 8:10]]
    banned = ours_and_theirs(g, lm, bad_words_ids=[[word], pair])
    assert (banned != plain).any() and word not in banned[:, 7:]
    assert not any(list(banned[1, i:i + 2]) == pair for i in range(7, 18))


def test_llama_suppress_and_begin_suppress(llama):
    lm, g = llama
    plain = ours_and_theirs(g, lm)
    firsts = sorted({int(t) for t in plain[:, 7]})
    suppressed = ours_and_theirs(g, lm, suppress_tokens=firsts)
    assert not np.isin(suppressed[:, 7:], firsts).any() and (suppressed != plain).any()
    begin = ours_and_theirs(g, lm, begin_suppress_tokens=firsts)
    assert not np.isin(begin[:, 7], firsts).any()


def test_llama_sampling_defaults_and_warpers_from_the_settings(llama):
    """An artifact whose generation config samples (with min-p and typical-p) samples by default, as the explicit
    call does; the steps' draws over a batch are the warpers' (tested above on logits)."""
    _, g = llama
    ids, mask = prompts()
    saved = g.spec
    g.spec = dataclasses.replace(saved, settings=dataclasses.replace(saved.settings, do_sample=True, min_p=0.05, typical_p=0.9))
    try:
        by_default = g.generate(ids, attention_mask=mask, max_new_tokens=10, rng=jax.random.key(3))
    finally:
        g.spec = saved
    explicit = g.generate(ids, attention_mask=mask, max_new_tokens=10, rng=jax.random.key(3), do_sample=True, min_p=0.05,
                          typical_p=0.9)
    np.testing.assert_array_equal(by_default, explicit)
    greedy = g.generate(ids, attention_mask=mask, max_new_tokens=10)
    assert (explicit != greedy).any()


def test_not_applied_settings_warn_at_generate(llama):
    _, g = llama
    ids, mask = prompts()
    saved = g.spec
    g.spec = dataclasses.replace(saved, settings=dataclasses.replace(saved.settings, not_applied=("num_beams=4",)))
    try:
        with pytest.warns(UserWarning, match="num_beams=4"):
            g.generate(ids, attention_mask=mask, max_new_tokens=2)
    finally:
        g.spec = saved
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g.generate(ids, attention_mask=mask, max_new_tokens=2)


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    path = write_seq2seq("t5", tmp_path_factory.mktemp("t5"))
    return load_seq2seq(path), torch2jax.convert_hf(f"hf:{path}", max_cache_len=24, max_batch=2, max_source_len=16)


def test_t5_repetition_penalty_no_repeat_ngram_and_min_new_tokens(t5):
    lm, g = t5
    ids, mask = right_pad([np.random.default_rng(1).integers(3, 128, 9).tolist(), [5, 9, 11, 40, 7, 3]], PAD)
    run = lambda **setting: ours_and_theirs(g, lm, 12, ids, mask, **setting)  # noqa: E731
    plain = run()
    assert (run(repetition_penalty=1.3) != plain).any()
    assert (run(no_repeat_ngram_size=2) != plain).any()
    end = int(plain[1, 1])  # row 1's first new token as the end token: it stops at once, unless min_new_tokens
    assert (run(eos_token_id=end)[1, 2:] == PAD).all()
    longer = run(eos_token_id=end, min_new_tokens=4)
    assert end not in longer[1, 1:5]
