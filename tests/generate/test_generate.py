"""Generation from a converted causal LM against transformers' own generate, same weights (random, small configs)."""

from __future__ import annotations

from unittest import mock

import jax
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import InputSpecError
from torch2jax.generate.generator import left_pad
from torch2jax.runtime import artifact

from ..helpers import run_without_torch
from .lms import ARCHITECTURES, EOS, PAD, hf_greedy, load_lm, write_lm

CACHE, BATCH = 64, 4


@pytest.fixture(scope="module")
def lm_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lms")
    return {name: write_lm(name, root) for name in ARCHITECTURES}


@pytest.fixture(scope="module")
def generators(lm_dirs):
    cache = {}

    def get(name: str, dtype: str | None = None):
        if (name, dtype) not in cache:
            cache[name, dtype] = torch2jax.convert_hf(f"hf:{lm_dirs[name]}", max_cache_len=CACHE, max_batch=BATCH, dtype=dtype)
        return cache[name, dtype]

    return get


def prompt(length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 128, (1, length))


# Gemma (Gemma 2 holds its scaled embedding and offset norms), Qwen2 (Qwen2-MoE its attention biases) and Mistral (Gemma 2
# its sliding window) in the slow tier: their paths are tested beside them (make test-slow)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("gemma", "qwen2", "mistral") else n
                                  for n in ARCHITECTURES])
def test_greedy_tokens_equal_transformers_generate(name, lm_dirs, generators):
    ids = prompt(10)
    want = hf_greedy(load_lm(lm_dirs[name]), torch.from_numpy(ids), 32)
    got = generators(name).generate(ids, max_new_tokens=32, eos_token_id=[])
    assert got.shape == want.shape == (1, 42)
    np.testing.assert_array_equal(got, want)


def test_bfloat16_greedy_starts_with_transformers_tokens(lm_dirs, generators):
    """bfloat16 rule: the first 8 new tokens equal transformers' bfloat16 greedy tokens (later ones may part at a
    near-tie of two logits, where rounding order decides); measured: 32 of 32 on these configs."""
    lm = load_lm(lm_dirs["llama"], torch.bfloat16)
    g = generators("llama", "bfloat16")
    assert g.spec.cache_dtype == "bfloat16" and {str(p.dtype) for p in g.params.values()} == {"bfloat16"}
    for seed in range(3):
        ids = prompt(8, seed)
        want = hf_greedy(lm, torch.from_numpy(ids), 16)
        got = g.generate(ids, max_new_tokens=16, eos_token_id=[])
        np.testing.assert_array_equal(got[:, :16], want[:, :16])


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "gpt_neo"])
def test_left_padded_batch_gives_each_row_what_it_gives_alone(name, generators):
    g = generators(name)
    prompts = [prompt(11, 1)[0], prompt(4, 2)[0], prompt(7, 3)[0]]
    ids, mask = left_pad(prompts, PAD)
    width = ids.shape[1]
    batch = g.generate(ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    for row, p in enumerate(prompts):
        alone = g.generate(p[None], max_new_tokens=24, eos_token_id=[])
        np.testing.assert_array_equal(batch[row, width:], alone[0, len(p):])


@pytest.mark.parametrize("name", ["llama", "gpt_neo"])
def test_padded_batch_equals_transformers_with_its_mask(name, lm_dirs, generators):
    ids = np.array([[PAD, PAD, PAD, 5, 9, 33], [1, 77, 3, 40, 41, 42]])
    mask = ids != PAD
    want = hf_greedy(load_lm(lm_dirs[name]), torch.from_numpy(ids), 20, torch.from_numpy(mask).long())
    np.testing.assert_array_equal(generators(name).generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[]), want)


def test_end_token_stops_a_row_and_pads_it_like_transformers(lm_dirs, generators):
    g = generators("llama")
    ids = np.concatenate([prompt(6, 4), prompt(6, 5)])
    free = g.generate(ids, max_new_tokens=20, eos_token_id=[])
    end = int(free[0, 6 + 3])  # row 0's fourth new token becomes the end token
    got = g.generate(ids, max_new_tokens=20, eos_token_id=end)
    want = hf_greedy(load_lm(lm_dirs["llama"]), torch.from_numpy(ids), 20, eos=end)
    np.testing.assert_array_equal(got, want)
    first_end = int(np.argmax(got[0, 6:] == end))
    assert first_end <= 3 and (got[0, 6 + first_end + 1:] == PAD).all()


