"""Special functions: Bessel and Airy functions, orthogonal polynomials, the gamma and zeta family.

torch defines these by the scalar kernels in ATen/native/Math.h (Cephes approximations, with its own
values at poles, negative orders and infinities). Where jax.scipy.special computes the same function
to float32 round-off we call it and add torch's boundary values; elsewhere we evaluate the same
published approximations (the coefficient tables at the end of this file) in the compute dtype, so
results agree with torch's CPU kernels to a few ulps. Integer and bool inputs compute in the default
float dtype and bfloat16 in float32, rounded once, as torch does.
"""

from __future__ import annotations

import functools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .opmath import opmath, to_float
from .registry import lowers


def _operands(ctx, *values):
    """Binary special functions promote like torch's float ops: compute in the result's float dtype."""
    dtype = opmath(ctx.out_dtype)
    return jnp.broadcast_arrays(*[jnp.asarray(v, dtype) for v in values])


def _polevl(z, coeffs):
    """Horner's rule, highest power first, started from 0 as torch's loops are."""
    acc = jnp.zeros_like(z)
    for c in coeffs:
        acc = acc * z + c
    return acc


def _chbevl(t, coeffs):
    """Cephes' Clenshaw sum of a Chebyshev series: 0.5 * (b0 - b2)."""
    p = q = jnp.zeros_like(t)
    a = jnp.full_like(t, coeffs[0])
    for c in coeffs[1:]:
        p, q = q, a
        a = t * q - p + c
    return 0.5 * (a - p)


# --- error function, normal distribution, modified Bessel functions of the first kind ----------


def _unary(op, fn):
    lowers(op)(lambda x: fn(to_float(x)))


for _op, _fn in {
    "aten.special_ndtri.default": jax.scipy.special.ndtri,
    "aten.special_i0e.default": jax.scipy.special.i0e,
    "aten.special_i1.default": jax.scipy.special.i1,
    "aten.special_i1e.default": jax.scipy.special.i1e,
    "aten.special_modified_bessel_i0.default": jax.scipy.special.i0,
    "aten.special_modified_bessel_i1.default": jax.scipy.special.i1,
}.items():
    _unary(_op, _fn)


@lowers("aten.special_erfcx.default")
def erfcx(x):
    """exp(x^2) erfc(x). Not jax's erfcx: in float32 it returns 0 for x in about [9.19, 9.42].

    x >= 2: the continued fraction 1/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), 30 terms;
    0 <= x < 2: exp(x^2) erfc(x); x < 0: torch's 2 exp(x^2) - erfcx(-x), inf below -26.7.
    """
    x = to_float(x)
    ax = jnp.abs(x)
    big = jnp.maximum(ax, 2)
    f = big
    for k in range(30, 0, -1):
        f = big + (k / 2) / f
    positive = jnp.where(ax < 2, jnp.exp(ax * ax) * jax.scipy.special.erfc(ax), 0.56418958354775628694807945156 / f)
    twice = 2 * jnp.exp(x * x)
    negative = jnp.where(x < -26.7, jnp.inf, jnp.where(x < -6.1, twice, twice - positive))
    return jnp.where(x < 0, negative, positive)


@lowers("aten.special_spherical_bessel_j0.default")
def spherical_bessel_j0(x):
    """sin(x)/x, by its Taylor polynomial for |x| < 0.5 and 0 at +-inf (torch's cases)."""
    x = to_float(x)
    x2 = x * x
    series = 1 + x2 * _polevl(x2, (1 / 6227020800, -1 / 39916800, 1 / 362880, -1 / 5040, 1 / 120, -1 / 6))
    out = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(x) / x)
    return jnp.where(jnp.isinf(x), jnp.zeros_like(x), out)


# --- Bessel functions of the first and second kind (Cephes j0, j1, y0, y1) ---------------------

_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163
_SQRT_2_PI = 0.797884560802865355879892119868763737  # sqrt(2 / pi)
_2_PI = 0.636619772367581343075535053490057448  # 2 / pi


