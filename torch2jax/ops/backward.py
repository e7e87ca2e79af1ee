"""Backward ops of the core opset, as the VJP of this project's own forward lowerings.

They appear only in graphs that include a backward pass (e.g. a joint training graph); an
inference export never has them. Deriving each from the forward lowering keeps one definition
of the op's semantics; max-pool routes gradients through torch's saved indices, exactly as torch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..errors import LoweringError
from .attention import scaled_dot_product_attention
from .conv import convolution
from .normalization import native_group_norm, native_layer_norm
from .pooling import adaptive_avg_pool2d, avg_pool2d
from .registry import lowers


def _masked(grads, output_mask):
    return tuple(g if keep else None for g, keep in zip(grads, output_mask))


@lowers("aten.native_layer_norm_backward.default")
def native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    var = jnp.var(x.astype(jnp.float32), axis=axes, keepdims=True)
    eps = jnp.mean(1.0 / jnp.square(rstd.astype(jnp.float32)) - var)  # the forward's eps, from its saved rstd

    def forward(x, weight, bias):
        return native_layer_norm(x, normalized_shape, weight, bias, eps)[0]

    _, vjp = jax.vjp(forward, x, weight, bias)
    return _masked(vjp(grad_out.astype(x.dtype)), output_mask)


@lowers("aten.native_group_norm_backward.default")
def native_group_norm_backward(grad_out, x, mean, rstd, weight, n, c, hw, group, output_mask):
    bias = None if weight is None else jnp.zeros_like(weight)
    eps = _eps_from(x, mean, rstd, group)

    def forward(x, weight):
        return native_group_norm(x, weight, bias, n, c, hw, group, eps)[0]

    _, vjp = jax.vjp(forward, x, weight)
    dx, dw = vjp(grad_out.astype(x.dtype))
    db = None if weight is None else jnp.sum(grad_out.reshape(x.shape[0], x.shape[1], -1), axis=(0, 2)).astype(weight.dtype)
    return _masked((dx, dw, db), output_mask)


def _eps_from(x, mean, rstd, group):
    """The eps the forward used, recovered from its saved statistics: rstd = 1/sqrt(var + eps)."""
    grouped = x.astype(jnp.float32).reshape(x.shape[0], group, -1)
    var = jnp.var(grouped, axis=-1)
    return jnp.mean(1.0 / jnp.square(rstd.astype(jnp.float32)) - var)


@lowers("aten.convolution_backward.default")
def convolution_backward(grad_out, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    def forward(x, weight):
        return convolution(x, weight, None, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(forward, x, weight)
    dx, dw = vjp(grad_out.astype(x.dtype))
    reduce_axes = (0,) + tuple(range(2, grad_out.ndim))
    db = jnp.sum(grad_out, axis=reduce_axes) if bias_sizes is not None else None
    return _masked((dx, dw, db), output_mask)


@lowers("aten._scaled_dot_product_flash_attention_for_cpu_backward.default", ctx=True)
def flash_attention_for_cpu_backward(ctx, grad_out, q, k, v, out, logsumexp, dropout_p, is_causal, attn_mask=None, scale=None):
    """Gradients of torch's CPU attention, as the VJP of the SDPA lowering (torch's saved `out` and
    `logsumexp` are not needed). With dropout the mask torch drew is not recoverable: refused."""
    if dropout_p:
        raise LoweringError(
            f"the backward of CPU attention with dropout_p={dropout_p} needs torch's dropout mask, which "
            "cannot be recomputed in JAX: use dropout_p=0 or a dropout outside the attention"
        )

    def forward(q, k, v):
        return scaled_dot_product_attention(ctx, q, k, v, attn_mask, 0.0, is_causal, scale)

    _, vjp = jax.vjp(forward, q, k, v)
    return vjp(grad_out.astype(q.dtype))


@lowers("aten.avg_pool2d_backward.default")
def avg_pool2d_backward(grad_out, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    _, vjp = jax.vjp(lambda x: avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override), x)
    return vjp(grad_out.astype(x.dtype))[0]


@lowers("aten._adaptive_avg_pool2d_backward.default")
def adaptive_avg_pool2d_backward(grad_out, x):
    _, vjp = jax.vjp(lambda x: adaptive_avg_pool2d(x, grad_out.shape[-2:]), x)
    return vjp(grad_out.astype(x.dtype))[0]


@lowers("aten.max_pool2d_with_indices_backward.default")
def max_pool2d_with_indices_backward(grad_out, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    """Each output's gradient goes to the input position torch recorded in `indices` (summed on repeats)."""
    plane = x.shape[-2] * x.shape[-1]
    lead = x.shape[:-2]
    flat_grad = grad_out.reshape(lead + (-1,))
    flat_idx = indices.reshape(lead + (-1,))
    zeros = jnp.zeros(lead + (plane,), grad_out.dtype)
    scattered = jax.vmap(lambda z, i, g: z.at[i].add(g))(
        zeros.reshape(-1, plane), flat_idx.reshape(-1, flat_idx.shape[-1]), flat_grad.reshape(-1, flat_grad.shape[-1])
    )
    return scattered.reshape(x.shape).astype(x.dtype)
