"""Python-level and symbolic-size ops that appear in exported graphs: getitem, sym_size, int arithmetic.

These act on python ints or jax.export symbolic dims, not arrays, so shapes stay static where
torch's were and symbolic where torch's were.
"""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp

from .registry import lowers


@lowers("operator.getitem")
def getitem(container, index):
    return container[index]


@lowers("aten.sym_size.int")
def sym_size(x, dim):
    return x.shape[dim]


@lowers("aten.sym_numel.default")
def sym_numel(x):
    return math.prod(x.shape)


@lowers("aten.sym_stride.int")
def sym_stride(x, dim):
    return math.prod(x.shape[dim + 1 :]) if dim >= 0 else math.prod(x.shape[len(x.shape) + dim + 1 :])


lowers("operator.add")(operator.add)
lowers("operator.sub")(operator.sub)
lowers("operator.mul")(operator.mul)
lowers("operator.floordiv")(operator.floordiv)
lowers("operator.mod")(operator.mod)
lowers("operator.neg")(operator.neg)
lowers("operator.truediv")(operator.truediv)
lowers("operator.pow")(operator.pow)
lowers("operator.eq")(operator.eq)
lowers("operator.ne")(operator.ne)
lowers("operator.lt")(operator.lt)
lowers("operator.le")(operator.le)
lowers("operator.gt")(operator.gt)
lowers("operator.ge")(operator.ge)
lowers("operator.and_")(operator.and_)  # SymBools: python bools, or traced ones read from tensors
lowers("operator.or_")(operator.or_)


def _rounding(python_round, array_round):
    """math.floor / math.ceil of a size: an int for a python float; for a symbolic size times a float (which
    jax.export turns into a traced scalar, e.g. NLLB-MoE's capacity `ceil(fraction * tokens)`), the rounded value as an
    integer scalar array, usable wherever the graph compares or computes with it (not as a shape)."""

    def rounding(x):
        if isinstance(x, jax.Array):
            return array_round(x).astype(int)
        return python_round(x)

    return rounding


lowers("math.floor")(_rounding(math.floor, jnp.floor))
lowers("math.ceil")(_rounding(math.ceil, jnp.ceil))


@lowers("torch.sym_max")
def sym_max(a, b):
    return a if a >= b else b


@lowers("torch.sym_min")
def sym_min(a, b):
    return a if a <= b else b


@lowers("torch.sym_float")
def sym_float(a):
    return float(a) if isinstance(a, int) else a


@lowers("torch.sym_int")
def sym_int(a):
    return int(a) if isinstance(a, float) else a


@lowers("torch.sym_ite")
def sym_ite(condition, if_true, if_false):
    """`if_true if condition else if_false`; a condition read from a tensor's value is traced: select."""
    if isinstance(condition, (bool, int)):
        return if_true if condition else if_false
    return jnp.where(condition, if_true, if_false)


@lowers("torch.sym_not")
def sym_not(a):
    return not a


@lowers("aten._assert_scalar.default", "aten._assert_tensor_metadata.default", "aten.sym_constrain_range_for_size.default")
def _no_op_assert(*args, **kwargs):
    """Torch's runtime guards; the signature check and jax.export's shape checks cover them."""
    return None


@lowers("aten._assert_async.default", "aten._assert_async.msg")
def _no_op_data_assert(condition, message=None):
    """torch's check on tensor *values* (e.g. one_hot's index < num_classes) raises on bad data; a jitted
    JAX function cannot raise on data, so the check is dropped: valid inputs give torch's results, invalid
    ones are not reported (docs/limitations.md)."""
    return None


@lowers("aten.scalar_tensor.default", "prims.scalar_tensor.default")
def scalar_tensor(value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(value, dtype=dtype if dtype is not None else jnp.float32)


@lowers("aten._local_scalar_dense.default")
def local_scalar_dense(x):
    return x.reshape(())


@lowers("aten.sym_is_contiguous.default")
def sym_is_contiguous(x, memory_format=None):
    """JAX arrays are values with no strides: every one is contiguous."""
    return True
