"""The last recurrent families transformers generates with generate what transformers' own `generate` does, before
and after save + load, with their state as the artifact's donated cache: RWKV (its own `state` list: token-shift
inputs and the WKV recurrence, hf/stand_ins/rwkv.py), xLSTM (its own `xLSTMCache`: the mLSTM memory, xlstm.py), ZAYA
(convolved queries and keys and a delayed value beside softmax attention, zaya.py) and MiniMax (lightning attention
beside softmax attention, in its own MiniMaxCache, minimax.py). Left padding never enters the state, and a prompt
prefilled in two chunks ends where one call does.

RWKV runs by default (the state outside a transformers Cache); the others run with the slow tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.generate.generator import left_pad

from .recurrent_checks import check_left_padding, check_round_trip, check_two_chunks, prefill, widened

VOCAB = 96
S = "state"


def _config(kind: str):
    import transformers

    special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, vocab_size=VOCAB, tie_word_embeddings=False)
    if kind == "rwkv":  # rescale_every=1: the inference-time rescaling of every block's outputs is exercised
        return transformers.RwkvConfig(hidden_size=32, attention_hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, rescale_every=1, context_length=64, **special)
    if kind == "xlstm":  # transformers' cache needs qk and v widths that are multiples of 64
        return transformers.xLSTMConfig(hidden_size=128, embedding_dim=128, num_hidden_layers=2, num_blocks=2,
                                        num_heads=2, **special)
    moe = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts_per_tok=1)
    if kind == "zaya":
        return transformers.ZayaConfig(hidden_size=32, num_hidden_layers=2, moe_intermediate_size=32, num_experts=4,
                                       **moe, **special)
    if kind == "zaya_sliding":  # a windowed layer (its own mask name) and biases (the delayed value's empty state)
        return transformers.ZayaConfig(hidden_size=32, num_hidden_layers=2, moe_intermediate_size=32, num_experts=4,
                                       layer_types=["hybrid", "hybrid_sliding"], sliding_window=4, attention_bias=True,
                                       **moe, **special)
    lightning = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_local_experts=4, block_size=3,
                     **{**moe, "num_experts_per_tok": 2})
    if kind == "minimax":
        return transformers.MiniMaxConfig(layer_types=["full_attention", "linear_attention", "linear_attention"],
                                          **lightning, **special)
    if kind == "minimax_linear_first":  # as MiniMax-Text-01: layer 0 is a lightning layer
        return transformers.MiniMaxConfig(layer_types=["linear_attention", "full_attention", "linear_attention"],
                                          **lightning, **special)
    raise KeyError(kind)


def tiny_lm(kind: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    return widened(transformers.AutoModelForCausalLM.from_config(_config(kind)), convolutions=kind.startswith("zaya"),
                   norms=0.2)


KV = "kv"
EXPECTED_KINDS = {
    "rwkv": (S,) * 10,  # per layer: ffn_x, att_x, numerator, denominator, maximum
    "xlstm": (S,) * 6,  # per layer: C, n, m
    "zaya": (S, S, KV, KV) * 2,  # per layer: conv window, delayed value, keys, values
    "zaya_sliding": (S, S, KV, KV) * 2,
    "minimax": (KV, KV, S, S),
    "minimax_linear_first": (S, KV, KV, S),
}
FLOAT32_STATES = {"rwkv": (2, 3, 4), "xlstm": (0, 1, 2)}  # float32 whatever the model's dtype
# transformers lets left padding into the state: RWKV and xLSTM ignore the attention mask; ZAYA with biases puts the
# query and key biases of its (zeroed) pad tokens into its conv window
PADS_ENTER = {"rwkv", "xlstm", "zaya_sliding"}
# transformers' MiniMaxCache counts the cache's length from layer 0, which a lightning layer leaves empty: each decode
# step then takes position 0 and a mask of one key; compared with transformers' forward without a cache instead
UNCACHED = {"minimax_linear_first"}
# RWKV runs by default through the CLI test below (converted, verified against transformers' rows alone)
KINDS = [pytest.param("rwkv", marks=pytest.mark.slow), *(pytest.param(kind, marks=pytest.mark.slow)
                   for kind in ("xlstm", "zaya", "zaya_sliding", "minimax", "minimax_linear_first"))]


def _uncached_greedy(lm: torch.nn.Module, prompt: list[int], tokens: int) -> list[int]:
    """Greedy tokens from transformers' forward over the whole text at each step (no cache)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(tokens):
            ids = torch.cat([ids, lm(ids, use_cache=False).logits[:, -1:].argmax(-1)], dim=1)
    return ids[0, len(prompt):].tolist()


