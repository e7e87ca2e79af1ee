"""The Mamba2 hybrids and RecurrentGemma generate what transformers' own `generate` does, before and after save + load,
with their recurrent state as the artifact's donated cache (hf/stand_ins/mamba2_kin.py, rg_lru.py): Nemotron-H (Mamba2
layers beside attention, MLP-only and MoE-only layers, which keep no cache), Falcon-H1 (every layer a Mamba2 mixer
with mup multipliers and attention in parallel: a layer keeps a state and keys/values together), Granite 4
(GraniteMoeHybrid: Bamba's mixer beside attention, with MoE) and RecurrentGemma (RG-LRU and conv beside
sliding-window attention). Each step's logits equal transformers' (its prompt's and its one-token updates', which
transformers runs through different code), left padding never enters the state, and a prompt prefilled in two chunks
ends where one call does.

One family per distinct mixer runs by default: Falcon-H1 with its gated norm (its own stand-in, and hybrid layers) and
RecurrentGemma. The others run with the slow tests: Nemotron-H and Granite 4 (Bamba's mixer, which
test_recurrent_generation.py runs by default; Nemotron-H with a time-step floor and layers without a cache) and
Falcon-H1 without its norm."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.hf.verify import check_generation, verify_generation

from .recurrent_checks import widened

VOCAB, CACHE = 96, 48


def _config(kind: str):
    import transformers

    special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, vocab_size=VOCAB, tie_word_embeddings=False)
    mamba = dict(mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4,
                 mamba_chunk_size=4)
    if kind == "nemotron_h":  # Mamba2, MLP only, attention, MoE only; a time-step floor the random steps fall under
        return transformers.NemotronHConfig(hidden_size=32, layers_block_type=["linear_attention", "mlp",
                                                                               "full_attention", "moe"],
                                            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                            intermediate_size=48, ssm_state_size=8, mamba_num_heads=8, mamba_head_dim=8,
                                            n_groups=2, conv_kernel=4, chunk_size=4, time_step_min=0.3,
                                            time_step_max=0.5, n_routed_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=32, moe_shared_expert_intermediate_size=32,
                                            n_shared_experts=1, **special)
    if kind in ("falcon_h1", "falcon_h1_plain"):  # every multiplier away from one, so one left out shows
        # the default tier's with one layer (its conversion is the file's slowest), the slow tier's with two
        return transformers.FalconH1Config(hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1 if kind == "falcon_h1" else 2,
                                           num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=64,
                                           mamba_rms_norm=kind == "falcon_h1", mamba_norm_before_gate=False,
                                           ssm_in_multiplier=0.7, ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9],
                                           ssm_out_multiplier=1.2, attention_in_multiplier=0.9,
                                           attention_out_multiplier=1.1, key_multiplier=0.8, embedding_multiplier=1.3,
                                           lm_head_multiplier=0.9, mlp_multipliers=[1.1, 0.9], **mamba, **special)
    if kind == "granitemoehybrid":  # layer 0: Mamba2, layer 1: attention; both with a mixture of experts
        return transformers.GraniteMoeHybridConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                                   num_experts_per_tok=2, shared_intermediate_size=48,
                                                   layer_types=["linear_attention", "full_attention"],
                                                   mamba_expand=2, **mamba, **special)
    if kind == "recurrent_gemma":  # recurrent, sliding-window attention (a window shorter than the tests' texts)
        return transformers.RecurrentGemmaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=32,
                                                 num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                                                 lru_width=32, conv1d_width=4, attention_window_size=6,
                                                 block_types=["recurrent", "attention"], **special)
    raise KeyError(kind)


def tiny_lm(kind: str) -> torch.nn.Module:
    """A random tiny model whose greedy tokens depend on the context, its norm weights away from one (so a norm left
    out shows): recurrent_checks.widened."""
    import transformers

    torch.manual_seed(0)
    return widened(transformers.AutoModelForCausalLM.from_config(_config(kind)), norms=0.3)


KINDS = ("falcon_h1", "recurrent_gemma", *(pytest.param(kind, marks=pytest.mark.slow)
                        for kind in ("nemotron_h", "granitemoehybrid", "falcon_h1_plain")))
# per layer: its cache tensors' kinds; () is a layer without a cache (transformers' DummyLayer)
LAYER_KINDS = {
    "nemotron_h": (("state", "state"), (), ("kv", "kv"), ()),
    "falcon_h1": (("state", "state", "kv", "kv"),),
    "falcon_h1_plain": (("state", "state", "kv", "kv"),) * 2,
    "granitemoehybrid": (("state", "state"), ("kv", "kv")),
    "recurrent_gemma": (("state", "state"), ("kv", "kv")),
}


def _check_greedy(kind: str, lm, g) -> None:
    """Greedy tokens of a left-padded batch of two equal transformers' generate of each row alone (verify_generation's
    reference for a recurrent model: RecurrentGemma lets the padding into its state in transformers, ours leaves it
    out, so a row is the row alone)."""
    result = verify_generation(lm, g, tokens=12)
    assert result.alone
    check_generation(result)


@pytest.fixture(scope="module", params=KINDS)
def converted(request):
    lm = tiny_lm(request.param)
    return request.param, lm, torch2jax.convert_hf(lm, max_cache_len=CACHE, max_batch=2)


def test_greedy_tokens_equal_transformers_before_and_after_save_and_load(converted, tmp_path):
    from torch2jax.hf.steps.recurrent import state_layout

    kind, lm, g = converted
    assert state_layout(lm, CACHE).layer_kinds == LAYER_KINDS[kind]
    expected_kinds = tuple(k for layer in LAYER_KINDS[kind] for k in layer)
    assert g.spec.cache_kinds == expected_kinds
    _check_greedy(kind, lm, g)
    loaded = torch2jax.load(torch2jax.save(g, tmp_path / kind))
    cache = json.loads((tmp_path / kind / "manifest.json").read_text())["generation"]["cache"]
    assert cache["kinds"] == list(expected_kinds) and cache["dtypes"][1] == "float32"  # the SSM state: float32
    assert loaded.spec.cache_kinds == expected_kinds and loaded.spec.cache_shapes == g.spec.cache_shapes
    _check_greedy(kind, lm, loaded)


def _filled(upto: int, width: int = CACHE) -> jnp.ndarray:
    """kv_valid of the whole cache's width with the first `upto` slots filled: every call of the tests below with
    as many tokens has the same shapes, so compiles once."""
    return jnp.arange(width)[None] < upto


def test_each_steps_logits_equal_transformers(converted):
    """The prompt's logits and each one-token update's equal transformers' generate's, to float32 rounding: the
    multipliers (Falcon-H1), the gated norm and the time-step limit (Nemotron-H's floor: transformers applies it to a
    prompt's steps, not to a one-token update's) all show in the logits before they change a greedy token."""
    kind, lm, g = converted
    if kind.startswith("falcon_h1"):
        mup = next(m.mup_vector for m in lm.modules() if hasattr(m, "mup_vector"))
        assert not torch.allclose(mup, torch.ones_like(mup))  # the multipliers are in play
    ids = np.random.default_rng(3).integers(3, VOCAB, (1, 9))
    with torch.no_grad():
        out = lm.generate(torch.from_numpy(ids), max_new_tokens=8, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    theirs = [step[0].float().numpy() for step in out.logits]
    tokens = out.sequences[0].numpy()
    n = ids.shape[1]
    logits, cache = g.prefill(g.new_cache(1), jnp.asarray(ids), jnp.arange(n)[None], jnp.arange(n), _filled(n))
    np.testing.assert_allclose(np.asarray(logits)[0], theirs[0], atol=2e-5)
    for i in range(1, len(theirs)):
        at = n + i - 1
        logits, cache = g.prefill(cache, jnp.asarray(tokens[None, at:at + 1]), jnp.asarray([[at]]),
                                  jnp.asarray([at]), _filled(at + 1))
        np.testing.assert_allclose(np.asarray(logits)[0], theirs[i], atol=2e-5, err_msg=f"token {i}")


def _prefill(g, ids: np.ndarray, valid: jnp.ndarray, cache: list | None = None, start: int = 0) -> tuple:
    """Prefill `ids` at slots start.. over a cache whose filled slots `valid` [1, CACHE] says; positions count the
    filled slots before each token."""
    width = ids.shape[1]
    positions = jnp.maximum(jnp.cumsum(valid, axis=1)[:, start:start + width] - 1, 0)
    logits, cache = g.prefill(g.new_cache(1) if cache is None else cache, jnp.asarray(ids), positions,
                              jnp.arange(start, start + width), valid)
    return np.asarray(logits), cache


def test_left_padding_does_not_enter_the_state(converted):
    """A prompt padded on the left with arbitrary (non-pad) tokens ends with the state, and logits, of the prompt
    alone (the padded batch against transformers: the greedy test above)."""
    _, _, g = converted
    rng = np.random.default_rng(1)
    short = rng.integers(3, VOCAB, 5)
    padded = np.concatenate([rng.integers(3, VOCAB, 4), short])[None]
    logits, cache = _prefill(g, padded, _filled(9) & (jnp.arange(CACHE) >= 4)[None])
    alone_logits, alone_cache = _prefill(g, short[None], _filled(5))
    np.testing.assert_allclose(logits[0], alone_logits[0], atol=1e-5)
    states = [(padded_state, alone) for kind_of, padded_state, alone in zip(g.spec.cache_kinds, cache, alone_cache)
              if kind_of == "state"]  # a key/value cache keeps the pads' slots (masked); a state has no slots
    assert len(states) >= 2
    for padded_state, alone in states:
        np.testing.assert_allclose(np.asarray(padded_state), np.asarray(alone), atol=1e-5)


def test_a_prompt_in_two_chunks_leaves_the_state_of_the_whole_prompt(converted):
    """Prefill continues from the cache it is given (as the server's chunked prefill needs), so a prompt run as two
    calls ends with the cache and logits of one call."""
    _, _, g = converted
    ids = np.random.default_rng(2).integers(3, VOCAB, (1, 10))
    whole_logits, whole_cache = _prefill(g, ids, _filled(10))
    _, cache = _prefill(g, ids[:, :5], _filled(5))
    logits, cache = _prefill(g, ids[:, 5:], _filled(10), cache, start=5)
    np.testing.assert_allclose(logits, whole_logits, atol=1e-5)
    for chunked, whole in zip(cache, whole_cache):
        np.testing.assert_allclose(np.asarray(chunked), np.asarray(whole), atol=1e-5)
