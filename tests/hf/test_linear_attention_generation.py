"""transformers' linear-attention hybrids generate what transformers' own `generate` does, before and after save +
load, with left padding kept out of their state and a prompt filled in chunks equal to it filled at once
(torch2jax/hf/stand_ins/linear_attention.py): LaraMini's gated delta net, and the short convolutions Inkling, Inkling2
and Inkling2-Loop keep beside each attention layer's keys and values.

The Inkling models are drawn so that what the stand-ins replace shows in the tokens: convolution taps wide enough
that a window carried wrong changes the next token, relative-bias profiles of unit size over an extent shorter than
the prompt (a distance off by a slot moves the bias), a sliding window shorter than prompt and tokens, and log
scaling from position 4 on (Inkling2 and Inkling: a position off changes the queries). Inkling2-Loop runs two layers
twice, each pass on its own cache layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax

from .recurrent_checks import check_left_padding, check_round_trip, check_two_chunks, widened

VOCAB = 96
_SPECIAL = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, vocab_size=VOCAB)
_INKLING = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, swa_num_attention_heads=4,
                swa_num_key_value_heads=2, swa_head_dim=8, sliding_window_size=6, d_rel=4, rel_extent=8,
                log_scaling_n_floor=4, log_scaling_alpha=0.5, conv_kernel_size=4, moe_intermediate_size=16,
                n_routed_experts=4, num_experts_per_tok=2, max_position_embeddings=128, **_SPECIAL)
_INKLING2 = dict(_INKLING, unpadded_vocab_size=VOCAB, n_layers_per_attn_res_block=2)


def _config(kind: str):
    import transformers

    if kind == "lara_mini":  # Qwen3.5's gated delta net; a sliding and an unrotated full attention layer beside it
        return transformers.LaraMiniConfig(
            hidden_size=32, num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
            linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
            linear_num_value_heads=4, moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=4,
            num_experts_per_tok=2, sliding_window=6, tie_word_embeddings=False,
            layer_types=["linear_attention", "sliding_attention", "full_attention"], **_SPECIAL)
    if kind == "inkling":
        return transformers.InklingTextConfig(num_hidden_layers=2, layer_types=["hybrid_sliding", "hybrid"],
                                              mlp_layer_types=["dense", "sparse"], intermediate_size=64,
                                              n_shared_experts=1, **_INKLING)
    if kind == "inkling2":
        return transformers.Inkling2TextConfig(num_hidden_layers=2, layer_types=["hybrid_sliding", "hybrid"],
                                               **_INKLING2)
    if kind == "inkling2_loop":  # layer 1 runs twice: its second pass on cache layer 2
        return transformers.Inkling2LoopTextConfig(
            num_hidden_layers=2, layer_types=["hybrid_sliding", "hybrid"], loop_layer_index_start=1,
            loop_layer_index_end=2, loop_num_passes=2, loop_gate_rank=4,
            **dict(_INKLING2, n_layers_per_attn_res_block=1))
    raise KeyError(kind)


def tiny_lm(kind: str) -> torch.nn.Module:
    """A random tiny model whose greedy tokens vary, with the parts the stand-ins replace drawn to matter."""
    import transformers

    torch.manual_seed(0)
    lm = widened(transformers.AutoModelForCausalLM.from_config(_config(kind)), convolutions=True)
    with torch.no_grad():
        for name, parameter in lm.named_parameters():
            if name.endswith(("rel_logits_proj.proj", "relative_position_bias.proj")):
                parameter.normal_(0, 1)  # bias profiles that move the scores
            elif name.endswith("static_weight"):  # Inkling2's dynamic convolution taps (zero at init)
                parameter.normal_(0, 0.5)
            elif name.endswith(".query") and parameter.dtype == torch.float32 and "input" in name:
                parameter.normal_(0, 1)  # Inkling2's block attention residuals (zero at init: a plain mean)
    return lm.eval()


_SLOW = pytest.mark.slow
# Inkling2 runs by default (its static and dynamic convolutions, its per-row distances); the others with the slow
# tests: Inkling2-Loop adds a loop's later pass to Inkling2's stand-ins, LaraMini runs Qwen3.5's
KINDS = ("inkling2", pytest.param("inkling2_loop", marks=_SLOW), pytest.param("inkling", marks=_SLOW),
         pytest.param("lara_mini", marks=_SLOW))
_HYBRID = ("state",) * 4 + ("kv", "kv")  # four convolution windows, then the layer's keys and values
_KINDS = {"lara_mini": ("state", "state", "kv", "kv", "kv", "kv"), "inkling": _HYBRID * 2, "inkling2": _HYBRID * 2,
          "inkling2_loop": _HYBRID * 3}


@pytest.fixture(scope="module", params=KINDS)
def converted(request):
    lm = tiny_lm(request.param)
    return request.param, lm, torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)


def test_greedy_tokens_equal_transformers_before_and_after_save_and_load(converted, tmp_path):
    kind, lm, g = converted
    check_round_trip(lm, g, tmp_path / kind, _KINDS[kind])
    if kind != "lara_mini":
        assert set(g.spec.cache_dtypes[:4]) == {"float32"}  # the windows: float32, as transformers keeps them


@_SLOW  # the round trip's padded row already generates the row alone's tokens
def test_left_padding_does_not_enter_the_state(converted):
    check_left_padding(converted[2], VOCAB)


def test_a_prompt_in_two_chunks_leaves_the_state_of_the_whole_prompt(converted):
    check_two_chunks(converted[2], VOCAB)


@_SLOW  # a check of the checks
def test_the_next_token_depends_on_the_state(converted):
    """The checks above can tell a state carried wrong: the same next step from the prompt's states zeroed gives
    other logits (a token whose logits did not read the state would pass them with any state)."""
    import jax.numpy as jnp

    g = converted[2]
    ids = np.random.default_rng(5).integers(3, VOCAB, (1, 8))
    _, cache = g.prefill(g.new_cache(1), jnp.asarray(ids), jnp.arange(8)[None], jnp.arange(8), jnp.ones((1, 8), bool))
    zeroed = [jnp.array(c) if kind == "kv" else jnp.zeros_like(c) for c, kind in zip(cache, g.spec.cache_kinds)]
    step = (jnp.asarray([[5]]), jnp.asarray([[8]]), jnp.asarray([8]), jnp.ones((1, 9), bool))
    without, _ = g.prefill(zeroed, *step)  # each call donates the cache it is given
    with_state, _ = g.prefill(cache, *step)
    assert np.abs(np.asarray(with_state) - np.asarray(without)).max() > 1e-2
