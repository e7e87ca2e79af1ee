"""Generation from a converted encoder-decoder (T5, BART, Whisper) against transformers' own generate, same
weights (random, small configs): encode once, decode one token per step, torch-free once saved."""

from __future__ import annotations

import copy

import jax
import numpy as np
import pytest

import torch2jax
import torch2jax.generate.sampling
from torch2jax.errors import InputSpecError, VerificationError
from torch2jax.generate.seq2seq import right_pad
from torch2jax.hf.verify import check_generation, verify_seq2seq

from ..helpers import cli, run_without_torch
from .seq2seqs import ARCHITECTURES, EOS, FRAMES, MEL, PAD, START, build_seq2seq, hf_generate, load_seq2seq, write_seq2seq

CACHE, BATCH, SOURCE = 40, 4, 32


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("seq2seq")
    return {name: write_seq2seq(name, root) for name in (*ARCHITECTURES, "whisper")}


@pytest.fixture(scope="module")
def generators(model_dirs):
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = torch2jax.convert_hf(f"hf:{model_dirs[name]}", max_cache_len=CACHE, max_batch=BATCH,
                                               max_source_len=SOURCE)
        return cache[name]

    return get


def source(length: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 128, length).tolist()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "bart" else n for n in ARCHITECTURES])  # bart: ~30 s,
# the same padded-batch path as t5
def test_padded_batch_equals_transformers_and_each_source_alone(name, model_dirs, generators):
    """32 greedy tokens (no end token) for a right-padded batch of two sources of different lengths: equal to
    transformers' generate with the mask, and each row equal to its source generated alone."""
    g = generators(name)
    sources = [source(11, 1), source(5, 2)]
    ids, mask = right_pad(sources, PAD)
    got = g.generate(ids, attention_mask=mask, max_new_tokens=32, eos_token_id=[])
    want = hf_generate(load_seq2seq(model_dirs[name]), ids, 32, mask)
    assert got.shape == want.shape == (2, 33) and (got[:, 0] == START).all()
    np.testing.assert_array_equal(got, want)
    for row, src in enumerate(sources):
        np.testing.assert_array_equal(g.generate(np.array([src]), max_new_tokens=32, eos_token_id=[])[0], got[row])
    if name == "bart":  # BART's forced_eos_token_id: the last token is the end token, as transformers forces it
        assert (got[:, -1] == EOS).all()


def test_whisper_features_equal_transformers_generate(model_dirs, generators):
    """Whisper reads [B, mel, frames] features (no mask); its own generate returns the tokens after the start token."""
    import torch

    g = generators("whisper")
    assert g.spec.takes_features and g.spec.max_source_len == FRAMES // 2
    features = np.random.default_rng(10).standard_normal((2, MEL, FRAMES)).astype(np.float32)
    got = g.generate(input_features=features, max_new_tokens=32, eos_token_id=[])
    lm = load_seq2seq(model_dirs["whisper"])
    lm.generation_config.eos_token_id = None
    with torch.no_grad():
        want = lm.generate(torch.from_numpy(features), max_new_tokens=32).numpy()
    assert got.shape == (2, 33) and want.shape == (2, 32) and (got[:, 0] == START).all()
    np.testing.assert_array_equal(got[:, 1:], want)
    assert len(set(want.ravel().tolist())) > 2, "the reference repeats one token: the comparison would prove little"
    np.testing.assert_array_equal(g.generate(input_features=features[1], max_new_tokens=32, eos_token_id=[])[0], got[1])
    with pytest.raises(InputSpecError, match=r"reads audio features: pass input_features \[batch, 16, 40\]"):
        g.generate(np.ones((1, 3), np.int64))
    with pytest.raises(InputSpecError, match=r"input_features must be floats of shape \[batch, 16, 40\], got float32\[1, 16, 30\]"):
        g.generate(input_features=features[:1, :, :30])
    with pytest.raises(InputSpecError, match=r"max_cache_len=65 is more than the model's 64 learned positions"):
        torch2jax.convert_hf(f"hf:{model_dirs['whisper']}", max_cache_len=65, max_batch=2)


