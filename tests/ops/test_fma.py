"""prims.fma (dynamo writes it for addcmul_/addcdiv_ with a value, as torch.optim's steps call them):
a * b + c rounded once, checked bit for bit against the exact rational result rounded to nearest even.

The cases include products that land exactly between two floats with a tiny addend, where rounding
the product first (a * b + c in two steps) and rounding a float64 sum to float32 both go wrong.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import jax
import numpy as np
import pytest

from torch2jax.ir.graph import Node, TensorMeta
from torch2jax.lowering.interpreter import LoweringContext
from torch2jax.ops import lookup


def _fma(dtype: str, a, b, c):
    ctx = LoweringContext(Node("f", "prims.fma.default", [], {}, TensorMeta(dtype, list(np.shape(a)))), {}, None, 0)
    return np.asarray(jax.jit(lambda a, b, c: lookup("prims.fma.default").fn(ctx, a, b, c))(a, b, c))


def _rounded(exact: Fraction, dtype: str):
    """The float of `dtype` nearest to `exact`, ties to even (float() of a Fraction is correctly
    rounded to float64; rounding that to float32 may be off by one, so the neighbours are compared)."""
    kind = np.dtype(dtype).type
    guess = kind(float(exact))
    candidates = [guess, np.nextafter(guess, kind(np.inf)), np.nextafter(guess, kind(-np.inf))]
    bits = np.int32 if dtype == "float32" else np.int64
    return min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(bits)) & 1))


def _cases(dtype: str, n: int = 400):
    rng = np.random.default_rng(0)
    half = 12 if dtype == "float32" else 26  # (1 + k 2**-half)(1 + m 2**-half) has bits just past the precision
    plain = [rng.standard_normal(n) for _ in range(3)]
    ties = [1 + rng.integers(1, 256, n) * 2.0**-half, 1 + rng.integers(1, 256, n) * 2.0**-half,
            rng.choice([-1.0, 0.0, 1.0], n) * 2.0 ** rng.integers(-80, -20, n)]
    small = rng.standard_normal(n) * 1e-3
    other = rng.standard_normal(n)
    cancelling = [small, other, -(small * other)]  # a * b + c near zero: the product's low bits are the result
    return [np.concatenate(parts).astype(dtype) for parts in zip(plain, ties, cancelling)]


@pytest.mark.parametrize("dtype,x64", [("float32", True), ("float32", False), ("float64", True)],
                         ids=["float32", "float32-without-x64", "float64"])
def test_fma_rounds_once(dtype, x64):
    with jax.enable_x64(x64):
        a, b, c = _cases(dtype)
        got = _fma(dtype, a, b, c)
    want = np.array([_rounded(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)), dtype)
                     for x, y, z in zip(a, b, c)])
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    assert (a * b + c != want).sum() > 100, "the cases should tell one rounding from two"


@pytest.mark.parametrize("dtype,x64", [("float32", True), ("float32", False), ("float64", True)],
                         ids=["float32", "float32-without-x64", "float64"])
def test_fma_special_values(dtype, x64):
    """Infinities, NaN, signed zeros, a product beyond the largest float: IEEE's fma results."""
    big = float(np.finfo(dtype).max) / 2
    values = [0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan, big, -big]
    a, b, c = (np.array(v, dtype) for v in zip(*itertools.product(values, repeat=3)))
    with jax.enable_x64(x64):
        got = _fma(dtype, a, b, c)
    with np.errstate(all="ignore"):
        # long double holds these products exactly and rounds each sum once (float64 rounds 2.5 * big + big)
        want = (a.astype(np.longdouble) * b + c).astype(dtype)
    np.testing.assert_array_equal(got, want)
    numbers = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]))


def test_fma_low_precision_and_integers():
    """bfloat16 computes a float32 fma and rounds once more; integers wrap as a * b + c."""
    import ml_dtypes

    with jax.enable_x64(True):
        a, b, c = (np.array([1.5, -3.0, 7.25], ml_dtypes.bfloat16) for _ in range(3))
        got = _fma("bfloat16", a, b, c).astype(ml_dtypes.bfloat16)  # the interpreter casts to the node's dtype
        want = (a.astype(np.float32) * b.astype(np.float32) + c.astype(np.float32)).astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(got, want)
        ints = np.array([2**62, 3, -5], np.int64)
        np.testing.assert_array_equal(_fma("int64", ints, ints, ints), ints * ints + ints)
