"""Causal LMs whose linear-attention layers keep a gated delta rule's state (Qwen3.5, Qwen3-Next, Qwen3.5-MoE,
OLMo-hybrid; Kimi's per-channel KDA) or a short convolution's window (LFM2, LFM2-MoE) generate what transformers' own `generate`
does, before and after save + load; left padding never enters the state, a prompt may be filled in chunks, and the
state after a prompt is the one transformers' own cache holds (torch2jax/hf/stand_ins/gated_delta.py, short_conv.py).

Qwen3.5 (the gated delta rule) and LFM2 (the short convolution) run by default; the other families share those
stand-ins' arithmetic (delta_mixer, the scan) and run with the slow tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax

from .recurrent_checks import check_left_padding, check_round_trip, check_two_chunks, prefill, widened

VOCAB = 96
_SPECIAL = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, vocab_size=VOCAB, tie_word_embeddings=False)
# one linear-attention layer (2 key heads serving 4 value heads, a 4-tap convolution) beside one attention layer
_DELTA = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
              linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
              linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"], **_SPECIAL)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=32)


def _config(kind: str):
    import transformers

    if kind == "qwen3_5":
        return transformers.Qwen3_5TextConfig(intermediate_size=64, **_DELTA)
    if kind == "qwen3_next":
        return transformers.Qwen3NextConfig(intermediate_size=64, **_DELTA, **_MOE)
    if kind == "qwen3_5_moe":
        return transformers.Qwen3_5MoeTextConfig(**_DELTA, **_MOE)
    if kind == "olmo_hybrid":  # beta doubled: the rule's negative-eigenvalue variant
        delta = {k: v for k, v in _DELTA.items() if k != "head_dim"}
        return transformers.OlmoHybridConfig(intermediate_size=64, linear_allow_neg_eigval=True, **delta)
    if kind == "kimi_linear":  # per-channel decay; multi-head latent attention beside it
        return transformers.KimiLinearConfig(
            hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, v_head_dim=8,
            qk_nope_head_dim=8, num_experts=4, num_experts_per_token=2, num_shared_experts=1,
            mlp_layer_types=["dense", "sparse"], layer_types=["linear_attention", "full_attention"], linear_head_dim=8,
            linear_num_heads=4, linear_conv_kernel_dim=4, **_SPECIAL)
    if kind == "lfm2":
        return transformers.Lfm2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, conv_L_cache=3, layer_types=["conv", "full_attention"],
                                       **_SPECIAL)
    if kind == "lfm2_moe":
        return transformers.Lfm2MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                          num_dense_layers=1, num_experts=4, num_experts_per_tok=2, conv_L_cache=3,
                                          layer_types=["conv", "full_attention"], **_SPECIAL)
    if kind == "lfm3":  # LFM2's short convolution, line for line
        return transformers.Lfm3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                       num_key_value_heads=1, conv_L_cache=3, layer_types=["conv", "full_attention"],
                                       **_SPECIAL)
    raise KeyError(kind)


def tiny_lm(kind: str) -> torch.nn.Module:
    """A random tiny model whose greedy tokens vary (recurrent_checks.widened)."""
    import transformers

    torch.manual_seed(0)
    return widened(transformers.AutoModelForCausalLM.from_config(_config(kind)))


_SLOW = pytest.mark.slow
KINDS = ("qwen3_5", "lfm2", pytest.param("qwen3_next", marks=_SLOW), pytest.param("qwen3_5_moe", marks=_SLOW),
         pytest.param("olmo_hybrid", marks=_SLOW), pytest.param("kimi_linear", marks=_SLOW),
         pytest.param("lfm2_moe", marks=_SLOW), pytest.param("lfm3", marks=_SLOW))
# per layer: a delta layer's conv and recurrent states, a short convolution's window; then the attention layer's
_KINDS = {"lfm2": ("state", "kv", "kv"), "lfm2_moe": ("state", "kv", "kv"), "lfm3": ("state", "kv", "kv")}
_DELTA_KINDS = ("state", "state", "kv", "kv")


@pytest.fixture(scope="module", params=KINDS)
def converted(request):
    lm = tiny_lm(request.param)
    return request.param, lm, torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)


def test_greedy_tokens_equal_transformers_before_and_after_save_and_load(converted, tmp_path):
    kind, lm, g = converted
    expected_kinds = _KINDS.get(kind, _DELTA_KINDS)
    check_round_trip(lm, g, tmp_path / kind, expected_kinds)
    if expected_kinds == _DELTA_KINDS:
        assert g.spec.cache_dtypes[1] == "float32"  # the delta rule's state: float32, as transformers keeps it




def test_left_padding_does_not_enter_the_state(converted):
    check_left_padding(converted[2], VOCAB)


def test_a_prompt_in_two_chunks_leaves_the_state_of_the_whole_prompt(converted):
    check_two_chunks(converted[2], VOCAB)


def test_the_state_after_a_prompt_is_transformers_own(converted):
    """The token scan ends a prompt in the state transformers' chunked rule leaves in its own cache: the conv window
    (transformers keeps `kernel` inputs, the artifact the `kernel - 1` the next token needs) and the recurrent state."""
    _, lm, g = converted
    from transformers import DynamicCache

    from torch2jax.hf.steps.recurrent import cache_keyword

    ids = np.random.default_rng(3).integers(3, VOCAB, (1, 10))
    logits, ours = prefill(g, ids, np.ones((1, 10), bool))
    theirs = DynamicCache(config=lm.config)
    with torch.no_grad():
        want = lm(input_ids=torch.as_tensor(ids), use_cache=True, **{cache_keyword(lm): theirs}).logits[:, -1].numpy()
    np.testing.assert_allclose(logits, want, atol=1e-4)
    at, compared = 0, 0
    for layer in theirs.layers:
        if getattr(layer, "keys", None) is not None and not hasattr(layer, "conv_states"):
            at += 2
            continue
        conv = layer.conv_states[0].numpy()
        np.testing.assert_allclose(ours[at][0], conv[0, :, 1:], atol=1e-5)
        at, compared = at + 1, compared + 1
        if layer.recurrent_states[0] is not None:
            np.testing.assert_allclose(ours[at][0], layer.recurrent_states[0][0].numpy(), atol=1e-5)
            at, compared = at + 1, compared + 1
    assert compared == g.spec.cache_kinds.count("state")


@pytest.mark.slow
def test_lfm2_with_conv_bias_keeps_the_bias_of_pads_out_of_the_window():
    """transformers zeroes a pad's hidden state but not the in-projection's bias, so bias_B * bias_x enters a padded
    row's window there (its padded rows differ from the rows alone); the artifact's padded row is the row alone, and
    an unpadded row generates transformers' tokens."""
    import transformers

    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(transformers.Lfm2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        conv_L_cache=3, layer_types=["conv", "full_attention"], conv_bias=True, **_SPECIAL)).eval()
    with torch.no_grad():
        for module in lm.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0, module.weight.shape[-1] ** -0.5)
                if module.bias is not None:
                    module.bias.normal_(0, 1)
            elif isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0, 1)
    g = torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)
    prompt = np.random.default_rng(4).integers(3, VOCAB, (1, 6))
    with torch.no_grad():
        want = lm.generate(torch.as_tensor(prompt), attention_mask=torch.ones(1, 6, dtype=torch.long), do_sample=False,
                           max_new_tokens=10, eos_token_id=None, pad_token_id=0)
    alone = g.generate(prompt, max_new_tokens=10, eos_token_id=[])
    assert alone[0].tolist() == want[0].tolist()
    ids = np.concatenate([np.full((1, 3), 0), prompt], axis=1)
    mask = np.concatenate([np.zeros((1, 3), bool), np.ones((1, 6), bool)], axis=1)
    logits, _ = prefill(g, ids, mask)
    alone_logits, _ = prefill(g, prompt, np.ones((1, 6), bool))
    np.testing.assert_allclose(logits, alone_logits, atol=1e-5)
    with torch.no_grad():  # transformers' own padded row is not its row alone (the difference documented above)
        padded = lm(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask).long()).logits[0, -1]
        unpadded = lm(input_ids=torch.as_tensor(prompt)).logits[0, -1]
    assert (padded - unpadded).abs().max() > 1e-3