def test_end_token_stops_a_row_and_pads_it_like_transformers(model_dirs, generators):
    g = generators("t5")
    ids, mask = right_pad([source(8, 4), source(6, 5)], PAD)
    free = g.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    end = int(free[0, 1 + 3])  # row 0's fourth new token becomes the end token
    got = g.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=end)
    np.testing.assert_array_equal(got, hf_generate(load_seq2seq(model_dirs["t5"]), ids, 20, mask, eos=end))
    first_end = int(np.argmax(got[0, 1:] == end))
    assert first_end <= 3 and (got[0, 1 + first_end + 1:] == PAD).all()
    steps = list(g.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=end, stream=True))
    np.testing.assert_array_equal(np.stack(steps, 1), got[:, 1:])


def test_sampling_is_reproducible_and_top_k_one_is_greedy(generators):
    g = generators("bart")
    ids, mask = right_pad([source(7, 6), source(9, 7)], PAD)
    greedy = g.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[])
    a, b = (g.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=True, temperature=1.5, rng=jax.random.key(1),
                       eos_token_id=[]) for _ in range(2))
    np.testing.assert_array_equal(a, b)
    top1 = g.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=True, top_k=1, rng=jax.random.key(3), eos_token_id=[])
    np.testing.assert_array_equal(top1, greedy)
    assert (greedy[:, -1] == EOS).all()  # forced at the last step, inside a block of decode steps
    for size in (1, 5):  # decode blocks of any size give one step per call's tokens
        g.steps_per_call = size
        try:
            np.testing.assert_array_equal(g.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[]), greedy)
            np.testing.assert_array_equal(g.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=True,
                                                     temperature=1.5, rng=jax.random.key(1), eos_token_id=[]), a)
        finally:
            g.steps_per_call = 16


def test_bad_requests_fail_before_anything_runs(generators):
    g = generators("t5")
    before = g._encode._cache_size(), g._decode._cache_size()
    with pytest.raises(InputSpecError, match=r"a source of 33 tokens is longer than this artifact's max_source_len \(32\)"):
        g.generate(np.ones((1, 33), np.int64))
    with pytest.raises(InputSpecError, match=r"max_new_tokens=41 is more than this artifact's max_cache_len \(40\)"):
        g.generate(np.ones((1, 3), np.int64), max_new_tokens=41)
    with pytest.raises(InputSpecError, match=r"batch of 5 sources: this artifact was converted for 1 to 4"):
        g.generate(np.ones((5, 3), np.int64))
    with pytest.raises(InputSpecError, match="every token of a source as padding"):
        g.generate(np.ones((1, 3), np.int64), attention_mask=np.zeros((1, 3)))
    assert (g._encode._cache_size(), g._decode._cache_size()) == before


def test_a_generator_that_departs_from_transformers_fails_the_check(model_dirs, generators):
    g = generators("t5")
    lm = load_seq2seq(model_dirs["t5"])
    assert verify_seq2seq(lm, g).ok
    encode, decode = copy.copy(g.encode_model), copy.copy(g.decode_model)  # the shared generator stays as it is
    encode.params = decode.params = {k: v * 1.5 if v.ndim == 2 else v for k, v in g.params.items()}
    wrong = torch2jax.Seq2SeqGenerator(encode, decode, g.spec)
    with pytest.raises(VerificationError, match="generation differs from transformers' greedy generate"):
        check_generation(verify_seq2seq(lm, wrong))


def test_saved_generator_generates_where_torch_cannot_be_imported(generators, tmp_path):
    g = generators("bart")
    out = torch2jax.save(g, tmp_path / "bart")
    ids, mask = right_pad([source(12, 8), source(4, 9)], PAD)
    want = g.generate(ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[])
    np.savez(tmp_path / "source.npz", ids=ids, mask=mask)
    code = f"""
import numpy as np, torch2jax
g = torch2jax.load({str(out)!r})
assert type(g).__name__ == "Seq2SeqGenerator", g
source = np.load({str(tmp_path / 'source.npz')!r})
np.save({str(tmp_path / 'got.npy')!r}, g.generate(source["ids"], attention_mask=source["mask"], max_new_tokens=16, eos_token_id=[]))
"""
    result = run_without_torch(code)
    assert result.returncode == 0, result.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), want)
    manifest = torch2jax.load(out).manifest
    assert manifest["task"] == "text2text-generation" and set(manifest["entries"]) == {"encode", "decode"}
    generation = manifest["generation"]
    assert generation["cache"]["shapes"][0] == ["batch", 4, CACHE + 1, 16]
    assert generation["cross"]["shapes"] == [["batch", 4, "source", 16]] * 4 and generation["cross"]["donated"] is False
    assert generation["max_source_len"] == SOURCE and generation["decoder_start_token_id"] == START
    assert generation["forced_eos_token_id"] == EOS
    assert not any(name.startswith(("cache", "cross")) for name in manifest["params"]["tree"]), "state must not be saved"


