"""causal_lm_loss equals transformers' loss: the shift by one, -100 ignored, the mean over the kept tokens."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from torch2jax.finetune import causal_lm_loss


def test_the_loss_equals_transformers_lm_loss(case):
    logits = case.model(case.ids, attention_mask=case.mask)["logits"]
    with torch.no_grad():
        theirs = case.lm(input_ids=torch.from_numpy(case.ids), attention_mask=torch.from_numpy(case.mask),
                         labels=torch.from_numpy(case.labels)).loss.item()
    np.testing.assert_allclose(float(causal_lm_loss(logits, case.labels)), theirs, rtol=1e-5)


def test_the_loss_equals_for_causal_lm_loss_on_random_logits():
    from transformers.loss.loss_utils import ForCausalLMLoss

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((3, 7, 11)).astype(np.float32) * 3
    labels = rng.integers(0, 11, (3, 7))
    labels[0, :4] = -100
    labels[2, 5:] = -100
    theirs = ForCausalLMLoss(torch.from_numpy(logits), torch.from_numpy(labels), vocab_size=11).item()
    np.testing.assert_allclose(float(causal_lm_loss(logits, labels)), theirs, rtol=1e-5)
    # bfloat16 logits are computed in float32, as transformers upcasts them
    assert causal_lm_loss(jnp.asarray(logits, jnp.bfloat16), labels).dtype == jnp.float32


def test_a_batch_with_every_label_ignored_has_loss_zero_not_nan():
    logits = np.zeros((1, 4, 5), np.float32)
    assert float(causal_lm_loss(logits, np.full((1, 4), -100))) == 0.0