def test_generation_stops_when_every_row_has_ended(generators):
    g = generators("llama")
    ids = prompt(6, 6)
    free = g.generate(ids, max_new_tokens=12, eos_token_id=[])
    got = g.generate(ids, max_new_tokens=12, eos_token_id=int(free[0, 6 + 2]))
    assert got.shape[1] <= 6 + 3 and got[0, -1] == free[0, 6 + 2]


def test_max_new_tokens_and_streaming(generators):
    g = generators("llama")
    ids = prompt(5, 7)
    full = g.generate(ids, max_new_tokens=9, eos_token_id=[])
    assert full.shape == (1, 14)
    steps = list(g.generate(ids, max_new_tokens=9, eos_token_id=[], stream=True))
    assert len(steps) == 9 and all(s.shape == (1,) for s in steps)
    np.testing.assert_array_equal(np.stack(steps, 1), full[:, 5:])


def test_decode_blocks_give_the_tokens_of_one_step_per_call(generators, monkeypatch):
    """Decode steps run `steps_per_call` at a time in one compiled loop: greedy and seeded sampled tokens are those of
    one step per call, blocks stop at a span's end (64 slots here) and once every row has ended, and the host makes
    one decode call per block."""
    g = generators("llama")
    ids = np.concatenate([prompt(6, 10), prompt(6, 11)])
    runs, calls, decode = {}, [], g._decode
    monkeypatch.setattr(g, "_decode", lambda *a, **k: calls.append(k["size"]) or decode(*a, **k))
    for size in (1, 5, 16):
        g.steps_per_call = size
        calls.clear()
        runs[size] = (g.generate(ids, max_new_tokens=40, eos_token_id=[]),
                      g.generate(ids, max_new_tokens=40, do_sample=True, top_p=0.9, rng=jax.random.key(5), eos_token_id=[]),
                      len(calls) // 2)
    monkeypatch.undo()
    g.steps_per_call = 16
    for size in (5, 16):
        np.testing.assert_array_equal(runs[size][0], runs[1][0])
        np.testing.assert_array_equal(runs[size][1], runs[1][1])
    assert [runs[size][2] for size in (1, 5, 16)] == [39, 8, 3]  # 39 decode steps after the prefill's token
    free = runs[1][0][1:]
    end = int(free[0, 6 + 9])  # the row's 10th new token ends it, inside the first block
    stop = 6 + int(np.argmax(free[0, 6:] == end)) + 1
    np.testing.assert_array_equal(g.generate(ids[1:], max_new_tokens=40, eos_token_id=end), free[:, :stop])


def test_bad_requests_fail_before_anything_runs(generators):
    g = generators("llama")
    with pytest.raises(InputSpecError, match=r"a prompt of 60 tokens plus max_new_tokens=8 needs 68 cache slots, more than .* \(64\)"):
        g.generate(prompt(60), max_new_tokens=8)
    with pytest.raises(InputSpecError, match=r"batch of 5 prompts: this artifact was converted for 1 to 4"):
        g.generate(np.ones((5, 3), np.int64))
    with pytest.raises(InputSpecError, match="pad prompts on the left"):
        g.generate(np.array([[5, 6, PAD]]), attention_mask=np.array([[1, 1, 0]]))
    with pytest.raises(InputSpecError, match=r"outside the vocabulary \[0, 128\)"):
        g.generate(np.array([[5, 600]]))
    with pytest.raises(torch2jax.Torch2JaxError, match="temperature must be > 0"):
        g.generate(prompt(3), do_sample=True, temperature=0.0)


def test_an_image_token_past_the_text_vocabulary_passes_the_prompt_check():
    """A vision-language model's image token may lie past its text vocabulary (GOT-OCR2's over a shrunk one): its step
    embeds that id as token 0, so the check takes it, and still refuses any other id past the vocabulary."""
    from types import SimpleNamespace

    from torch2jax.generate.prompts import check_prompt

    spec = SimpleNamespace(max_batch=2, vocab_size=100, max_cache_len=16)
    ids, mask = check_prompt(np.array([[5, 999, 999, 6]]), None, spec, 4, image_token=999)
    assert ids.tolist() == [[5, 999, 999, 6]] and mask.all()
    with pytest.raises(InputSpecError, match=r"outside the vocabulary \[0, 100\)"):
        check_prompt(np.array([[5, 999, 998]]), None, spec, 4, image_token=999)
    with pytest.raises(InputSpecError, match=r"outside the vocabulary \[0, 100\)"):
        check_prompt(np.array([[5, 999]]), None, spec, 4)


def test_sampling_is_reproducible_per_key_and_top_k_one_is_greedy(generators):
    g = generators("llama")
    ids = np.concatenate([prompt(6, 8), prompt(6, 9)])
    greedy = g.generate(ids, max_new_tokens=16, eos_token_id=[])
    a = g.generate(ids, max_new_tokens=16, do_sample=True, temperature=1.5, rng=jax.random.key(1), eos_token_id=[])
    b = g.generate(ids, max_new_tokens=16, do_sample=True, temperature=1.5, rng=jax.random.key(1), eos_token_id=[])
    c = g.generate(ids, max_new_tokens=16, do_sample=True, temperature=1.5, rng=jax.random.key(2), eos_token_id=[])
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    top1 = g.generate(ids, max_new_tokens=16, do_sample=True, top_k=1, rng=jax.random.key(3), eos_token_id=[])
    np.testing.assert_array_equal(top1, greedy)
    per_row = g.generate(ids, max_new_tokens=16, do_sample=True, top_k=[1, 0], temperature=[1.0, 2.0], top_p=[1.0, 0.9],
                         rng=jax.random.key(4), eos_token_id=[])
    np.testing.assert_array_equal(per_row[0], greedy[0])  # row 0 is greedy through its own top_k=1


def test_cache_is_donated_to_every_step(generators):
    g = generators("llama")
    cache = g.new_cache(2)
    ids = jax.numpy.asarray(np.ones((2, 4)), jax.numpy.int32)
    logits, new_cache = g._prefill(g.params, cache, ids, ids, jax.numpy.arange(4, dtype=jax.numpy.int32),
                                   jax.numpy.ones((2, 4), bool))
    assert all(t.is_deleted() for t in cache), "prefill copied the cache instead of updating it in place"
    assert not any(t.is_deleted() for t in new_cache) and logits.shape == (2, 128)


def test_saved_generator_generates_where_torch_cannot_be_imported(generators, tmp_path):
    g = generators("mistral")
    out = torch2jax.save(g, tmp_path / "llm")
    ids = np.concatenate([prompt(9, 10), prompt(9, 11)])
    want = g.generate(ids, max_new_tokens=20, eos_token_id=[])
    np.save(tmp_path / "ids.npy", ids)
    code = f"""
import numpy as np, torch2jax
g = torch2jax.load({str(out)!r})
assert type(g).__name__ == "Generator", g
got = g.generate(np.load({str(tmp_path / 'ids.npy')!r}), max_new_tokens=20, eos_token_id=[])
np.save({str(tmp_path / 'got.npy')!r}, got)
print(g)
"""
    result = run_without_torch(code)
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), want)
    manifest = torch2jax.load(out).manifest
    assert manifest["task"] == "text-generation" and set(manifest["entries"]) == {"prefill", "decode"}
    assert manifest["generation"]["cache"]["shapes"][0] == ["batch", 2, CACHE + 1, 16]
    assert not any("cache" in name for name in manifest["params"]["tree"]), "the KV cache must not be saved as weights"
    assert EOS in manifest["generation"]["eos_token_ids"]