@pytest.mark.slow  # the console script converting and generating (~100 s); the Python path is tested above
def test_cli_convert_verifies_and_generate_round_trips(model_dirs, tmp_path):
    out = tmp_path / "t5"
    converted = cli("convert", f"hf:{model_dirs['t5']}", "--max-cache-len", "24", "--max-batch", "2", "--max-source-len", "16",
                    "--out", str(out))
    assert converted.returncode == 0, converted.stderr
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate" in converted.stdout
    generated = cli("generate", str(out), "--ids", "5,9,33,7", "--ids", "8,4", "--max-new-tokens", "10")
    assert generated.returncode == 0, generated.stderr
    rows = [[int(t) for t in line.split(",")] for line in generated.stdout.strip().splitlines()]
    assert rows == [c.ids for c in torch2jax.load(out).complete([[5, 9, 33, 7], [8, 4]], max_new_tokens=10)]
    ids, mask = right_pad([[5, 9, 33, 7], [8, 4]], PAD)
    want = hf_generate(load_seq2seq(model_dirs["t5"]), ids, 10, mask, eos=EOS)
    for row, got in zip(want.tolist(), rows):
        assert got == row[: next((i + 1 for i, t in enumerate(row) if i > 0 and t == EOS), len(row))]  # up to the end token
    inspected = cli("inspect", str(out))
    assert "task      text2text-generation" in inspected.stdout and "entry     encode" in inspected.stdout
    assert "cross     4 float32 tensors of ['batch', 4, 'source', 16]" in inspected.stdout


def test_complete_gives_each_source_its_output_up_to_the_end_token(model_dirs, generators):
    g = generators("t5")
    sources = [source(7, 3), source(3, 4)]
    got = g.complete(sources, max_new_tokens=10)
    ids, mask = right_pad(sources, PAD)
    want = g.generate(ids, attention_mask=mask, max_new_tokens=10)
    for completion, row in zip(got, want.tolist()):
        end = next((i + 1 for i, t in enumerate(row) if i > 0 and t == EOS), len(row))
        assert completion.ids == row[:end] and completion.new_tokens == end - 1 and completion.text is None
    with pytest.raises(InputSpecError, match="a prompt has no tokens"):
        g.complete([[5], []])
    with pytest.raises(InputSpecError, match="takes no images"):
        g.complete([[5]], images=["cat.png"])


def test_self_attention_cache_is_donated_and_cross_state_is_kept(generators):
    g = generators("t5")
    inputs = g._encoder_inputs(np.ones((2, 4), np.int64), np.ones((2, 4), bool))  # right-padded to 16
    cross = g._encode(g.params, *inputs)
    assert [c.shape for c in cross] == [(2, 4, 16, 16)] * 4
    cache, valid = g.new_cache(2), jax.numpy.zeros((2, CACHE), bool)
    token = jax.numpy.full((2,), START, g._id_dtype)
    temperature, top_k, top_p = torch2jax.generate.sampling.sampling_params(2)
    out = g._decode(g.params, cache, cross, inputs[1] != 0, valid, token, jax.numpy.asarray(0, g._id_dtype),
                    jax.numpy.zeros((2,), bool), jax.random.key(0), temperature, top_k, top_p, jax.numpy.asarray([EOS], g._id_dtype),
                    jax.numpy.asarray(PAD, g._id_dtype), *g._forced(8), jax.numpy.asarray(3, g._id_dtype), do_sample=False,
                    span=CACHE, size=4)
    assert all(t.is_deleted() for t in cache), "decode copied the self-attention cache instead of updating it in place"
    assert not any(c.is_deleted() for c in cross) and out[0].shape == (4, 2) and int(out[1]) <= 3