def _hankel(x, z, tables, shift, second_kind):
    """The large-x form (x > 5): sqrt(2/(pi x)) (P cos(x - shift) - 5/x Q sin(x - shift)), sin/cos swapped for Y."""
    pp, pq, qp, qq = tables
    p = _polevl(z, pp) / _polevl(z, pq)
    q = 5 / x * (_polevl(z, qp) / _polevl(z, qq))
    if second_kind:
        return (p * jnp.sin(x - shift) + q * jnp.cos(x - shift)) * _SQRT_2_PI / jnp.sqrt(x)
    return (p * jnp.cos(x - shift) - q * jnp.sin(x - shift)) * _SQRT_2_PI / jnp.sqrt(x)


def _j0(x):
    x = jnp.abs(x)
    x2 = x * x
    small = (x2 - 5.78318596294678452118) * (x2 - 30.4712623436620863991) * _polevl(x2, _J0_RP) / _polevl(x2, _J0_RQ)
    small = jnp.where(x < 1e-5, 1 - x2 / 4, small)
    big = _hankel(x, 25 / x2, (_J0_PP, _J0_PQ, _J0_QP, _J0_QQ), _PI_4, False)
    return jnp.where(x <= 5, small, big)


def _j1(x):
    sign = jnp.where(x < 0, -1.0, 1.0).astype(x.dtype)
    x = jnp.abs(x)
    x2 = x * x
    small = _polevl(x2, _J1_RP) / _polevl(x2, _J1_RQ) * x * (x2 - 14.6819706421238932572) * (x2 - 49.2184563216946036703)
    big = _hankel(x, 5 / x * (5 / x), (_J1_PP, _J1_PQ, _J1_QP, _J1_QQ), _3PI_4, False)
    return sign * jnp.where(x <= 5, small, big)


@lowers("aten.special_bessel_j0.default")
def bessel_j0(x):
    return _j0(to_float(x))


@lowers("aten.special_bessel_j1.default")
def bessel_j1(x):
    return _j1(to_float(x))


@lowers("aten.special_bessel_y0.default")
def bessel_y0(x):
    """-inf at 0 and nan for x < 0, as torch."""
    x = to_float(x)
    x2 = x * x
    small = _polevl(x2, _Y0_YP) / _polevl(x2, _Y0_YQ) + _2_PI * jnp.log(x) * _j0(x)
    small = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, small))
    big = _hankel(x, 25 / x2, (_J0_PP, _J0_PQ, _J0_QP, _J0_QQ), _PI_4, True)
    return jnp.where(x <= 5, small, big)


@lowers("aten.special_bessel_y1.default")
def bessel_y1(x):
    """-inf at 0 and nan for x < 0, as torch."""
    x = to_float(x)
    x2 = x * x
    small = x * (_polevl(x2, _Y1_YP) / _polevl(x2, _Y1_YQ)) + _2_PI * (_j1(x) * jnp.log(x) - 1 / x)
    small = jnp.where(x == 0, -jnp.inf, jnp.where(x < 0, jnp.nan, small))
    big = _hankel(x, 5 / x * (5 / x), (_J1_PP, _J1_PQ, _J1_QP, _J1_QQ), _3PI_4, True)
    return jnp.where(x <= 5, small, big)


# --- modified Bessel functions of the second kind (Cephes k0, k1) ------------------------------


def _k(x, order, scaled):
    """K0 or K1 (times e^x if scaled): a log term plus a Chebyshev series up to 2, a series in 8/x above."""
    a_table, b_table = (_K0_A, _K0_B) if order == 0 else (_K1_A, _K1_B)
    small = _chbevl(x * x - 2, a_table)
    if order == 0:
        small = small - jnp.log(0.5 * x) * jax.scipy.special.i0(x)
    else:
        small = jnp.log(0.5 * x) * jax.scipy.special.i1(x) + small / x
    big = _chbevl(8 / x - 2, b_table) / jnp.sqrt(x)
    out = jnp.where(x <= 2, small * jnp.exp(x), big) if scaled else jnp.where(x <= 2, small, jnp.exp(-x) * big)
    return jnp.where(x == 0, jnp.inf, jnp.where(x < 0, jnp.nan, out))