def test_a_generator_artifact_is_read_with_one_manifest_read_and_refused_where_one_function_is_wanted(generators, tmp_path):
    out = torch2jax.save(generators("llama"), tmp_path / "llm")
    with mock.patch.object(artifact, "read_manifest", wraps=artifact.read_manifest) as reader:
        g = torch2jax.load(out)
    assert isinstance(g, torch2jax.Generator) and reader.call_count == 1
    assert set(g.tokenizer_files) <= {"generation_config.json", "tokenizer.json"}
    with mock.patch.object(artifact, "restore_params") as restore:  # refused from the manifest, before any params
        with pytest.raises(torch2jax.ArtifactError, match=r"holds entry points \(prefill, decode\), not one function"):
            artifact.load(out)
        with pytest.raises(torch2jax.ShardingError, match="sharding= needs mesh="):
            torch2jax.load(out, sharding="replicated")
    restore.assert_not_called()


def test_decode_attends_to_the_filled_span_of_a_long_cache(lm_dirs):
    """With a 300-slot cache, 60 new tokens after a 10-token prompt cross from the 64-slot span to the 128-slot one:
    two compiled decode steps, neither over all 300 slots, and the tokens still equal transformers'."""
    from torch2jax.generate.loop import attended_span

    assert [attended_span(n, 300) for n in (1, 64, 65, 129, 257, 300)] == [64, 64, 128, 256, 300, 300]
    g = torch2jax.convert_hf(f"hf:{lm_dirs['llama']}", max_cache_len=300, max_batch=2)
    ids = prompt(10, 12)
    got = g.generate(ids, max_new_tokens=60, eos_token_id=[])
    np.testing.assert_array_equal(got, hf_greedy(load_lm(lm_dirs["llama"]), torch.from_numpy(ids), 60))
    assert g._decode._cache_size() == 2


