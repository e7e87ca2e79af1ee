"""The LoRA training step: optimizers with torch's meaning, a jitted step over the adapters alone (gradient
accumulation included), and batches of prompt / completion token ids with the prompt and the padding not trained on.

optax is imported inside the functions that need it, so `import torch2jax.finetune` works without it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .lora import LoraConfig, LoraError, apply_fn
from .loss import IGNORE_INDEX, causal_lm_loss

OPTIMIZERS = ("adamw", "sgd")
# torch.optim's defaults, so the same lr gives the same trajectory as torch
TORCH_WEIGHT_DECAY = {"sgd": 0.0, "adamw": 0.01}
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.999), 1e-8


def optimizer(name: str, lr: float, weight_decay: float | None = None) -> Any:
    """An optax optimizer that steps as torch.optim's of the same name, with torch's defaults:

    "sgd": torch.optim.SGD(lr, weight_decay): plain, no momentum; a weight decay adds weight_decay * p to the gradient
      (L2, as torch's SGD does). Default weight_decay 0.
    "adamw": torch.optim.AdamW(lr, betas=(0.9, 0.999), eps=1e-8, weight_decay): eps added after the square root of the
      bias-corrected second moment, the decay decoupled (p -= lr * weight_decay * p). Default weight_decay 0.01 -- torch's,
      not optax.adamw's 1e-4.

    weight_decay None takes that default. Other names: LoraError naming the choices."""
    import optax

    if name not in OPTIMIZERS:
        raise LoraError(f"optimizer {name!r} is not supported: choose one of {list(OPTIMIZERS)}")
    decay = TORCH_WEIGHT_DECAY[name] if weight_decay is None else float(weight_decay)
    if name == "sgd":
        return optax.sgd(lr) if decay == 0 else optax.chain(optax.add_decayed_weights(decay), optax.sgd(lr))
    return optax.adamw(lr, b1=ADAMW_BETAS[0], b2=ADAMW_BETAS[1], eps=ADAMW_EPS, eps_root=0.0, weight_decay=decay)


def lora_train_step(model: Any, config: LoraConfig, opt: Any, accumulate: int = 1) -> Callable[..., Any]:
    """step(lora, opt_state, batch) -> (lora, opt_state, loss), jitted: one optimizer step on the adapters, the base
    params (model.params) frozen. batch: dict(input_ids, attention_mask, labels) [rows, seq] (make_batch's); the loss
    is causal_lm_loss over the model's logits, the batch's loss before the step.

    accumulate: split the rows into that many micro-batches run one after the other (less activation memory); their
    gradients are summed weighted by each one's trained tokens, so the step equals the whole batch's. The rows must
    divide evenly, and the model must take a batch of rows / accumulate (convert it with a dynamic batch dim, or at
    that size)."""
    import optax

    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        raise LoraError(f"accumulate must be an integer >= 1, got {accumulate!r}")
    forward = apply_fn(model, config)
    params = model.params

    def micro_loss(lora: dict, micro: dict) -> jax.Array:
        logits = forward(lora, params, micro["input_ids"], attention_mask=micro["attention_mask"])["logits"]
        return causal_lm_loss(logits, micro["labels"])

    def trained_tokens(labels: jax.Array) -> jax.Array:
        return jnp.sum(labels[..., 1:] != IGNORE_INDEX).astype(jnp.float32)

    def loss_and_grads(lora: dict, batch: dict) -> tuple[jax.Array, dict]:
        if accumulate == 1:
            return jax.value_and_grad(micro_loss)(lora, batch)
        rows = batch["input_ids"].shape[0]
        if rows % accumulate:
            raise LoraError(f"accumulate={accumulate} does not divide the batch's {rows} rows")
        micros = {k: v.reshape(accumulate, rows // accumulate, *v.shape[1:]) for k, v in batch.items()}
        total = jnp.maximum(trained_tokens(batch["labels"]), 1.0)

        def body(carry: tuple[jax.Array, dict], micro: dict) -> tuple[tuple[jax.Array, dict], None]:
            loss, grads = jax.value_and_grad(micro_loss)(lora, micro)
            weight = trained_tokens(micro["labels"]) / total  # each micro loss is a mean over its own tokens
            summed_loss, summed = carry
            return (summed_loss + weight * loss, jax.tree.map(lambda s, g: s + weight * g, summed, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, lora)
        (loss, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micros)
        return loss, grads

    @jax.jit
    def step(lora: dict, opt_state: Any, batch: dict) -> tuple[dict, Any, jax.Array]:
        loss, grads = loss_and_grads(lora, batch)
        updates, opt_state = opt.update(grads, opt_state, lora)
        return optax.apply_updates(lora, updates), opt_state, loss

    return step


def make_batch(rows: Sequence[tuple[Sequence[int], Sequence[int]]], max_length: int, pad_id: int) -> dict[str, np.ndarray]:
    """A training batch from token ids (tokenizing is the caller's): each row (prompt_ids, completion_ids), the
    prompt's labels IGNORE_INDEX (-100) so only the completion is trained on; a plain text row is ([], ids), all of it
    trained on. prompt + completion is truncated to max_length and right-padded with pad_id to max_length (one shape
    for every batch, so the jitted step compiles once); padding has attention_mask 0 and label -100.

    Returns dict(input_ids, attention_mask, labels), int32 [len(rows), max_length]."""
    if not isinstance(max_length, int) or max_length < 1:
        raise LoraError(f"max_length must be an integer >= 1, got {max_length!r}")
    if not rows:
        raise LoraError("make_batch needs at least one row")
    shape = (len(rows), max_length)
    ids = np.full(shape, pad_id, np.int32)
    mask = np.zeros(shape, np.int32)
    labels = np.full(shape, IGNORE_INDEX, np.int32)
    for i, (prompt, completion) in enumerate(rows):
        tokens = (list(prompt) + list(completion))[:max_length]
        if not tokens:
            raise LoraError(f"row {i} has no tokens (an empty prompt and completion)")
        n = len(tokens)
        ids[i, :n] = tokens
        mask[i, :n] = 1
        labels[i, len(prompt):n] = tokens[len(prompt):]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
