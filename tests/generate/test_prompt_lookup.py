"""Prompt-lookup decoding (generate/prompt_lookup.py): the same tokens as plain greedy generate (itself tested against
transformers), drafts proposed, accepted and rejected, the n-gram search against a plain Python reading of
transformers' PromptLookupCandidateGenerator, and the settings it refuses."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError, Torch2JaxError
from torch2jax.generate.prompt_lookup import lookup_settings, ngram_draft

from .lms import load_lm, write_lm

CACHE = 64


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookup_lms")
    # gemma2 with one layer (a sliding-window one) keeps what matters here, its soft-capped logits and window, cheaply
    return {"llama": write_lm("llama", root), "gemma2": write_lm("gemma2", root, layers=1)}


@pytest.fixture(scope="module")
def generators(lm_dirs):
    return {name: torch2jax.convert_hf(f"hf:{path}", max_cache_len=CACHE, max_batch=2) for name, path in lm_dirs.items()}


def repeating_prompt(seed: int, span: int = 6) -> np.ndarray:
    """A prompt that repeats a span of random tokens, so that drafts are found (and some accepted)."""
    base = np.random.default_rng(seed).integers(3, 128, span)
    return np.concatenate([base, base, base[: span // 2]])[None]


@pytest.mark.parametrize("name", ["llama", "gemma2"])  # gemma2: sliding-window layers and soft-capped logits
def test_tokens_equal_plain_greedy_with_drafts_accepted_and_rejected(name, generators):
    g = generators[name]
    proposed = accepted = 0
    for seed in range(2):
        ids = repeating_prompt(seed)
        want = g.generate(ids, max_new_tokens=30, eos_token_id=[])
        for k, n in ((4, 2), (10, 3)) if name == "llama" else ((4, 2),):
            got = g.generate(ids, max_new_tokens=30, eos_token_id=[], prompt_lookup_num_tokens=k, max_matching_ngram_size=n)
            np.testing.assert_array_equal(got, want)
            stats = g.prompt_lookup_stats
            assert stats.steps < 29  # fewer verify steps than tokens after the first: some steps emitted several
            proposed, accepted = proposed + stats.proposed, accepted + stats.accepted
    assert 0 < accepted < proposed  # drafts were accepted, and some were rejected


def test_tokens_equal_transformers_prompt_lookup_generate(lm_dirs, generators):
    """transformers' own generate with prompt_lookup_num_tokens (torch eager), same weights."""
    lm = load_lm(lm_dirs["llama"])
    for seed in (0, 1):
        ids = repeating_prompt(seed)
        with torch.no_grad():
            want = lm.generate(torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)), do_sample=False,
                               max_new_tokens=24, min_new_tokens=24, prompt_lookup_num_tokens=4, pad_token_id=0).numpy()
        got = generators["llama"].generate(ids, max_new_tokens=24, eos_token_id=[], prompt_lookup_num_tokens=4)
        np.testing.assert_array_equal(got, want)


def test_end_tokens_and_max_new_tokens_edges(generators):
    g = generators["llama"]
    ids = repeating_prompt(2)
    plain = g.generate(ids, max_new_tokens=30, eos_token_id=[])
    for at in (0, 1, 5, 17):  # the end token first, inside an accepted run of drafts, later
        eos = int(plain[0, ids.shape[1] + at])
        want = g.generate(ids, max_new_tokens=30, eos_token_id=eos)
        got = g.generate(ids, max_new_tokens=30, eos_token_id=eos, prompt_lookup_num_tokens=4)
        np.testing.assert_array_equal(got, want)
    for new in (1, 2, 3, 7, 16, 17, CACHE - ids.shape[1]):  # the last: up to the cache's end
        want = g.generate(ids, max_new_tokens=new, eos_token_id=[])
        got = g.generate(ids, max_new_tokens=new, eos_token_id=[], prompt_lookup_num_tokens=10, max_matching_ngram_size=3)
        np.testing.assert_array_equal(got, want)


def test_stream_and_left_padded_single_row(generators):
    g = generators["llama"]
    ids = repeating_prompt(3)
    want = g.generate(ids, max_new_tokens=20, eos_token_id=[])
    steps = list(g.generate(ids, max_new_tokens=20, eos_token_id=[], prompt_lookup_num_tokens=4, stream=True))
    assert len(steps) == 20 and all(s.shape == (1,) for s in steps)
    np.testing.assert_array_equal(np.stack(steps, axis=1), want[:, ids.shape[1]:])
    padded = np.concatenate([np.zeros((1, 3), ids.dtype), ids], axis=1)  # left padding marked by the mask
    mask = np.concatenate([np.zeros((1, 3), bool), np.ones(ids.shape, bool)], axis=1)
    got = g.generate(padded, attention_mask=mask, max_new_tokens=20, eos_token_id=[], prompt_lookup_num_tokens=4)
    np.testing.assert_array_equal(got[:, 3:], want)