@lowers("aten.special_modified_bessel_k0.default")
def modified_bessel_k0(x):
    return _k(to_float(x), 0, scaled=False)


@lowers("aten.special_modified_bessel_k1.default")
def modified_bessel_k1(x):
    return _k(to_float(x), 1, scaled=False)


@lowers("aten.special_scaled_modified_bessel_k0.default")
def scaled_modified_bessel_k0(x):
    return _k(to_float(x), 0, scaled=True)


@lowers("aten.special_scaled_modified_bessel_k1.default")
def scaled_modified_bessel_k1(x):
    return _k(to_float(x), 1, scaled=True)


# --- Airy function Ai (Cephes airy) ------------------------------------------------------------


def _airy_series(x):
    """Ai's Maclaurin series f, g, summed per element until the term is under the dtype's eps, as torch."""
    eps = jnp.finfo(x.dtype).eps
    z = x * x * x
    one = jnp.ones_like(x)

    def cond(state):
        return jnp.any(state[-1] > eps)

    def body(state):
        f, g, k, m, n, t = state
        live = t > eps
        m = m * z
        k = k + 1
        m = m / k
        n = n * z
        k = k + 1
        n = n / k
        m = m / k
        f_new = f + m
        k = k + 1
        n = n / k
        g_new = g + n
        t_new = jnp.abs(m / f_new)
        return tuple(jnp.where(live, new, old) for new, old in zip((f_new, g_new, k, m, n, t_new), state))

    start = (one, x, one, one, x, jnp.where((x >= -2.09) & (x < 2.09), one, jnp.zeros_like(x)))
    f, g = lax.while_loop(cond, body, start)[:2]
    return 0.355028053887817239260 * f - 0.258819403792806798405 * g


@lowers("aten.special_airy_ai.default")
def airy_ai(x):
    """Asymptotic forms beyond |x| >= 2.09, the series inside; nan at +-inf and 0 beyond 103.892, as torch."""
    x = to_float(x)
    root = jnp.sqrt(jnp.abs(x))
    zeta = 2 * jnp.abs(x) * root / 3
    # x < -2.09: oscillating asymptotic form
    z = 1 / (-2 * x * root / 3)
    zz = z * z
    t = -2 * x * root / 3 + 0.25 * np.pi
    f = 1 + zz * _polevl(zz, _AIRY_AFN) / _polevl(zz, _AIRY_AFD)
    g = z * _polevl(zz, _AIRY_AGN) / _polevl(zz, _AIRY_AGD)
    negative = 5.64189583547756286948e-01 / jnp.sqrt(root) * (jnp.sin(t) * f - jnp.cos(t) * g)
    # x >= 2.09: decaying asymptotic form
    ratio = _polevl(1 / zeta, _AIRY_AN) / _polevl(1 / zeta, _AIRY_AD)
    positive = 5.64189583547756286948e-01 * ratio / (2 * jnp.sqrt(root) * jnp.exp(zeta))
    out = jnp.where(x < -2.09, negative, jnp.where(x >= 2.09, positive, _airy_series(x)))
    out = jnp.where(x > 103.892, jnp.zeros_like(x), out)
    return jnp.where(jnp.isinf(x), jnp.nan, out)


# --- orthogonal polynomials of a per-element integer degree n ----------------------------------


def _degree(n):
    """torch truncates a float degree to int64; nan, inf and out-of-range values become negative (-> 0)."""
    return jnp.where(jnp.isfinite(n) & (jnp.abs(n) < 2.0**63), jnp.trunc(n), -1)


def _recurrence(n, q1, step):
    """q_n of a three-term recurrence from p = q_0 = 1, q = q_1: `step(i, p, q)` gives q_{i+1}.

    torch runs the loop per element up to its own n (stopping once q is nan); one while_loop runs
    to the largest n, each element keeping its value once its own n is reached. The counter is an
    integer so that degrees beyond 2**24 still end.
    """
    n = jnp.clip(n, -1, 2**31 - 2).astype(jnp.int32)

    def cond(state):
        i, _, q = state
        return jnp.any((i < n) & ~jnp.isnan(q))

    def body(state):
        i, p, q = state
        live = (i < n) & ~jnp.isnan(q)
        r = step(i.astype(q1.dtype), p, q)
        return i + 1, jnp.where(live, q, p), jnp.where(live, r, q)

    return lax.while_loop(cond, body, (jnp.ones((), jnp.int32), jnp.ones_like(q1), q1))[2]


