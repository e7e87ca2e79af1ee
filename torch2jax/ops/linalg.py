"""Matrix products. Low-precision inputs accumulate in float32 (preferred_element_type), as torch does."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..registry import lowers


def _matmul(a, b):
    dtype = jnp.result_type(a, b)
    if dtype in (jnp.bfloat16, jnp.float16):
        return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(dtype)
    return jnp.matmul(a, b)


@lowers("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def mm(a, b):
    return _matmul(a, b)


@lowers("aten.addmm.default")
def addmm(bias, a, b, beta=1, alpha=1):
    product = _matmul(a, b)
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return product + (bias if beta == 1 else bias * beta)


@lowers("aten.baddbmm.default")
def baddbmm(bias, a, b, beta=1, alpha=1):
    return addmm(bias, a, b, beta, alpha)


@lowers("aten.dot.default")
def dot(a, b):
    return lax.dot(a, b)