def test_refused_settings_name_the_conflict(generators):
    g = generators["llama"]
    ids = repeating_prompt(0)
    with pytest.raises(InputSpecError, match="do_sample=True"):
        g.generate(ids, do_sample=True, prompt_lookup_num_tokens=4)
    with pytest.raises(InputSpecError, match="num_beams=2"):
        g.generate(ids, num_beams=2, prompt_lookup_num_tokens=4)
    with pytest.raises(InputSpecError, match="repetition"):
        g.generate(ids, repetition_penalty=1.3, prompt_lookup_num_tokens=4)
    with pytest.raises(InputSpecError, match="batch 1"):
        g.generate(np.repeat(ids, 2, axis=0), prompt_lookup_num_tokens=4)
    with pytest.raises(InputSpecError, match="give prompt_lookup_num_tokens too"):
        g.generate(ids, max_matching_ngram_size=2)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputSpecError, match="prompt_lookup_num_tokens must be a positive int"):
            g.generate(ids, prompt_lookup_num_tokens=bad)
    with pytest.raises(Torch2JaxError, match="recurrent state"):
        lookup_settings(4, 2, do_sample=False, num_beams=None, cache_kinds=("kv", "state"))


def reference_draft(tokens: list[int], num_tokens: int, max_ngram: int) -> list[int]:
    """transformers' search, read plainly: for n from the largest down, the first window equal to the last n tokens
    (left to right) whose continuation is not empty gives up to num_tokens tokens after it."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), 0, -1):
        tail = tokens[length - n:]
        for i in range(length - n + 1):
            if tokens[i:i + n] == tail and i + n < length:
                return tokens[i + n:i + n + num_tokens]
    return []


@pytest.mark.parametrize("num_tokens,max_ngram", [(1, 1), (3, 2), (5, 3), (8, 4)])
def test_ngram_search_equals_the_python_reference_on_random_histories(num_tokens, max_ngram):
    rng = np.random.default_rng(num_tokens)
    size = 48
    search = jax.jit(functools.partial(ngram_draft, num_tokens=num_tokens, max_ngram=max_ngram))
    for trial in range(100):
        vocab = int(rng.integers(2, 8))  # small vocabularies: many matches of every n
        length = int(rng.integers(1, size))
        tokens = rng.integers(0, vocab, length).tolist()
        history = np.zeros(size, np.int32)
        history[:length] = tokens
        history[length:] = rng.integers(0, vocab, size - length)  # what lies past the length must not matter
        draft, count = search(jnp.asarray(history), jnp.asarray(length, jnp.int32))
        want = reference_draft(tokens, num_tokens, max_ngram)
        assert int(count) == len(want), (trial, tokens, num_tokens, max_ngram)
        assert np.asarray(draft)[: len(want)].tolist() == want, (trial, tokens, num_tokens, max_ngram)


def test_the_generate_command_takes_prompt_lookup_and_prints_plain_greedy_output(generators, tmp_path):
    """`torch2jax generate --prompt-lookup-num-tokens` (and `complete`, which it calls) print what plain greedy decoding
    prints, from the saved artifact (its prefill and decode run from StableHLO, the verify step from its graph); a
    sampling request's refusal names the setting."""
    from click.testing import CliRunner
    from torch2jax.cli.main import main

    artifact = torch2jax.save(generators["llama"], tmp_path / "llm")
    ids = ",".join(map(str, repeating_prompt(3)[0]))
    runs = [CliRunner().invoke(main, ["generate", str(artifact), "--ids", ids, "--max-new-tokens", "20", *flags])
            for flags in ([], ["--prompt-lookup-num-tokens", "4", "--max-matching-ngram-size", "3"])]
    assert [r.exit_code for r in runs] == [0, 0], [r.output for r in runs]
    assert runs[0].stdout.splitlines()[0] == runs[1].stdout.splitlines()[0]
    sampled = CliRunner().invoke(main, ["generate", str(artifact), "--ids", ids, "--temperature", "0.7",
                                        "--prompt-lookup-num-tokens", "4"])
    assert sampled.exit_code != 0 and "prompt_lookup_num_tokens" in sampled.output