def _polynomial(n, q1, step, cases):
    """torch's evaluation order: 0 for n < 0, then the first matching (condition, value) in `cases`,
    then 1 for n == 0, q1 for n == 1, else the recurrence (run only where nothing else applies)."""
    special = functools.reduce(operator.or_, [cond for cond, _ in cases], n < 2)
    out = _recurrence(jnp.where(special, 0, n), q1, step)
    out = jnp.where(n == 1, q1, jnp.where(n == 0, 1, out))
    for cond, value in reversed(cases):
        out = jnp.where(cond, value, out)
    return jnp.where(n < 0, 0, out).astype(q1.dtype)


def _parity(n, even, odd):
    return jnp.where(jnp.fmod(n, 2) == 0, even, odd)


def _chebyshev(kind, y, n, at_one, at_minus_one, trig_from, degenerate):
    """T, U, V, W at y (x for the plain polynomials, 2x - 1 for the shifted ones).

    `at_one` / `at_minus_one` are torch's values where y = +-1; above degree `trig_from`, |y| < 1
    uses torch's closed trigonometric forms, and `degenerate` where V's or W's denominator is 0.
    """
    theta = jnp.arccos(y)
    if kind == "t":
        trig, q1 = jnp.cos(n * theta), y
    elif kind == "u":
        s = jnp.sin(theta)
        trig = jnp.where(s != 0, jnp.sin((n + 1) * theta) / s, (n + 1) * jnp.cos((n + 1) * theta) / y)
        q1 = y + y
    elif kind == "v":
        trig = jnp.where(jnp.sin(theta / 2) != 1, jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2), degenerate)
        q1 = y + y - 1
    else:
        trig = jnp.where(jnp.cos(theta / 2) != 1, jnp.sin((n + 0.5) * theta) / jnp.sin(theta / 2), degenerate)
        q1 = y + y + 1
    two_y = y + y
    cases = [
        (y == 1, at_one),
        (y == -1, at_minus_one),
        ((n > trig_from) & (jnp.abs(y) < 1), trig),
    ]
    return _polynomial(n, q1, lambda i, p, q: two_y * q - p, cases)


_CHEBYSHEV_AT_ENDS = {  # (value at y = 1, value at y = -1) as functions of n, from torch's kernels
    "t": (lambda n: 1, lambda n: _parity(n, 1, -1)),
    "u": (lambda n: n + 1, lambda n: _parity(n, n + 1, -(n + 1))),
    "v": (lambda n: 1, lambda n: _parity(n, n + n + 1, -(n + n + 1))),
    "w": (lambda n: n + n + 1, lambda n: _parity(n, 1, -1)),
}


def _register_chebyshev(kind):
    at_one, at_minus_one = _CHEBYSHEV_AT_ENDS[kind]
    plain_from = 6 if kind == "t" else 8
    shifted_from = 4 if kind == "w" else 6

    @lowers(f"aten.special_chebyshev_polynomial_{kind}.default", ctx=True)
    def chebyshev(ctx, x, n):
        x, n = _operands(ctx, x, n)
        n = _degree(n)
        degenerate = jnp.where(x > 0, at_one(n), at_minus_one(n)) if kind == "w" else at_minus_one(n)
        return _chebyshev(kind, x, n, at_one(n), at_minus_one(n), plain_from, degenerate)

    @lowers(f"aten.special_shifted_chebyshev_polynomial_{kind}.default", ctx=True)
    def shifted_chebyshev(ctx, x, n):
        """torch tests x == 1 and x == 0 exactly (not 2x - 1 == +-1), then works with y = 2x - 1."""
        x, n = _operands(ctx, x, n)
        n = _degree(n)
        out = _chebyshev(kind, x + x - 1, n, at_one(n), at_minus_one(n), shifted_from, at_minus_one(n))
        out = jnp.where(x == 1, at_one(n), jnp.where(x == 0, at_minus_one(n), out))
        return jnp.where(n < 0, 0, out).astype(x.dtype)


