"""The console script on a Hugging Face directory: convert --task text-generation (verified against
transformers), generate from text or ids, inspect; and what a failed check or a wrong request says."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import VerificationError
from torch2jax.hf.verify import check_generation, verify_generation

from ..helpers import cli
from .lms import load_lm, write_lm, write_tokenizer


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-llm")
    source = write_lm("llama", root)
    write_tokenizer(source)
    out = root / "llm"
    result = cli("convert", f"hf:{source}", "--max-cache-len", "48", "--max-batch", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "row 0: 16 of 16 greedy tokens equal to transformers' generate" in result.stdout
    assert "[verify]" in result.stderr and (out / "tokenizer" / "tokenizer.json").is_file()
    return source, out


def test_generate_from_text_and_from_ids(llm):
    source, out = llm
    by_text = cli("generate", str(out), "--prompt", "w5 w9 w33", "--max-new-tokens", "6")
    assert by_text.returncode == 0, by_text.stderr
    by_ids = cli("generate", str(out), "--ids", "5,9,33", "--max-new-tokens", "6")
    assert by_ids.returncode == 0, by_ids.stderr
    ids = [int(t) for t in by_ids.stdout.strip().split(",")]
    with torch.no_grad():
        want = load_lm(source).generate(torch.tensor([[5, 9, 33]]), max_new_tokens=6, do_sample=False, pad_token_id=0)[0].tolist()
    want = want[: next((i + 1 for i, t in enumerate(want) if i >= 3 and t == 2), len(want))]  # up to the end token
    assert ids == want
    assert by_text.stdout.split() == [f"w{t}" if t > 2 else ["<pad>", "<s>", "</s>"][t] for t in ids]
    sampled = [cli("generate", str(out), "--ids", "5,9", "--temperature", "1.3", "--top-p", "0.95", "--seed", s).stdout for s in "112"]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]


def test_generate_text_gives_what_the_cli_prints(llm):
    _, out = llm
    g = torch2jax.load(out)
    printed = cli("generate", str(out), "--prompt", "w5 w9 w33", "--prompt", "w7", "--max-new-tokens", "6")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines() == g.generate_text(["w5 w9 w33", "w7"], max_new_tokens=6)
    sampled = cli("generate", str(out), "--ids", "5,9", "--ids", "7", "--temperature", "1.3", "--top-p", "0.95", "--seed", "1")
    assert sampled.returncode == 0, sampled.stderr
    want = g.complete([[5, 9], [7]], do_sample=True, temperature=1.3, top_p=0.95, rng=jax.random.key(1))
    assert sampled.stdout.splitlines() == [",".join(map(str, c.ids)) for c in want]
    assert f"{max(c.new_tokens for c in want)} new tokens x 2 rows in " in sampled.stderr


def test_inspect_shows_the_entry_points_and_the_cache(llm):
    result = cli("inspect", str(llm[1]))
    assert result.returncode == 0, result.stderr
    for text in ("task      text-generation", "entry     prefill", "entry     decode", "dim tokens in [1, 48]",
                 "kv cache  4 float32 tensors of ['batch', 2, 49, 16]"):
        assert text in result.stdout


def test_generate_refuses_what_it_cannot_do(llm, tmp_path, saved):
    _, out = llm
    both = cli("generate", str(out), "--ids", "1,2", "--prompt", "w5")
    assert both.returncode == 2 and "one of them" in both.stderr
    plain = cli("generate", str(saved("mlp")), "--ids", "1,2")
    assert plain.returncode == 2 and "is not a text-generation artifact" in plain.stderr
    too_long = cli("generate", str(out), "--ids", ",".join(["5"] * 40), "--max-new-tokens", "20")
    assert too_long.returncode == 2 and "more than this artifact's max_cache_len (48)" in too_long.stderr


def test_a_generator_that_departs_from_transformers_fails_the_check(llm):
    source, out = llm
    g = torch2jax.load(out)
    lm = load_lm(source)
    assert verify_generation(lm, g).ok
    g.prefill_model.params = g.decode_model.params = {k: v * 1.5 if v.ndim == 2 else v for k, v in g.params.items()}
    with pytest.raises(VerificationError, match="generation differs from transformers' greedy generate"):
        check_generation(verify_generation(lm, g))


@pytest.mark.slow  # a second conversion through the console script (~30 s) for one error message
def test_prompt_without_a_tokenizer_points_at_ids(tmp_path):
    source = write_lm("gpt2", tmp_path)
    out = tmp_path / "gpt2-llm"
    converted = cli("convert", f"hf:{source}", "--max-cache-len", "32", "--max-batch", "1", "--out", str(out), "--no-verify", "-q")
    assert converted.returncode == 0, converted.stderr
    result = cli("generate", str(out), "--prompt", "hello")
    assert result.returncode == 2 and "pass token ids with --ids" in result.stderr
    np.testing.assert_array_equal(torch2jax.load(out).generate(np.array([[5, 6]]), max_new_tokens=3).shape, (1, 5))
