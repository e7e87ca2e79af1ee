"""Checks every recurrent family's generation tests share (test_recurrent_generation.py, test_mamba_kin_generation.py,
test_gated_delta_generation.py, test_mamba2_kin_generation.py): a tiny model whose tokens vary, greedy tokens against
transformers before and after save + load with the cache's kinds, left padding kept out of the state, and a prompt
prefilled in two chunks."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import torch

import torch2jax
from torch2jax.hf.verify import check_generation, verify_generation


def widened(lm: torch.nn.Module, convolutions: bool = False, norms: float = 0.0) -> torch.nn.Module:
    """`lm` with its projections and embeddings drawn wider than transformers' init, which leaves the residual stream
    near each token's embedding (every step would repeat the last token); with `convolutions` the depthwise
    convolutions too, and with `norms` > 0 the norm weights moved that far from one (so a norm left out shows)."""
    with torch.no_grad():
        for module in lm.modules():
            if isinstance(module, torch.nn.Linear) or (convolutions and isinstance(module, torch.nn.Conv1d)):
                module.weight.normal_(0, module.weight.shape[-1] ** -0.5)
            elif isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0, 1)
        if norms:
            for name, parameter in lm.named_parameters():
                if "norm" in name and parameter.ndim == 1:
                    parameter.add_(norms * torch.randn_like(parameter))
    return lm.eval()


def check_round_trip(lm: torch.nn.Module, g, out: Path, kinds: tuple[str, ...], check=None) -> None:
    """Greedy tokens equal transformers' (`check(lm, generator)`, verify_generation by default) before and after
    save + load, the cache tensors' kinds are `kinds` in the generator, the manifest and the loaded one, and each
    state tensor that follows a conv state (an SSM or delta-rule state) is float32 on disk."""
    check = check or (lambda lm, g: check_generation(verify_generation(lm, g, tokens=12)))
    assert g.spec.cache_kinds == kinds
    check(lm, g)
    loaded = torch2jax.load(torch2jax.save(g, out))
    cache = json.loads((out / "manifest.json").read_text())["generation"]["cache"]
    assert cache["kinds"] == list(kinds)
    assert loaded.spec.cache_kinds == kinds and loaded.spec.cache_shapes == g.spec.cache_shapes
    assert loaded.spec.cache_dtypes == g.spec.cache_dtypes
    check(lm, loaded)


def prefill(g, ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """One prefill of `ids` from an empty cache, slots 0.., positions counting each row's real tokens."""
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    logits, cache = g.prefill(g.new_cache(ids.shape[0]), jnp.asarray(ids), jnp.asarray(positions),
                              jnp.arange(ids.shape[1]), jnp.asarray(mask))
    return np.asarray(logits), [np.asarray(c) for c in cache]


def check_left_padding(g, vocab: int) -> None:
    """A row padded on the left with arbitrary (non-pad) tokens ends its prompt with the states, and logits, of the
    row alone (the batch's other row is the longer prompt), and then generates what the row alone does."""
    rng = np.random.default_rng(1)
    short, long = rng.integers(3, vocab, 5), rng.integers(3, vocab, 9)
    ids = np.stack([np.concatenate([rng.integers(3, vocab, 4), short]), long])
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False
    logits, cache = prefill(g, ids, mask)
    alone_logits, alone_cache = prefill(g, short[None], np.ones((1, 5), bool))
    np.testing.assert_allclose(logits[0], alone_logits[0], atol=1e-5)
    states = [(padded, alone) for kind, padded, alone in zip(g.spec.cache_kinds, cache, alone_cache) if kind == "state"]
    assert states  # keys and values keep the pads' slots (masked); a state has no slots
    for padded, alone in states:
        np.testing.assert_allclose(padded[0], alone[0], atol=1e-5)
    together = g.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])[0, 9:]
    assert together.tolist() == g.generate(short[None], max_new_tokens=8, eos_token_id=[])[0, 5:].tolist()


def check_two_chunks(g, vocab: int) -> None:
    """Prefill continues from the cache it is given (the server's chunked prefill), so a prompt run as two calls ends
    with the cache and logits of one call (keys and values included). The first chunk has the shapes of the
    left-padding check's row alone: compiled once for both."""
    ids = np.random.default_rng(2).integers(3, vocab, (1, 10))
    whole_logits, whole_cache = prefill(g, ids, np.ones((1, 10), bool))
    valid = jnp.ones((1, 10), bool)
    positions = jnp.arange(10)[None]
    _, cache = g.prefill(g.new_cache(1), jnp.asarray(ids[:, :5]), positions[:, :5], jnp.arange(5), valid[:, :5])
    logits, cache = g.prefill(cache, jnp.asarray(ids[:, 5:]), positions[:, 5:], jnp.arange(5, 10), valid)
    np.testing.assert_allclose(np.asarray(logits), whole_logits, atol=1e-5)
    for chunked, whole in zip(cache, whole_cache):
        np.testing.assert_allclose(np.asarray(chunked), whole, atol=1e-5)