for _kind in "tuvw":
    _register_chebyshev(_kind)


def _hermite_limit(dtype):
    """torch returns nan above degree 128 in float32 (512 in float64) rather than overflow."""
    return 128 if np.dtype(dtype).itemsize <= 4 else 512


@lowers("aten.special_hermite_polynomial_h.default", ctx=True)
def hermite_polynomial_h(ctx, x, n):
    """Physicists' Hermite: H_{k+1} = 2x H_k - 2k H_{k-1}."""
    x, n = _operands(ctx, x, n)
    n = _degree(n)
    return _polynomial(n, x + x, lambda i, p, q: (x + x) * q - (i + i) * p, [(n > _hermite_limit(x.dtype), jnp.nan)])


@lowers("aten.special_hermite_polynomial_he.default", ctx=True)
def hermite_polynomial_he(ctx, x, n):
    """Probabilists' Hermite: He_{k+1} = x He_k - k He_{k-1}."""
    x, n = _operands(ctx, x, n)
    n = _degree(n)
    return _polynomial(n, x, lambda i, p, q: x * q - i * p, [(n > _hermite_limit(x.dtype), jnp.nan)])


@lowers("aten.special_laguerre_polynomial_l.default", ctx=True)
def laguerre_polynomial_l(ctx, x, n):
    """L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1); 1 at x == 0, as torch."""
    x, n = _operands(ctx, x, n)
    n = _degree(n)
    return _polynomial(n, 1 - x, lambda i, p, q: (((i + i) + (1 - x)) * q - i * p) / (i + 1), [(x == 0, 1)])


@lowers("aten.special_legendre_polynomial_p.default", ctx=True)
def legendre_polynomial_p(ctx, x, n):
    """P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1); +-1 at x == +-1, as torch."""
    x, n = _operands(ctx, x, n)
    n = _degree(n)
    at_ends = jnp.where((x > 0) | (jnp.fmod(n, 2) == 0), 1, -1)
    return _polynomial(n, x, lambda i, p, q: ((i + i + 1) * x * q - i * p) / (i + 1), [(jnp.abs(x) == 1, at_ends)])


# --- gamma family: digamma, trigamma, polygamma, Hurwitz zeta, incomplete gamma ----------------


def digamma(x):
    """jax's digamma with torch's values at +-0 (-+inf, the limit from the side of the zero's sign)."""
    out = jax.scipy.special.digamma(x)
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), out)


@lowers("aten.digamma.default")
def digamma_lowering(x):
    return digamma(to_float(x))


def _trigamma(x):
    """torch's trigamma: reflection below 0.5, six recurrence steps, then the asymptotic series."""
    negative = x < 0.5
    sin_pi_x = jnp.sin(np.pi * x)
    reflected = -(np.pi * np.pi) / (sin_pi_x * sin_pi_x)
    x = jnp.where(negative, 1 - x, x)
    result = jnp.where(negative, reflected, jnp.zeros_like(x))
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1 / 6 - ixx * (1 / 30 - ixx * (1 / 42)))) / x
    return jnp.where(negative, -result, result)


_MACHEP = 1.11022302462515654042e-16
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
           -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15,
           1.8152105401943546773e17, -7.1661652561756670113e18)