@pytest.mark.slow  # ~30 s: a failed symbolic export, then two fixed ones (the spec's part runs by default, below)
def test_an_encoder_that_branches_on_the_source_length_is_exported_at_max_source_len(tmp_path):
    """LongT5 pads its source to a multiple of its attention block, which torch.export cannot keep symbolic: both steps
    are exported at max_source_len and every source is padded to it (masked), so a padded batch still generates
    transformers' tokens, before and after save + load (the manifest records the fixed length)."""
    import json

    lm = load_seq2seq(write_seq2seq("longt5", tmp_path))
    g = torch2jax.convert_hf(lm, max_cache_len=CACHE, max_batch=2, max_source_len=16)
    assert g.spec.fixed_source and g.spec.max_source_len == 16
    ids, mask = right_pad([source(11, 1), source(5, 2)], PAD)
    want = hf_generate(lm, ids, 12, mask)
    np.testing.assert_array_equal(g.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[]), want)
    saved = torch2jax.save(g, tmp_path / "artifact")
    encoder_input = json.loads((saved / "manifest.json").read_text())["generation"]["encoder_input"]
    assert encoder_input == {"name": "input_ids", "shape": ["batch", 16]}
    loaded = torch2jax.load(saved)
    assert loaded.spec.fixed_source
    np.testing.assert_array_equal(loaded.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[]), want)


def test_a_fixed_source_length_survives_the_manifest_and_pads_every_source_to_it(generators):
    """The spec of an encoder exported at max_source_len (above): its manifest's encoder input names the length, and
    encode's inputs are padded to it however short the source."""
    import dataclasses

    from torch2jax.generate.seq2seq import Seq2SeqSpec

    spec = dataclasses.replace(generators("t5").spec, fixed_source=True)
    data = spec.to_json()
    assert data["encoder_input"]["shape"] == ["batch", SOURCE]
    assert Seq2SeqSpec.from_json(data).fixed_source and not Seq2SeqSpec.from_json(generators("t5").spec.to_json()).fixed_source
    g = copy.copy(generators("t5"))
    g.spec = spec
    ids, mask = g._encoder_inputs(np.array([source(5)]), np.ones((1, 5), np.int64))
    assert ids.shape == mask.shape == (1, SOURCE) and int(mask.sum()) == 5


@pytest.mark.parametrize("name", ["switch", pytest.param("nllb_moe", marks=pytest.mark.slow(
    reason="the same encoder-output path as Switch Transformers; its own sweep row runs it too"))])
def test_encoders_run_before_the_model_as_transformers_generate_runs_them(name, tmp_path):
    """The encoder runs on its own and the model over its output, as transformers' generate does: Switch Transformers'
    forward hands use_cache to its encoder, which refuses it, and NLLB-MoE reads the encoder's output by name (the decode
    step gives it in the encoder's own output class). A padded batch equals transformers' generate."""
    lm = load_seq2seq(write_seq2seq(name, tmp_path))
    g = torch2jax.convert_hf(lm, max_cache_len=24, max_batch=2, max_source_len=16)
    ids, mask = right_pad([source(11, 1), source(5, 2)], PAD)
    np.testing.assert_array_equal(g.generate(ids, attention_mask=mask, max_new_tokens=12, eos_token_id=[]),
                                  hf_generate(lm, ids, 12, mask))


def test_an_encoder_decoder_model_of_bert_halves_generates_as_transformers():
    """EncoderDecoderModel hands decoder_* keywords to a BERT decoder, whose embeddings slice their position table at
    the cache's length (which does not trace): the step gives it the slots as positions. Its matrices drawn wider
    than BERT's init, so that each token depends on the source and the tokens before it."""
    import torch

    torch.manual_seed(0)
    lm = build_seq2seq("bert2bert").eval()
    with torch.no_grad():
        for param in lm.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.1)
    g = torch2jax.convert_hf(lm, task="text2text-generation", max_cache_len=24, max_batch=2, max_source_len=16)
    ids, mask = right_pad([source(9, 3), source(4, 4)], PAD)
    want = hf_generate(lm, ids, 16, mask)
    np.testing.assert_array_equal(g.generate(ids, attention_mask=mask, max_new_tokens=16, eos_token_id=[]), want)
    assert len(set(want[:, 1:].ravel().tolist())) > 8  # the tokens depend on what came before
