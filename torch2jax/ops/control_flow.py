"""torch's higher-order operators: control flow -> lax control flow, and effect tokens.

Branches and bodies arrive as callables (the interpreter turns each `{"subgraph": name}` argument
into a traceable function of the subgraph's inputs returning the list of its outputs). torch
passes every value a body needs explicitly, params included, so nothing is captured by closure
except what the schema calls additional inputs.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ..errors import LoweringError
from .registry import lookup, lowers


def _scalar_bool(value):
    return jnp.reshape(value, ()).astype(jnp.bool_)


def _like(values, reference) -> tuple:
    """The body's outputs in the dtypes of the carry they replace (lax needs them identical)."""
    return tuple(jnp.asarray(v).astype(jnp.asarray(r).dtype) for v, r in zip(values, reference))


@lowers("higher_order.cond")
def cond(pred, true_fn, false_fn, operands):
    operands = tuple(operands)
    if isinstance(pred, (bool, int)):  # decided at export time (a static shape test)
        return (true_fn if pred else false_fn)(*operands)
    return lax.cond(_scalar_bool(pred), lambda *ops: list(true_fn(*ops)), lambda *ops: list(false_fn(*ops)), *operands)


@lowers("higher_order.while_loop")
def while_loop(cond_fn, body_fn, carried_inputs, additional_inputs):
    """`lax.while_loop`: forward only (JAX cannot reverse-differentiate a data-dependent trip count)."""
    carried, extra = tuple(carried_inputs), tuple(additional_inputs)

    def keep_going(carry):
        return _scalar_bool(cond_fn(*carry, *extra)[0])

    def step(carry):
        return _like(body_fn(*carry, *extra), carry)

    return list(lax.while_loop(keep_going, step, tuple(jnp.asarray(c) for c in carried)))


@lowers("higher_order.scan")
def scan(combine_fn, init, xs, additional_inputs):
    """torch's scan over dim 0: combine(*carry, *x_slices, *additional) -> (*next_carry, *ys)."""
    init, xs, extra = tuple(init), tuple(xs), tuple(additional_inputs)
    n_carry = len(init)

    def step(carry, slices):
        out = combine_fn(*carry, *slices, *extra)
        return _like(out[:n_carry], carry), tuple(out[n_carry:])

    carry, ys = lax.scan(step, tuple(jnp.asarray(c) for c in init), xs)
    return [*carry, *ys]


@lowers("higher_order.map_impl")
def map_impl(body_fn, xs, pos_args):
    """torch's map: body applied to every slice along dim 0 of `xs`, results stacked."""
    xs, extra = tuple(xs), tuple(pos_args)
    return list(lax.map(lambda slices: tuple(body_fn(*slices, *extra)), xs))


@lowers("higher_order.with_effects")
def with_effects(token, op, *args, **kwargs):
    """torch threads effectful ops (e.g. linalg's error checks) through a token: run the op, pass the token on."""
    name = op["op"] if isinstance(op, dict) else op
    lowering = lookup(name)
    if lowering is None or lowering.ctx:
        raise LoweringError(f"with_effects around {name}: no context-free lowering for it")
    result = lowering.fn(*args, **kwargs)
    return (token, *result) if isinstance(result, tuple) else (token, result)
