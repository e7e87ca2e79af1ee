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


def lora_train_step(model: Any, config: LoraConfig, opt: Any, accumulate: int = 1, remat: bool = False) -> Callable[..., Any]:
    """step(lora, opt_state, batch) -> (lora, opt_state, loss), jitted: one optimizer step on the adapters, the base
    params (model.params) frozen. batch: dict(input_ids, attention_mask, labels) [rows, seq] (make_batch's); the loss
    is causal_lm_loss over the model's logits, the batch's loss before the step.

    accumulate: split the rows into that many micro-batches run one after the other (less activation memory); their
    gradients are summed weighted by each one's trained tokens, so the step equals the whole batch's. The rows must
    divide evenly, and the model must take a batch of rows / accumulate (convert it with a dynamic batch dim, or at
    that size).

    remat: activation checkpointing: the backward pass keeps only the matrix products' outputs of the forward and
    computes the rest again (norms, activations, softmax), for less memory at the cost of some recomputation.

    A model converted in bfloat16 (torch2jax.convert(..., dtype="bfloat16")) computes in bfloat16; the adapters stay
    float32 (as PEFT keeps them) and the merged weights are cast to the base weights' dtype."""

    check_accumulate(accumulate)
    forward = apply_fn(model, config)

    def micro_loss(lora: dict, micro: dict, params: dict) -> jax.Array:
        logits = forward(lora, params, micro["input_ids"], attention_mask=micro["attention_mask"])["logits"]
        return causal_lm_loss(logits, micro["labels"])

    return optimizer_step(opt, micro_loss, accumulate, lambda lora: model.params, remat)


def full_train_step(model: Any, opt: Any, accumulate: int = 1, remat: bool = False) -> Callable[..., Any]:
    """step(trainable, opt_state, batch) -> (trainable, opt_state, loss), jitted: one optimizer step on `trainable`
    (full.model_parameters(model), or master_weights(...) of it: the weights torch would train), the rest of
    model.params (buffers) held as they are. batch, accumulate and remat as lora_train_step's.

    Each trained value enters the forward cast to the dtype of the model's own param: float32 master weights of a
    model converted in bfloat16 compute in bfloat16, and the optimizer updates the float32 masters."""
    dtypes = {name: jnp.result_type(value) for name, value in model.params.items()}

    def micro_loss(trainable: dict, micro: dict, frozen: dict) -> jax.Array:
        cast = {name: value.astype(dtypes[name]) for name, value in trainable.items()}
        logits = model.apply({**frozen, **cast}, micro["input_ids"], attention_mask=micro["attention_mask"])["logits"]
        return causal_lm_loss(logits, micro["labels"])

    return optimizer_step(opt, micro_loss, accumulate,
                          lambda trainable: {name: value for name, value in model.params.items() if name not in trainable},
                          remat)


def master_weights(trainable: dict, dtype: Any = jnp.float32) -> dict:
    """The trained values held in `dtype` (float32): the optimizer's copies of a bfloat16 model's weights, so small
    updates are not rounded away; full_train_step casts them back for the forward."""
    return {name: jnp.asarray(value, dtype) for name, value in trainable.items()}


def optimizer_step(opt: Any, micro_loss: Callable[..., jax.Array], accumulate: int, frozen: Callable[[Any], dict],
                   remat: bool = False) -> Callable[..., Any]:
    """step(trainable, opt_state, batch) -> (trainable, opt_state, loss): `micro_loss(trainable, micro, frozen(trainable))`
    accumulated over the batch, then one update of `opt`, jitted. The frozen params are an argument of the jitted step,
    not constants folded into what it compiles. remat: the forward's matrix products are kept for the backward, the
    rest recomputed."""
    import optax

    if remat:
        micro_loss = jax.checkpoint(micro_loss, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    loss_and_grads = accumulated_value_and_grad(micro_loss, accumulate)

    @jax.jit
    def jitted(trainable: Any, opt_state: Any, batch: dict, frozen_params: dict) -> tuple[Any, Any, jax.Array]:
        loss, grads = loss_and_grads(trainable, batch, frozen_params)
        updates, opt_state = opt.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss

    def step(trainable: Any, opt_state: Any, batch: dict) -> tuple[Any, Any, jax.Array]:
        return jitted(trainable, opt_state, batch, frozen(trainable))

    # step.lower(trainable, opt_state, batch).compile().memory_analysis(): what the step holds, for a benchmark
    step.lower = lambda trainable, opt_state, batch: jitted.lower(trainable, opt_state, batch, frozen(trainable))
    return step


def check_accumulate(accumulate: Any) -> None:
    if not isinstance(accumulate, int) or isinstance(accumulate, bool) or accumulate < 1:
        raise LoraError(f"accumulate must be an integer >= 1, got {accumulate!r}")


def accumulated_value_and_grad(micro_loss: Callable[..., jax.Array], accumulate: int) -> Callable[..., tuple[jax.Array, Any]]:
    """fn(trainable, batch, *rest) -> (loss, grads) of `micro_loss(trainable, micro_batch, *rest)` over the batch's
    rows split into `accumulate` micro-batches run one after the other, each weighted by its trained tokens, so the
    result equals one pass over the whole batch (a mean over all its trained tokens) with less activation memory."""
    check_accumulate(accumulate)

    def trained_tokens(labels: jax.Array) -> jax.Array:
        return jnp.sum(labels[..., 1:] != IGNORE_INDEX).astype(jnp.float32)

    def loss_and_grads(trainable: Any, batch: dict, *rest: Any) -> tuple[jax.Array, Any]:
        if accumulate == 1:
            return jax.value_and_grad(micro_loss)(trainable, batch, *rest)
        rows = batch["input_ids"].shape[0]
        if rows % accumulate:
            raise LoraError(f"accumulate={accumulate} does not divide the batch's {rows} rows")
        micros = {k: v.reshape(accumulate, rows // accumulate, *v.shape[1:]) for k, v in batch.items()}
        total = jnp.maximum(trained_tokens(batch["labels"]), 1.0)

        def body(carry: tuple[jax.Array, Any], micro: dict) -> tuple[tuple[jax.Array, Any], None]:
            loss, grads = jax.value_and_grad(micro_loss)(trainable, micro, *rest)
            weight = trained_tokens(micro["labels"]) / total  # each micro loss is a mean over its own tokens
            summed_loss, summed = carry
            return (summed_loss + weight * loss, jax.tree.map(lambda s, g: s + weight * g, summed, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, trainable)
        (loss, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micros)
        return loss, grads

    return loss_and_grads


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