def test_the_step_is_traced_once_and_decode_pins_one_token(lm_dirs, monkeypatch, tmp_path):
    """torch.export (most of a conversion's time) runs once: decode is the prefill graph with `tokens` pinned to 1,
    exported with that size as a constant, and a call with more tokens per row is refused by name."""
    from torch2jax.capture import exporter
    from torch2jax.errors import SignatureError

    exports = []
    original = exporter.export
    monkeypatch.setattr(exporter, "export", lambda *a, **k: exports.append(1) or original(*a, **k))
    g = torch2jax.convert_hf(f"hf:{lm_dirs['llama']}", max_cache_len=CACHE, max_batch=2)
    assert len(exports) == 1
    assert g.decode_model.graph.fixed_dims() == {"tokens": 1} and g.prefill_model.graph.fixed_dims() == {}
    out = torch2jax.save(g, tmp_path / "llm")
    shapes = {name: " ".join(str(a.shape) for a in jax.export.deserialize(bytearray(
        (out / "entries" / name / "exported.bin").read_bytes())).in_avals) for name in ("prefill", "decode")}
    assert "tokens" in shapes["prefill"] and "tokens" not in shapes["decode"], shapes
    loaded = torch2jax.load(out)
    ids = np.ones((1, 2), np.int64)
    with pytest.raises(SignatureError, match="tokens"):
        loaded.decode_model(ids, ids, np.arange(2), np.ones((1, 4), bool), loaded.new_cache(1))
    ids = prompt(6, 3)
    np.testing.assert_array_equal(loaded.generate(ids, max_new_tokens=8, eos_token_id=[]),
                                  hf_greedy(load_lm(lm_dirs["llama"]), torch.from_numpy(ids), 8))
    assert loaded._decode._cache_size() == 1  # the first step's carried inputs are placed as later steps' are


def test_prompts_are_padded_to_four_buckets_per_octave(lm_dirs):
    """A prompt is left-padded to the next of 1.25, 1.5, 1.75 and 2 times a power of two (a quarter at most of its
    prefill is padding, where a power of two could double it); prompts in one bucket share a compiled prefill, and the
    tokens are transformers' at every width."""
    from torch2jax.generate.loop import prompt_bucket

    assert [prompt_bucket(n, 4096, 16) for n in (5, 17, 20, 21, 33, 212, 596)] == [16, 20, 20, 24, 40, 224, 640]
    assert prompt_bucket(212, 220, 16) == 212 and prompt_bucket(3, 8, 16) == 3  # no bucket fits the cache: as it is
    g = torch2jax.convert_hf(f"hf:{lm_dirs['llama']}", max_cache_len=CACHE, max_batch=BATCH)
    lm = load_lm(lm_dirs["llama"])
    for length in (17, 19, 20, 21):  # buckets 20, 20, 20, 24
        ids = prompt(length, 1)
        np.testing.assert_array_equal(g.generate(ids, max_new_tokens=4, eos_token_id=[]), hf_greedy(lm, torch.from_numpy(ids), 4))
    assert g._prefill._cache_size() == 2
