"""The `_foreach_*` ops: one op over lists of tensors, as torch.optim (foreach=True, the default on
accelerators) and `clip_grad_norm_` call them.

Each is its per-tensor op applied to every element, with that element's output dtype and shape as
torch recorded them (the node's list of output metas): torch's CPU kernels for these lists do exactly
that, one per-tensor kernel per element. Arguments by kind: a tensor list gives element i, a scalar
list (`Scalar[]`, or the 1-d `scalars` tensor of `.Tensor` overloads of addcmul/addcdiv) its i-th
scalar, a plain scalar or a 0-dim `other` tensor goes to every element unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from .opmath import computed_in
from .registry import lookup, lowers

_UNARY = (
    "abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
    "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign",
    "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
)


def _element(ctx, i: int):
    """`ctx` as the context of element i's per-tensor op: the node with element i's output meta."""
    if ctx is None:
        return None
    element = copy.copy(ctx)
    element.node = dataclasses.replace(ctx.node, meta=ctx.node.meta[i])
    return element


def _each(fn: Callable, ctx, count: int, args_of: Callable[[int], tuple]) -> list:
    return [fn(_element(ctx, i), *args_of(i)) for i in range(count)]


def _per_tensor(op: str) -> Callable:
    """The lowering registered for a per-tensor op (looked up when called, so that a user's replacement
    counts), as f(element_ctx, *args)."""

    def run(ctx, *args, **kwargs):
        lowering = lookup(op)
        return lowering.fn(ctx, *args, **kwargs) if lowering.ctx else lowering.fn(*args, **kwargs)

    return run


def _register_unary(name: str) -> None:
    element = _per_tensor(f"aten.{name}.default")

    def foreach_unary(ctx, tensors):
        return _each(element, ctx, len(tensors), lambda i: (tensors[i],))

    foreach_unary.__name__ = f"foreach_{name}"
    lowers(f"aten._foreach_{name}.default", ctx=True)(foreach_unary)


for _name in _UNARY:
    _register_unary(_name)


def _each_kw(fn: Callable, ctx, count: int, args_of: Callable[[int], tuple], kwargs: dict) -> list:
    return [fn(_element(ctx, i), *args_of(i), **kwargs) for i in range(count)]


def _register_binary(name: str, element_op: str, scalar_op: str | None = None, tensor: bool = True) -> None:
    """The List / Scalar / ScalarList (/ Tensor) overloads of a binary op; `alpha` passes through."""
    element = _per_tensor(element_op)
    scalar_element = _per_tensor(scalar_op) if scalar_op else element

    def foreach_list(ctx, tensors, others, **kwargs):
        return _each_kw(element, ctx, len(tensors), lambda i: (tensors[i], others[i]), kwargs)

    def foreach_scalar(ctx, tensors, scalar):
        return _each(scalar_element, ctx, len(tensors), lambda i: (tensors[i], scalar))

    def foreach_scalar_list(ctx, tensors, scalars):
        return _each(scalar_element, ctx, len(tensors), lambda i: (tensors[i], scalars[i]))

    def foreach_tensor(ctx, tensors, other, **kwargs):  # one 0-dim tensor for every element
        return _each_kw(element, ctx, len(tensors), lambda i: (tensors[i], other), kwargs)

    for overload, fn in (("List", foreach_list), ("Scalar", foreach_scalar), ("ScalarList", foreach_scalar_list)):
        fn.__name__ = f"foreach_{name}_{overload.lower()}"
        lowers(f"aten._foreach_{name}.{overload}", ctx=True)(fn)
    if tensor:
        foreach_tensor.__name__ = f"foreach_{name}_tensor"
        lowers(f"aten._foreach_{name}.Tensor", ctx=True)(foreach_tensor)


_register_binary("add", "aten.add.Tensor")
_register_binary("sub", "aten.sub.Tensor", tensor=False)
_register_binary("mul", "aten.mul.Tensor")
_register_binary("div", "aten.div.Tensor")
_register_binary("maximum", "aten.maximum.default", "aten.clamp_min.default", tensor=False)
_register_binary("minimum", "aten.minimum.default", "aten.clamp_max.default", tensor=False)
_register_binary("clamp_min", "aten.clamp_min.Tensor", "aten.clamp_min.default", tensor=False)
_register_binary("clamp_max", "aten.clamp_max.Tensor", "aten.clamp_max.default", tensor=False)
_register_binary("pow", "aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", tensor=False)


@lowers("aten._foreach_pow.ScalarAndTensor", ctx=True)
def foreach_pow_scalar_and_tensor(ctx, base, exponents):
    pow_scalar = _per_tensor("aten.pow.Scalar")
    return _each(pow_scalar, ctx, len(exponents), lambda i: (base, exponents[i]))


def addcmul(ctx, x, tensor1, tensor2, value=1):
    """x + value * tensor1 * tensor2, in that order (torch's CPU kernel and its decomposition)."""
    x, tensor1, tensor2, value = computed_in(ctx, x, tensor1, tensor2, value)
    return x + value * tensor1 * tensor2


def addcdiv(ctx, x, tensor1, tensor2, value=1):
    """x + value * tensor1 / tensor2, in that order (torch's CPU kernel and its decomposition)."""
    x, tensor1, tensor2, value = computed_in(ctx, x, tensor1, tensor2, value)
    return x + value * tensor1 / tensor2


def _register_pointwise(name: str, element: Callable) -> None:
    def foreach_scalar(ctx, tensors, tensors1, tensors2, value=1):
        return _each(element, ctx, len(tensors), lambda i: (tensors[i], tensors1[i], tensors2[i], value))

    def foreach_scalars(ctx, tensors, tensors1, tensors2, scalars):  # a list, or a 1-d tensor of them
        return _each(element, ctx, len(tensors), lambda i: (tensors[i], tensors1[i], tensors2[i], scalars[i]))

    foreach_scalar.__name__, foreach_scalars.__name__ = f"foreach_{name}_scalar", f"foreach_{name}_scalars"
    lowers(f"aten._foreach_{name}.Scalar", ctx=True)(foreach_scalar)
    lowers(f"aten._foreach_{name}.ScalarList", f"aten._foreach_{name}.Tensor", ctx=True)(foreach_scalars)


_register_pointwise("addcmul", addcmul)
_register_pointwise("addcdiv", addcdiv)


@lowers("aten._foreach_lerp.List", "aten._foreach_lerp.ScalarList", ctx=True)
def foreach_lerp_list(ctx, tensors, ends, weights):
    lerp = _per_tensor("aten.lerp.Tensor")
    return _each(lerp, ctx, len(tensors), lambda i: (tensors[i], ends[i], weights[i]))


@lowers("aten._foreach_lerp.Scalar", ctx=True)
def foreach_lerp_scalar(ctx, tensors, ends, weight):
    lerp = _per_tensor("aten.lerp.Scalar")
    return _each(lerp, ctx, len(tensors), lambda i: (tensors[i], ends[i], weight))


@lowers("aten._foreach_norm.Scalar", ctx=True)
def foreach_norm(ctx, tensors, ord=2, dtype=None):
    """Each tensor's vector norm over all its elements (clip_grad_norm_'s per-parameter norms)."""
    norm = _per_tensor("aten.linalg_vector_norm.default")
    return _each(norm, ctx, len(tensors), lambda i: (tensors[i], ord, None, False, dtype))


@lowers("aten._foreach_max.default", ctx=True)
def foreach_max(ctx, tensors):
    largest = _per_tensor("aten.max.default")
    return _each(largest, ctx, len(tensors), lambda i: (tensors[i],))


@lowers("aten._foreach_clone.default")
def foreach_clone(tensors, memory_format=None):
    return list(tensors)


@lowers("aten._foreach_copy.default", ctx=True)
def foreach_copy(ctx, tensors, sources, non_blocking=False):
    """Each source broadcast to its tensor's shape, in its dtype."""
    return [jnp.broadcast_to(jnp.asarray(s), t.shape).astype(t.dtype) for t, s in zip(tensors, sources)]


@lowers("aten._foreach_zero.default")
def foreach_zero(tensors):
    return [jnp.zeros_like(t) for t in tensors]

