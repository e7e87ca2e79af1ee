"""The causal-LM training loss, as transformers computes it (ForCausalLMLoss), so a JAX fine-tune optimizes the number
a torch user would see as `lm(input_ids, labels=labels).loss`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

IGNORE_INDEX = -100


def causal_lm_loss(logits: jax.Array, labels: jax.Array, ignore_index: int = IGNORE_INDEX) -> jax.Array:
    """Mean next-token cross entropy in float32: position t's logits predict labels[t + 1]; labels equal to
    `ignore_index` (-100: padding, the prompt) count for nothing. logits [..., seq, vocab], labels [..., seq].

    Where every label is ignored the loss is 0 (transformers gives nan), so one empty batch cannot poison the grads."""
    logits = logits[..., :-1, :].astype(jnp.float32)
    targets = labels[..., 1:]
    keep = targets != ignore_index
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, jnp.where(keep, targets, 0)[..., None].astype(jnp.int32), axis=-1)[..., 0]
    total = -jnp.sum(jnp.where(keep, picked, 0.0))
    return total / jnp.maximum(jnp.sum(keep), 1).astype(jnp.float32)
