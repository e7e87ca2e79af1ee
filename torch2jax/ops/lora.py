"""The LoRA side path of a matrix product (lowering/lora_paths.py adds it to a graph).

y + scale * (x @ A.T) @ B.T, computed as PEFT computes its LoRA layer: the adapter's product in float32 (x cast to the
adapter's dtype), added to the base product and rounded once to the base product's dtype. With per-row adapters A and B
are stacked [n, r, in] / [n, out, r] and `adapter_ids` [batch] picks each batch row's pair (-1: none, the base alone).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .registry import lookup, lowers


@lowers("torch2jax.lora.default")
def lora(y, x, a, b, scale, adapter_ids=None):
    """y [..., out] the base product of x [..., in]; a [r, in], b [out, r] (stacked: [n, r, in], [n, out, r]).

    Per row, the rows of x map to batch rows by position: x is read as [batch, rows per batch, in] (batch =
    adapter_ids' length), which is how a Linear's [batch, seq, in] input is laid out, flattened or not."""
    xf = x.astype(jnp.float32)
    if adapter_ids is None:
        delta = (xf @ a.astype(jnp.float32).T) @ b.astype(jnp.float32).T
    else:
        batch = adapter_ids.shape[0]
        rows = xf.reshape(batch, -1, x.shape[-1])
        chosen = adapter_ids >= 0
        pick = jnp.where(chosen, adapter_ids, 0)
        a_rows, b_rows = a.astype(jnp.float32)[pick], b.astype(jnp.float32)[pick]  # [batch, r, in], [batch, out, r]
        inner = jnp.einsum("bsi,bri->bsr", rows, a_rows)
        delta = jnp.einsum("bsr,bor->bso", inner, b_rows) * chosen[:, None, None].astype(jnp.float32)
        delta = delta.reshape(*x.shape[:-1], b.shape[-2])
    return (y.astype(jnp.float32) + scale * delta).astype(y.dtype)


@lowers("torch2jax.recomputed.default")
def recomputed(op: str, *args):
    """`op` on `args`, remade in the backward pass from its inputs instead of keeping its intermediates from the
    forward one. A quantized product under a side path (lora_paths.recompute_quantized_products): its gradient with
    respect to x needs the dequantized float weight, which autodiff would otherwise keep from the forward pass, a float
    copy of the base that QLoRA exists to avoid.

    The backward remakes it only once the incoming gradient exists. On CPU that takes a conditional whose predicate
    reads the gradient (fusion_barrier.apart's device): XLA:CPU drops optimization barriers, and then merges the
    backward's dequantization with the forward's, which keeps every layer's float weight alive until the backward pass
    (jax.checkpoint alone left the int8 step's peak where it was). Elsewhere a barrier over both suffices."""
    lowering = lookup(op)
    if lowering is None or lowering.ctx:
        raise ValueError(f"recomputed wraps a lowering that needs no context, not {op}")
    where = [i for i, arg in enumerate(args) if isinstance(arg, jax.Array)]

    def compute(*arrays):
        full = list(args)
        for i, array in zip(where, arrays):
            full[i] = array
        return lowering.fn(*full)

    @jax.custom_vjp
    def run(*arrays):
        return compute(*arrays)

    def forward(*arrays):
        return compute(*arrays), arrays

    def backward(arrays, cotangent):
        floating = [i for i, a in enumerate(arrays) if jnp.issubdtype(a.dtype, jnp.inexact)]

        def pull(cotangent, *inexact):
            def of_floating(*values):
                full = list(arrays)
                for i, value in zip(floating, values):
                    full[i] = value
                return compute(*full)

            return tuple(jax.vjp(of_floating, *inexact)[1](cotangent))

        def after_barrier():
            return pull(*lax.optimization_barrier((cotangent, *(arrays[i] for i in floating))))

        def in_a_conditional():  # both branches the same; the predicate is known only once the gradient is
            probe = jnp.isnan(jnp.sum(cotangent.reshape(-1)[:1].astype(jnp.float32)))
            return lax.cond(probe, pull, pull, cotangent, *(arrays[i] for i in floating))

        empty = isinstance(cotangent.size, int) and cotangent.size == 0
        grads = after_barrier() if empty else lax.platform_dependent(cpu=in_a_conditional, default=after_barrier)
        by_index = dict(zip(floating, grads))
        return tuple(by_index[i] if i in by_index else np.zeros(a.shape, jax.dtypes.float0) for i, a in enumerate(arrays))

    run.defvjp(forward, backward)
    return run(*(args[i] for i in where))