def _zeta(x, q):
    """torch's Hurwitz zeta: the direct sum of (q + k)^-x until q + k > 9 (at least 9 terms), then
    Euler-Maclaurin; inf at x == 1 and at non-positive integer q, nan for x < 1 or for q < 0 with
    a non-integer x. Negative non-integer q with integer x sums directly, as torch (jax's zeta does not)."""
    pole = (q <= 0) & (q == jnp.floor(q))
    undefined = (x <= 1) | pole | ((q <= 0) & (x != jnp.floor(x)))  # torch returns before summing
    s = jnp.power(q, -x)

    def cond(state):
        return jnp.any(state[-1])

    def body(state):
        i, a, b, s, live = state
        a_new = a + 1
        b_new = jnp.power(a_new, -x)
        s_new = s + b_new
        converged = (-_MACHEP * s_new < b_new) & (b_new < _MACHEP * s_new)
        i = jnp.where(live, i + 1, i)
        a, b, s = (jnp.where(live, new, old) for new, old in ((a_new, a), (b_new, b), (s_new, s)))
        return i, a, b, s, live & ~converged & ((i < 9) | (a <= 9))

    zeros = jnp.zeros_like(q)
    _, a, b, s, _ = lax.while_loop(cond, body, (zeros, q, zeros, s, ~undefined))
    done = (-_MACHEP * s < b) & (b < _MACHEP * s)
    w = a
    s = jnp.where(done, s, s + b * w / (x - 1) - 0.5 * b)
    a = jnp.ones_like(q)
    k = jnp.zeros_like(q)
    for coeff in _ZETA_A:
        a = a * (x + k)
        b = b / w
        t = a * b / coeff
        s = jnp.where(done, s, s + t)
        done = done | (jnp.abs(t / s) < _MACHEP)
        k = k + 1
        a = a * (x + k)
        b = b / w
        k = k + 1
    s = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, s)
    s = jnp.where(pole, jnp.inf, s)
    s = jnp.where(x < 1, jnp.nan, s)
    return jnp.where(x == 1, jnp.inf, s)


@lowers("aten.special_zeta.default", "aten.special_zeta.self_scalar", "aten.special_zeta.other_scalar", ctx=True)
def zeta(ctx, x, q):
    return _zeta(*_operands(ctx, x, q))


@lowers("aten.polygamma.default")
def polygamma(n, x):
    """digamma for n = 0, torch's trigamma for n = 1, else (-1)^(n+1) n! zeta(n + 1, x)."""
    x = to_float(x)
    if n == 0:
        return digamma(x)
    if n == 1:
        return _trigamma(x)
    factorial = jnp.exp(jax.scipy.special.gammaln(jnp.asarray(n + 1, x.dtype)))
    return (1 if n % 2 else -1) * factorial * _zeta(jnp.full_like(x, n + 1), x)


def _incomplete_gamma_edges(a, x, value, at_a_zero, at_x_zero, at_x_inf):
    """torch's boundary values (SciPy's): nan outside a, x >= 0 and at (inf, inf), fixed values on the edges."""
    out = jnp.where(jnp.isinf(x), at_x_inf, value)
    out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), jnp.nan, 1 - at_x_inf), out)
    out = jnp.where(x == 0, at_x_zero, out)
    out = jnp.where(a == 0, jnp.where(x > 0, at_a_zero, jnp.nan), out)
    return jnp.where((x < 0) | (a < 0), jnp.nan, out)


@lowers("aten.igamma.default", ctx=True)
def igamma(ctx, a, x):
    """The regularized lower incomplete gamma P(a, x)."""
    a, x = _operands(ctx, a, x)
    return _incomplete_gamma_edges(a, x, jax.scipy.special.gammainc(a, x), 1, 0, 1)


@lowers("aten.igammac.default", ctx=True)
def igammac(ctx, a, x):
    """The regularized upper incomplete gamma Q(a, x)."""
    a, x = _operands(ctx, a, x)
    return _incomplete_gamma_edges(a, x, jax.scipy.special.gammaincc(a, x), 0, 1, 0)


# --- coefficient tables (Cephes, as in torch's ATen/native/Math.h), highest power first ---------

