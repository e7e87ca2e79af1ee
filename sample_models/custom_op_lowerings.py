"""The JAX lowering for samples::soft_clip (see custom_op.py). Pass it with --lowerings."""

import jax.numpy as jnp

import torch2jax


@torch2jax.register_lowering("samples::soft_clip")
def soft_clip(x, limit):
    return limit * jnp.tanh(x / limit)