def _check_greedy(kind: str):
    """Greedy tokens of a left-padded batch of two equal transformers': verify_generation compares a recurrent model's
    rows with transformers generating each row alone (several of these let the padding into their state in
    transformers; ours leaves it out: a row is the row alone). MiniMax with a lightning layer first: transformers'
    forward without a cache, per row (its cached generate takes position 0 at every decode step)."""
    from torch2jax.hf.verify import check_generation, verify_generation

    def check(lm, g) -> None:
        if kind not in UNCACHED:
            result = verify_generation(lm, g, tokens=12)
            assert result.alone
            check_generation(result)
            return
        rng = np.random.default_rng(0)
        prompts = [rng.integers(3, VOCAB, length).tolist() for length in (7, 4)]
        ids, mask = left_pad(prompts, g.spec.pad_token_id)
        ours = g.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=[])
        for row, prompt in enumerate(prompts):
            assert ours[row, ids.shape[1]:].tolist() == _uncached_greedy(lm, prompt, 12), f"row {row}"

    return check


@pytest.fixture(scope="module", params=KINDS)
def converted(request):
    lm = tiny_lm(request.param)
    return request.param, lm, torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)


def test_greedy_tokens_equal_transformers_before_and_after_save_and_load(converted, tmp_path):
    kind, lm, g = converted
    check_round_trip(lm, g, tmp_path / kind, EXPECTED_KINDS[kind], check=_check_greedy(kind))
    assert all(g.spec.cache_dtypes[i] == "float32" for i in FLOAT32_STATES.get(kind, ()))


def test_left_padding_does_not_enter_the_state(converted):
    check_left_padding(converted[2], VOCAB)


def test_a_prompt_in_two_chunks_leaves_the_state_of_the_whole_prompt(converted):
    check_two_chunks(converted[2], VOCAB)


def test_prompt_logits_equal_transformers_forward(converted):
    """A prompt's last logits equal transformers' forward over the same tokens (closer than greedy tokens show)."""
    kind, lm, g = converted
    ids = np.random.default_rng(3).integers(3, VOCAB, (1, 10))
    logits, _ = prefill(g, ids, np.ones((1, 10), bool))
    with torch.no_grad():
        want = lm(torch.from_numpy(ids), use_cache=False).logits[:, -1].numpy()
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_rwkv_converted_after_transformers_rescaled_its_weights(tmp_path):
    """transformers divides RWKV's weights in place on its first call in eval mode: a model converted after that
    (the weights rescaled, not the graph) generates as one converted before (the graph rescaling, the fixture's)."""
    lm = tiny_lm("rwkv")
    with torch.no_grad():
        lm(torch.tensor([[3]]))
    assert lm.rwkv.layers_are_rescaled
    g = torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)
    _check_greedy("rwkv")(lm, g)


@pytest.mark.slow  # ~29 s: RWKV's conversion and rows alone are tested in-process above, the CLI's verify elsewhere
def test_the_cli_converts_rwkv_verified_against_transformers_rows_alone(tmp_path):
    """transformers' RWKV ignores the attention mask (its padded batch is not its rows alone): `torch2jax convert`
    verifies a recurrent model against each row generated alone."""
    from ..helpers import cli

    directory = tmp_path / "rwkv"
    tiny_lm("rwkv").save_pretrained(directory)
    out = tmp_path / "out"
    result = cli("convert", f"hf:{directory}", "--max-cache-len", "32", "--max-batch", "2", "--platforms", "cpu",
                 "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "row 1: 16 of 16 greedy tokens equal to transformers' generate of the row alone" in result.stdout