_AIRY_AN = (
    3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01, 1.68089224934630576269e+02,
    1.59756391350164413639e+02, 7.05360906840444183113e+01, 1.40264691163389668864e+01, 9.99999999999999995305e-01,
)
_AIRY_AD = (
    5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01, 1.77318088145400459522e+02,
    1.64234692871529701831e+02, 7.14778400825575695274e+01, 1.40959135607834029598e+01, 1.00000000000000000470e+00,
)
_AIRY_AFN = (
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01, -2.79779981545119124951e-01,
    -4.91900132609500318020e-02, -4.06265923594885404393e-03, -1.59276496239262096340e-04, -2.77649108155232920844e-06,
    -1.67787698489114633780e-08,
)
_AIRY_AFD = (
    1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01, 9.18707402907259625840e+00,
    1.47529146771666414581e+00, 1.15687173795188044134e-01, 4.40291641615211203805e-03, 7.54720348287414296618e-05,
    4.51850092970580378464e-07,
)
_AIRY_AGN = (
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00, 9.39169229816650230044e-01,
    3.51465656105547619242e-01, 6.33888919628925490927e-02, 5.85804113048388458567e-03, 2.82851600836737019778e-04,
    6.98793669997260967291e-06, 8.11789239554389293311e-08, 3.41551784765923618484e-10,
)
_AIRY_AGD = (
    9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01, 5.47686069422975497931e+00,
    9.54293611618961883998e-01, 8.64580826352392193095e-02, 4.12656523824222607191e-03, 1.01259085116509135510e-04,
    1.17166733214413521882e-06, 4.91834570062930015649e-09,
)
_J0_PP = (
    7.96936729297347051624e-04, 8.28352392107440799803e-02, 1.23953371646414299388e+00, 5.44725003058768775090e+00,
    8.74716500199817011941e+00, 5.30324038235394892183e+00, 9.99999999999999997821e-01,
)
_J0_PQ = (
    9.24408810558863637013e-04, 8.56288474354474431428e-02, 1.25352743901058953537e+00, 5.47097740330417105182e+00,
    8.76190883237069594232e+00, 5.30605288235394617618e+00, 1.00000000000000000218e+00,
)
_J0_QP = (
    -1.13663838898469149931e-02, -1.28252718670509318512e+00, -1.95539544257735972385e+01, -9.32060152123768231369e+01,
    -1.77681167980488050595e+02, -1.47077505154951170175e+02, -5.14105326766599330220e+01, -6.05014350600728481186e+00,
)
_J0_QQ = (
    6.43178256118178023184e+01, 8.56430025976980587198e+02, 3.88240183605401609683e+03, 7.24046774195652478189e+03,
    5.93072701187316984827e+03, 2.06209331660327847417e+03, 2.42005740240291393179e+02,
)
_J0_RP = (
    -4.79443220978201773821e+09, 1.95617491946556577543e+12, -2.49248344360967716204e+14, 9.70862251047306323952e+15,
)
_J0_RQ = (
    4.99563147152651017219e+02, 1.73785401676374683123e+05, 4.84409658339962045305e+07, 1.11855537045356834862e+10,
    2.11277520115489217587e+12, 3.10518229857422583814e+14, 3.18121955943204943306e+16, 1.71086294081043136091e+18,
)
_J1_PP = (
    7.62125616208173112003e-04, 7.31397056940917570436e-02, 1.12719608129684925192e+00, 5.11207951146807644818e+00,
    8.42404590141772420927e+00, 5.21451598682361504063e+00, 1.00000000000000000254e+00,
)
_J1_PQ = (
    5.71323128072548699714e-04, 6.88455908754495404082e-02, 1.10514232634061696926e+00, 5.07386386128601488557e+00,
    8.39985554327604159757e+00, 5.20982848682361821619e+00, 9.99999999999999997461e-01,
)
_J1_QP = (
    5.10862594750176621635e-02, 4.98213872951233449420e+00, 7.58238284132545283818e+01, 3.66779609360150777800e+02,
    7.10856304998926107277e+02, 5.97489612400613639965e+02, 2.11688757100572135698e+02, 2.52070205858023719784e+01,
)
_J1_QQ = (
    7.42373277035675149943e+01, 1.05644886038262816351e+03, 4.98641058337653607651e+03, 9.56231892404756170795e+03,
    7.99704160447350683650e+03, 2.82619278517639096600e+03, 3.36093607810698293419e+02,
)
_J1_RP = (
    -8.99971225705559398224e+08, 4.52228297998194034323e+11, -7.27494245221818276015e+13, 3.68295732863852883286e+15,
)
_J1_RQ = (
    6.20836478118054335476e+02, 2.56987256757748830383e+05, 8.35146791431949253037e+07, 2.21511595479792499675e+10,
    4.74914122079991414898e+12, 7.84369607876235854894e+14, 8.95222336184627338078e+16, 5.32278620332680085395e+18,
)
_Y0_YP = (
    1.55924367855235737965e+04, -1.46639295903971606143e+07, 5.43526477051876500413e+09, -9.82136065717911466409e+11,
    8.75906394395366999549e+13, -3.46628303384729719441e+15, 4.42733268572569800351e+16, -1.84950800436986690637e+16,
)
_Y0_YQ = (
    1.04128353664259848412e+03, 6.26107330137134956842e+05, 2.68919633393814121987e+08, 8.64002487103935000337e+10,
    2.02979612750105546709e+13, 3.17157752842975028269e+15, 2.50596256172653059228e+17,
)
_Y1_YP = (
    1.26320474790178026440e+09, -6.47355876379160291031e+11, 1.14509511541823727583e+14, -8.12770255501325109621e+15,
    2.02439475713594898196e+17, -7.78877196265950026825e+17,
)
_Y1_YQ = (
    5.94301592346128195359e+02, 2.35564092943068577943e+05, 7.34811944459721705660e+07, 1.87601316108706159478e+10,
    3.88231277496238566008e+12, 6.20557727146953693363e+14, 6.87141087355300489866e+16, 3.97270608116560655612e+18,
)
_K0_A = (
    1.37446543561352307156e-16, 4.25981614279661018399e-14, 1.03496952576338420167e-11, 1.90451637722020886025e-09,
    2.53479107902614945675e-07, 2.28621210311945178607e-05, 1.26461541144692592338e-03, 3.59799365153615016266e-02,
    3.44289899924628486886e-01, -5.35327393233902768720e-01,
)
_K0_B = (
    5.30043377268626276149e-18, -1.64758043015242134646e-17, 5.21039150503902756861e-17, -1.67823109680541210385e-16,
    5.51205597852431940784e-16, -1.84859337734377901440e-15, 6.34007647740507060557e-15, -2.22751332699166985548e-14,
    8.03289077536357521100e-14, -2.98009692317273043925e-13, 1.14034058820847496303e-12, -4.51459788337394416547e-12,
    1.85594911495471785253e-11, -7.95748924447710747776e-11, 3.57739728140030116597e-10, -1.69753450938905987466e-09,
    8.57403401741422608519e-09, -4.66048989768794782956e-08, 2.76681363944501510342e-07, -1.83175552271911948767e-06,
    1.39498137188764993662e-05, -1.28495495816278026384e-04, 1.56988388573005337491e-03, -3.14481013119645005427e-02,
    2.44030308206595545468e+00,
)
_K1_A = (
    -7.02386347938628759343e-18, -2.42744985051936593393e-15, -6.66690169419932900609e-13, -1.41148839263352776110e-10,
    -2.21338763073472585583e-08, -2.43340614156596823496e-06, -1.73028895751305206302e-04, -6.97572385963986435018e-03,
    -1.22611180822657148235e-01, -3.53155960776544875667e-01, 1.52530022733894777053e+00,
)
_K1_B = (
    -5.75674448366501715755e-18, 1.79405087314755922667e-17, -5.68946255844285935196e-17, 1.83809354436663880070e-16,
    -6.05704724837331885336e-16, 2.03870316562433424052e-15, -7.01983709041831346144e-15, 2.47715442448130437068e-14,
    -8.97670518232499435011e-14, 3.34841966607842919884e-13, -1.28917396095102890680e-12, 5.13963967348173025100e-12,
    -2.12996783842756842877e-11, 9.21831518760500529508e-11, -4.19035475934189648750e-10, 2.01504975519703286596e-09,
    -1.03457624656780970260e-08, 5.74108412545004946722e-08, -3.50196060308781257119e-07, 2.40648494783721712015e-06,
    -1.93619797416608296024e-05, 1.95215518471351631108e-04, -2.85781685962277938680e-03, 1.03923736576817238437e-01,
    2.72062619048444266945e+00,
)
