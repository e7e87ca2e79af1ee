"""Mamba's kin generate what transformers' own `generate` does, before and after save + load, with their recurrent
state as the artifact's donated cache (hf/stand_ins/mamba_kin.py): FalconMamba and Jamba (Mamba1 with norms on the
time step, B and C; Jamba with attention and MoE layers beside), Zamba (multi-head Mamba1, a shared attention block
whose layers keep states and keys/values together) and Zamba2 (Mamba2 layers, the same hybrid layers).
Left padding never enters the state, and a prompt prefilled in two chunks ends where one call does.

One family per distinct mixer runs by default (FalconMamba: the normed Mamba1; Zamba: the multi-head Mamba1 and the
hybrid layers); Jamba (FalconMamba's mixer) and Zamba2 (Mamba2's mixer, tested in test_recurrent_generation.py)
run with the slow tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax

from .recurrent_checks import check_left_padding, check_round_trip, check_two_chunks

VOCAB = 96


def _config(kind: str):
    import transformers

    special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, vocab_size=VOCAB, tie_word_embeddings=False)
    attention = dict(num_attention_heads=4, num_key_value_heads=4, intermediate_size=64)
    if kind == "falcon_mamba":
        return transformers.FalconMambaConfig(hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
                                              time_step_rank=4, **special)
    if kind == "jamba":  # layer 0: Mamba with an MLP, layer 1: attention with a mixture of experts
        return transformers.JambaConfig(hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=4,
                                        intermediate_size=64, num_experts=2, num_experts_per_tok=1,
                                        expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2,
                                        attn_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                                        mamba_dt_rank=4, **special)
    if kind == "zamba":  # the shared attention block before layers 0 and 2
        return transformers.ZambaConfig(hidden_size=32, attention_hidden_size=64, attention_head_dim=16, n_mamba_heads=2,
                                        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4,
                                        num_hidden_layers=3, layers_block_type=["hybrid", "mamba", "hybrid"],
                                        **attention, **special)
    if kind == "zamba2":  # two shared blocks (adapters per hybrid layer), rotary positions
        return transformers.Zamba2Config(hidden_size=32, attention_head_dim=16, n_mamba_heads=8, mamba_headdim=8,
                                         mamba_ngroups=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, chunk_size=4,
                                         num_hidden_layers=3, layers_block_type=["mamba", "hybrid", "hybrid"],
                                         num_mem_blocks=2, use_shared_attention_adapter=True, adapter_rank=8,
                                         use_mem_rope=True, **attention, **special)
    raise KeyError(kind)


def tiny_lm(kind: str) -> torch.nn.Module:
    """A random tiny model whose greedy tokens depend on the context: projections, convolutions, embeddings and
    Zamba's per-head projections are drawn wider than transformers' init (which leaves the residual stream near each
    token's embedding, so every step would follow from the last token alone), and norm weights away from one (so a
    norm left out shows)."""
    import transformers

    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(_config(kind)).eval()
    with torch.no_grad():
        for name, param in lm.named_parameters():
            if name.endswith(("x_proj_weight", "dt_proj_weight")):  # Zamba: [heads, out, in]
                param.normal_(0, param.shape[-1] ** -0.5)
            elif name.endswith("norm.weight") and param.dim() == 1:
                param.normal_(1, 0.2)
        for module in lm.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0, module.weight.shape[-1] ** -0.5)
            elif isinstance(module, torch.nn.Conv1d):  # depthwise: [channels, 1, kernel]
                module.weight.normal_(0, module.weight.shape[-1] ** -0.5)
            elif isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0, 1)
    return lm


S, KV = "state", "kv"
EXPECTED_KINDS = {
    "falcon_mamba": (S, S) * 2,
    "jamba": (S, S, KV, KV),
    "zamba": (S, S, KV, KV, S, S, S, S, KV, KV),
    "zamba2": (S, S, S, S, KV, KV, S, S, KV, KV),
}
KINDS = [
    "falcon_mamba",
    pytest.param("zamba", marks=pytest.mark.slow),  # hybrid layers run by default with Falcon-H1 (mamba2_kin)
    pytest.param("jamba", marks=pytest.mark.slow),
    pytest.param("zamba2", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=KINDS)
def converted(request):
    lm = tiny_lm(request.param)
    return request.param, lm, torch2jax.convert_hf(lm, max_cache_len=48, max_batch=2)


def test_greedy_tokens_equal_transformers_before_and_after_save_and_load(converted, tmp_path):
    kind, lm, g = converted
    check_round_trip(lm, g, tmp_path / kind, EXPECTED_KINDS[kind])
    assert g.spec.cache_dtypes[1] == "float32"  # the SSM state




def test_left_padding_does_not_enter_the_state(converted):
    check_left_padding(converted[2], VOCAB)


def test_a_prompt_in_two_chunks_leaves_the_state_of_the_whole_prompt(converted):
    check_two_chunks(converted[2], VOCAB)


def test_each_decode_step_gives_transformers_logits(converted):
    """After a prompt, each one-token step (the decode graph's arithmetic) gives the logits of transformers' own
    one-token update from its cache, fed the same tokens: closer than greedy tokens show (Zamba2's decode step, for
    one, takes no time-step limit where its prompt does)."""
    from transformers import DynamicCache

    from torch2jax.hf.steps.recurrent import cache_keyword

    _, lm, g = converted
    prompt = np.random.default_rng(3).integers(3, VOCAB, 6)
    theirs_cache = DynamicCache(config=lm.config)
    keyword = cache_keyword(lm)
    with torch.no_grad():
        theirs = [lm(input_ids=torch.as_tensor(prompt[None]), use_cache=True, **{keyword: theirs_cache}).logits[0, -1]]
    ours, cache = g.prefill(g.new_cache(1), jnp.asarray(prompt[None]), jnp.arange(6)[None], jnp.arange(6),
                            jnp.ones((1, 6), bool))
    np.testing.assert_allclose(np.asarray(ours[0]), theirs[0].numpy(), atol=1e-4, rtol=1e-4)
    for at in range(6, 14):
        token = int(theirs[-1].argmax())
        with torch.no_grad():
            theirs.append(lm(input_ids=torch.tensor([[token]]), use_cache=True, **{keyword: theirs_cache}).logits[0, -1])
        ours, cache = g.prefill(cache, jnp.asarray([[token]]), jnp.asarray([[at]]), jnp.asarray([at]),
                                jnp.arange(14)[None] <= at)  # one span for every step: one compilation
        np.testing.assert_allclose(np.asarray(ours[0]), theirs[-1].numpy(), atol=1e-4, rtol=1e-4,
                                   err_msg=f"step at position {at}")
