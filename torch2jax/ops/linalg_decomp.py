"""Matrix decompositions, solves, inverses and determinants (torch.linalg and its legacy names).

Torch's conventions, kept exactly: LU pivots are 1-based int32 (LAPACK's getrf), `info` outputs are
int32 zeros, eigenvalues of `eigh` ascend, `compute_uv=False` / `compute_v=False` / `mode="r"`
give empty tensors where torch does. On CPU, JAX calls the same LAPACK routines torch does (getrf,
geqrf/orgqr, gesdd, syevd, geev, potrf, trsm), so factors agree with torch's, signs included.

What a graph of values cannot do: raise on bad data. The `*_ex` ops report `info == 0` always (but
`linalg_ldl_factor_ex`, which runs LAPACK's own ?sytf2 steps in lax loops and so knows it), and
`aten._linalg_check_errors` is a no-op; a singular or non-positive-definite input gives inf/NaN
results (as JAX does) instead of torch's error. `linalg_eig` has no TPU lowering in JAX (CPU uses
LAPACK geev as torch does; CUDA/ROCm have their own solver, whose eigenvector phases may differ).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.lax import linalg as lax_linalg

from .registry import lowers


def _mH(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _info(batch_shape):
    """torch's LAPACK `info`: one int32 per matrix, 0 for success (errors are not detectable here)."""
    return jnp.zeros(batch_shape, jnp.int32)


def _empty_like_meta(ctx, index, dtype):
    """The empty tensor torch returns for an output it did not compute (e.g. U, Vh with compute_uv=False)."""
    return jnp.zeros(ctx.shape_of(ctx.out_meta[index]), dtype)


def _broadcast_batch(a, b):
    """Broadcast the batch dims (all but the last two) of two matrix stacks against each other."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


# --- effects and error checks ------------------------------------------------------------------


@lowers("aten._linalg_check_errors.default")
def linalg_check_errors(info, api_name, is_matrix):
    """torch raises here when `info` is nonzero; JAX cannot raise on data, and our `info` is always 0."""
    return None


# --- SVD, QR, eigendecompositions --------------------------------------------------------------


@lowers("aten._linalg_svd.default", ctx=True)
def linalg_svd(ctx, a, full_matrices=False, compute_uv=True, driver=None):
    """gesdd, as torch's CPU default; without compute_uv, U and Vh are the empty tensors torch gives."""
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return _empty_like_meta(ctx, 0, a.dtype), s, _empty_like_meta(ctx, 2, a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@lowers("aten.linalg_qr.default", ctx=True)
def linalg_qr(ctx, a, mode="reduced"):
    if mode == "r":
        return _empty_like_meta(ctx, 0, a.dtype), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode="complete" if mode == "complete" else "reduced")
    return q, r


@lowers("aten.geqrf.default")
def geqrf(a):
    """LAPACK's packed QR: R on and above the diagonal, Householder vectors below, and their taus."""
    h, tau = jnp.linalg.qr(a, mode="raw")  # numpy's raw mode returns the Fortran-order (transposed) array
    return jnp.swapaxes(h, -1, -2), tau


@lowers("aten.linalg_householder_product.default")
def linalg_householder_product(a, tau):
    """orgqr/ungqr: the first n columns of H_1 ... H_k."""
    a, tau = _broadcast_reflectors(a, tau)
    return lax_linalg.householder_product(a, tau)


@lowers("aten.ormqr.default")
def ormqr(a, tau, c, left=True, transpose=False):
    """Q (from geqrf's reflectors) times c, or c times Q; `transpose` is the conjugate transpose."""
    mn = a.shape[-2]
    k = min(mn, a.shape[-1], tau.shape[-1])
    a, tau = a[..., :, :k], tau[..., :k]
    batch = jnp.broadcast_shapes(a.shape[:-2], tau.shape[:-1], c.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    tau = jnp.broadcast_to(tau, batch + tau.shape[-1:])
    c = jnp.broadcast_to(c, batch + c.shape[-2:])
    return lax_linalg.ormqr(a, tau, c, left=left, transpose=transpose)


def _broadcast_reflectors(a, tau):
    batch = jnp.broadcast_shapes(a.shape[:-2], tau.shape[:-1])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(tau, batch + tau.shape[-1:])


@lowers("aten._linalg_eigh.default", ctx=True)
def linalg_eigh(ctx, a, UPLO="L", compute_v=True):
    """syevd on the `UPLO` triangle only (the other is never read); eigenvalues ascending."""
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    if not compute_v:
        return w, _empty_like_meta(ctx, 1, a.dtype)
    return w, v


@lowers("aten.linalg_eig.default")
def linalg_eig(a):
    """geev: unordered eigenvalues, unit-norm eigenvectors, complex outputs. No TPU lowering in JAX."""
    w, v = jnp.linalg.eig(a)
    return w, v


# --- Cholesky ----------------------------------------------------------------------------------


def _cholesky(a, upper):
    """potrf reading one triangle: the lower one, or (upper=True) the upper one, returning U = L^H."""
    if upper:
        return _mH(lax_linalg.cholesky(_mH(a), symmetrize_input=False))
    return lax_linalg.cholesky(a, symmetrize_input=False)


@lowers("aten.linalg_cholesky_ex.default")
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    """info is always 0: a non-positive-definite input gives NaNs instead of torch's partial factor."""
    return _cholesky(a, upper), _info(a.shape[:-2])


@lowers("aten.cholesky.default")
def cholesky(a, upper=False):
    return _cholesky(a, upper)


def _cho_solve(factor, b, upper):
    """Solve (L L^H) x = b, or (U^H U) x = b, by two triangular solves."""
    factor, b = _broadcast_batch(factor, b)
    lower = not upper
    y = lax_linalg.triangular_solve(factor, b, left_side=True, lower=lower, transpose_a=upper, conjugate_a=upper)
    return lax_linalg.triangular_solve(
        factor, y, left_side=True, lower=lower, transpose_a=lower, conjugate_a=lower
    )


@lowers("aten.cholesky_solve.default")
def cholesky_solve(b, factor, upper=False):
    return _cho_solve(factor, b, upper)


@lowers("aten.cholesky_inverse.default")
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cho_solve(factor, eye, upper)


# --- LU: factor, unpack, solve, determinants ----------------------------------------------------


def _lu(a):
    """getrf with partial pivoting: packed LU, torch's 1-based int32 pivots, and the permutation."""
    lu, pivots, perm = lax_linalg.lu(a)
    return lu, pivots.astype(jnp.int32) + 1, perm


def _permutation_from_pivots(pivots, m):
    """1-based LAPACK row swaps -> perm with (P^T A)[i] = A[perm[i]]."""
    return lax_linalg.lu_pivots_to_permutation(pivots - 1, m)


def _unpack_lu(lu):
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    return lower, upper


def _perm_matrix(perm, m, dtype):
    """P with A = P L U: P[perm[i], i] = 1."""
    return jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=dtype), -1, -2)


@lowers("aten.linalg_lu_factor_ex.default")
def linalg_lu_factor_ex(a, pivot=True, check_errors=False):
    """info is always 0 (a singular U is not reported); pivot=False has no CPU kernel in torch either."""
    if not pivot:
        raise NotImplementedError("LU without pivoting (torch has no CPU kernel for it)")
    lu, pivots, _ = _lu(a)
    return lu, pivots, _info(a.shape[:-2])


@lowers("aten.linalg_lu.default")
def linalg_lu(a, pivot=True):
    if not pivot:
        raise NotImplementedError("LU without pivoting (torch has no CPU kernel for it)")
    lu, _, perm = _lu(a)
    lower, upper = _unpack_lu(lu)
    return _perm_matrix(perm, a.shape[-2], a.dtype), lower, upper


@lowers("aten.lu_unpack.default", ctx=True)
def lu_unpack(ctx, lu, pivots, unpack_data=True, unpack_pivots=True):
    """torch's pivots as given (1-based); outputs not asked for are the empty tensors torch returns."""
    m = lu.shape[-2]
    if unpack_data:
        lower, upper = _unpack_lu(lu)
    else:
        lower, upper = _empty_like_meta(ctx, 1, lu.dtype), _empty_like_meta(ctx, 2, lu.dtype)
    if unpack_pivots:
        perm = _permutation_from_pivots(pivots.astype(jnp.int32), m)
        p = _perm_matrix(perm, m, lu.dtype)
    else:
        p = _empty_like_meta(ctx, 0, lu.dtype)
    return p, lower, upper


def _lu_solve_left(lu, pivots, b, adjoint):
    """A x = b (or A^H x = b) from A = P L U; lu, pivots and b already share their batch dims."""
    m = lu.shape[-2]
    perm = _permutation_from_pivots(pivots, m)
    if not adjoint:
        pb = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        y = lax_linalg.triangular_solve(lu, pb, left_side=True, lower=True, unit_diagonal=True)
        return lax_linalg.triangular_solve(lu, y, left_side=True, lower=False)
    y = lax_linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    z = lax_linalg.triangular_solve(
        lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True
    )
    inverse = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(z, inverse[..., :, None], axis=-2)


def _lu_solve(lu, pivots, b, left, adjoint):
    batch = jnp.broadcast_shapes(lu.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    lu = jnp.broadcast_to(lu, batch + lu.shape[-2:])
    pivots = jnp.broadcast_to(pivots.astype(jnp.int32), batch + pivots.shape[-1:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    if left:
        return _lu_solve_left(lu, pivots, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H
    return _mH(_lu_solve_left(lu, pivots, _mH(b), not adjoint))


@lowers("aten.linalg_lu_solve.default")
def linalg_lu_solve(lu, pivots, b, left=True, adjoint=False):
    return _lu_solve(lu, pivots, b, left, adjoint)


@lowers("aten._linalg_solve_ex.default")
def linalg_solve_ex(a, b, left=True, check_errors=False):
    """As torch: a real A is factored transposed (LU and pivots are those of A^T) and solved adjoint.

    B is a (batch of) column vector(s) when it is 1-d or has A's shape without its last dim.
    """
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    transposed = not jnp.issubdtype(a.dtype, jnp.complexfloating)
    lu, pivots, _ = _lu(jnp.swapaxes(a, -1, -2) if transposed else a)
    x = _lu_solve(lu, pivots, b[..., None] if vector else b, left, transposed)
    return (x[..., 0] if vector else x), lu, pivots, _info(a.shape[:-2])


@lowers("aten.linalg_inv_ex.default")
def linalg_inv_ex(a, check_errors=False):
    """torch solves A X = I (getrf + getrs); info is always 0, a singular A gives inf/NaN."""
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    x, _, _, info = linalg_solve_ex(a, eye)
    return x, info


def _det_from_lu(lu, pivots):
    """sign(permutation) * prod(diag(U)), as torch computes det from getrf."""
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(pivots != jnp.arange(1, pivots.shape[-1] + 1, dtype=pivots.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(lu.dtype)
    return diag, parity


@lowers("aten._linalg_det.default")
def linalg_det(a):
    lu, pivots, _ = _lu(a)
    diag, parity = _det_from_lu(lu, pivots)
    return parity * jnp.prod(diag, axis=-1), lu, pivots


@lowers("aten._linalg_slogdet.default")
def linalg_slogdet(a):
    """sign is the unit-modulus phase of det (0 when singular); logabsdet is sum(log|U_ii|)."""
    lu, pivots, _ = _lu(a)
    diag, parity = _det_from_lu(lu, pivots)
    absdiag = jnp.abs(diag)
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        phase = jnp.prod(diag / absdiag.astype(diag.dtype), axis=-1)
    else:
        phase = jnp.prod(jnp.sign(diag), axis=-1)
    logabsdet = jnp.sum(jnp.log(absdiag), axis=-1)
    singular = jnp.any(absdiag == 0, axis=-1)
    sign = jnp.where(singular, jnp.zeros((), a.dtype), parity * phase)
    return sign, logabsdet, lu, pivots


# --- LDL^T (Bunch-Kaufman): sytrf / sytrs -------------------------------------------------------


def _map_matrices(fn, batch, *xs):
    """vmap `fn` over the flattened batch dims `batch` shared by every array in `xs`."""
    nb = len(batch)
    flat = [x.reshape((-1,) + x.shape[nb:]) for x in xs]
    outs = jax.vmap(fn)(*flat)
    return tuple(o.reshape(batch + o.shape[1:]) for o in outs)


def _abs1(x):
    """LAPACK's pivot magnitude: |x| for reals, CABS1 = |re| + |im| for complex (i?amax, ?sytf2)."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.abs(x.real) + jnp.abs(x.imag)
    return jnp.abs(x)


def _real_div(z, r):
    """Complex / real componentwise, as Fortran does it (XLA's complex division rounds differently)."""
    if jnp.issubdtype(z.dtype, jnp.complexfloating):
        return lax.complex(z.real / r, z.imag / r)
    return z / r


def _sytf2_lower(a, herm):
    """LAPACK ?sytf2 (herm: ?hetf2) with uplo='L' on one matrix, step by step, so LD, pivots and info
    are LAPACK's own: Bunch-Kaufman pivots, interchanges applied to the trailing matrix only.

    `a` holds the lower triangle (zeros above); `s = full(a)` is its symmetric (Hermitian) view, in
    which the symmetric interchange of rows/cols kk, kp is a gather.
    """
    n = a.shape[-1]
    real = jnp.finfo(a.dtype).dtype
    alpha = (1 + jnp.sqrt(jnp.asarray(17, real))) / 8
    idx = jnp.arange(n)
    row, col = idx[:, None], idx[None, :]
    lower = row >= col
    diag = row == col
    conj = jnp.conj if herm else (lambda x: x)

    def full(a):
        return jnp.where(lower, a, conj(a.T))

    def realdiag(a):  # ?hetf2 keeps D's diagonal real (ignoring any imaginary input)
        return jnp.where(diag, a.real.astype(a.dtype), a) if herm else a

    def diag_abs(x):
        return jnp.abs(x.real) if herm else _abs1(x)

    def step(state):
        k, a, ipiv, info = state
        s = full(a)
        absakk = diag_abs(s[k, k])
        cabs = jnp.where(idx > k, _abs1(s[:, k]), -1)
        imax = jnp.argmax(cabs)  # first maximum, as i?amax
        colmax = jnp.maximum(cabs[imax], 0)
        rowmax = jnp.max(jnp.where((idx >= k) & (idx != imax), _abs1(s[imax]), 0))
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        keep = singular | (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
        two = ~keep & ~(diag_abs(s[imax, imax]) >= alpha * rowmax)
        kp = jnp.where(keep, k, imax)
        kk = jnp.where(two, k + 1, k)
        perm = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        s = jnp.where((row >= k) & (col >= k), s[perm][:, perm], s)
        a = jnp.where(lower, s, 0)

        k1 = jnp.minimum(k + 1, n - 1)
        xk, xk1 = s[:, k], s[:, k1]
        # 1x1 pivot: A22 -= x (1/d) x^T (?syr / ?her), then column k = x / d
        xb = jnp.where(idx > k, xk, 0)
        if herm:
            d = 1 / s[k, k].real
            temp = (-d) * jnp.conj(xb)
        else:
            d = 1 / s[k, k]
            temp = (-d) * xb
        one_a = jnp.where(lower & (row > k) & (col > k), a + xb[:, None] * temp[None, :], a)
        one_a = jnp.where((col == k) & (row > k), (d * xb)[:, None], one_a)
        # 2x2 pivot: rank-2 update of A(k+2:, k+2:) with W = (x_k x_k+1) inv(D), as ?sytf2 writes it
        if herm:
            d21 = jnp.abs(s[k1, k])
            d11 = s[k1, k1].real / d21
            d22 = s[k, k].real / d21
            tt = 1 / (d11 * d22 - 1)
            u21 = _real_div(s[k1, k], d21)
            dd = tt / d21
            wk = dd * (d11 * xk - u21 * xk1)
            wkp1 = dd * (d22 * xk1 - jnp.conj(u21) * xk)
        else:
            d21 = s[k1, k]
            d11 = s[k1, k1] / d21
            d22 = s[k, k] / d21
            dd = (1 / (d11 * d22 - 1)) / d21
            wk = dd * (d11 * xk - xk1)
            wkp1 = dd * (d22 * xk1 - xk)
        upd = a - xk[:, None] * conj(wk)[None, :] - xk1[:, None] * conj(wkp1)[None, :]
        two_a = jnp.where(lower & (row > k1) & (col > k1), upd, a)
        two_a = jnp.where((col == k) & (row > k1), wk[:, None], two_a)
        two_a = jnp.where((col == k1) & (row > k1), wkp1[:, None], two_a)

        new = realdiag(jnp.where(two, two_a, one_a))
        a = jnp.where(singular, a, new)  # a zero (or NaN) column: no elimination, info = k
        p = (kp + 1).astype(jnp.int32)
        ipiv = jnp.where(two, jnp.where((idx == k) | (idx == k1), -p, ipiv), jnp.where(idx == k, p, ipiv))
        info = jnp.where(singular & (info == 0), (k + 1).astype(jnp.int32), info)
        return k + jnp.where(two, 2, 1), a, ipiv, info

    a = realdiag(jnp.where(lower, a, 0))
    init = (jnp.asarray(0, idx.dtype), a, jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32))
    _, a, ipiv, info = lax.while_loop(lambda st: st[0] < n, step, init)
    return a, ipiv, info


def _sytrs_lower(ld, ipiv, b, herm):
    """LAPACK ?sytrs (herm: ?hetrs), uplo='L': A X = B from ?sytf2's LD and pivots, for one matrix.

    Forward: interchange, then L and D solves block by block; backward: L^T (L^H) and interchanges.
    """
    n = ld.shape[-1]
    idx = jnp.arange(n)
    conj = jnp.conj if herm else (lambda x: x)

    def swap(b, i, j):
        return b[jnp.where(idx == i, j, jnp.where(idx == j, i, idx))]

    def forward(state):
        k, b = state
        p = ipiv[k]
        one = p > 0
        k1 = jnp.minimum(k + 1, n - 1)
        b = swap(b, jnp.where(one, k, k1), jnp.abs(p) - 1)
        lk, lk1 = ld[:, k], ld[:, k1]
        bk, bk1 = b[k], b[k1]
        # 1x1: B(k+1:) -= L(:,k) B(k) (?ger), then B(k) /= D(k)
        one_b = jnp.where((idx > k)[:, None], b + lk[:, None] * (-bk)[None, :], b)
        scale = 1 / ld[k, k].real if herm else 1 / ld[k, k]
        one_b = one_b.at[k].set(scale * bk)
        # 2x2: B(k+2:) -= L(:,k) B(k) + L(:,k+1) B(k+1), then solve with D's 2x2 block
        upd = (b + lk[:, None] * (-bk)[None, :]) + lk1[:, None] * (-bk1)[None, :]
        two_b = jnp.where((idx > k1)[:, None], upd, b)
        akm1k = ld[k1, k]
        akm1 = ld[k, k] / conj(akm1k)
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1 = bk / conj(akm1k)
        bkk = bk1 / akm1k
        two_b = two_b.at[k].set((ak * bkm1 - bkk) / denom).at[k1].set((akm1 * bkk - bkm1) / denom)
        return k + jnp.where(one, 1, 2), jnp.where(one, one_b, two_b)

    def backward(state):
        k, b = state
        p = ipiv[k]
        one = p > 0
        km1 = jnp.maximum(k - 1, 0)
        below = (idx > k)[:, None]
        dot_k = jnp.sum(jnp.where(below, conj(ld[:, k])[:, None] * b, 0), axis=0)
        dot_km1 = jnp.sum(jnp.where(below, conj(ld[:, km1])[:, None] * b, 0), axis=0)
        b = b.at[k].add(-dot_k)
        b = jnp.where(one, b, b.at[km1].add(-dot_km1))
        return k - jnp.where(one, 1, 2), swap(b, k, jnp.abs(p) - 1)

    k0 = jnp.asarray(0, idx.dtype)
    _, b = lax.while_loop(lambda st: st[0] < n, forward, (k0, b))
    _, b = lax.while_loop(lambda st: st[0] >= 0, backward, (k0 + n - 1, b))
    return b


@lowers("aten.linalg_ldl_factor_ex.default")
def linalg_ldl_factor_ex(a, hermitian=False, check_errors=False):
    """torch's sytrf (hetrf for complex hermitian) with uplo='L'; the strict upper triangle is zero.

    JAX has no sytrf, so this runs the unblocked ?sytf2 (whose pivot choices the blocked routine
    shares). Unlike the other `_ex` ops, `info` is exact: the first zero pivot column, 1-based.
    """
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0:
        return a, jnp.zeros(batch + (0,), jnp.int32), _info(batch)
    herm = bool(hermitian) and jnp.issubdtype(a.dtype, jnp.complexfloating)
    ld, pivots, info = _map_matrices(lambda m: _sytf2_lower(m, herm), batch, a)
    return ld, pivots, info


@lowers("aten.linalg_ldl_solve.default")
def linalg_ldl_solve(ld, pivots, b, hermitian=False):
    """sytrs (hetrs for complex hermitian) from ldl_factor's LD and pivots; batch dims broadcast."""
    batch = jnp.broadcast_shapes(ld.shape[:-2], pivots.shape[:-1], b.shape[:-2])
    ld = jnp.broadcast_to(ld, batch + ld.shape[-2:])
    pivots = jnp.broadcast_to(pivots.astype(jnp.int32), batch + pivots.shape[-1:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    if ld.shape[-1] == 0 or b.shape[-1] == 0:
        return b
    herm = bool(hermitian) and jnp.issubdtype(ld.dtype, jnp.complexfloating)
    (x,) = _map_matrices(lambda m, p, r: (_sytrs_lower(m, p, r, herm),), batch, ld, pivots, b)
    return x


# --- triangular solves -------------------------------------------------------------------------


@lowers("aten.linalg_solve_triangular.default")
def linalg_solve_triangular(a, b, upper, left=True, unitriangular=False):
    """trsm reading only A's `upper`/lower triangle: A X = B (left) or X A = B."""
    a, b = _broadcast_batch(a, b)
    return lax_linalg.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@lowers("aten.triangular_solve.default")
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """Legacy argument order (B first); returns (X, a clone of A broadcast to the batch shape)."""
    a, b = _broadcast_batch(a, b)
    x = lax_linalg.triangular_solve(
        a, b, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return x, a


# --- pseudo-inverse, matrix exponential --------------------------------------------------------


@lowers("aten.linalg_pinv.atol_rtol_tensor")
def linalg_pinv(a, atol=None, rtol=None, hermitian=False):
    """torch's formula: singular values above max(atol, rtol * sigma_max) are inverted, the rest zeroed.

    rtol defaults to eps * max(m, n), or to 0 where a positive atol is given.
    """
    m, n = a.shape[-2:]
    if a.size == 0:
        return jnp.zeros(a.shape[:-2] + (n, m), a.dtype)
    real = jnp.finfo(a.dtype).dtype
    eps = jnp.finfo(real).eps
    atol_v = jnp.zeros((), real) if atol is None else atol.astype(real)
    if rtol is None:
        default = jnp.asarray(eps * max(m, n), real)
        rtol_v = default if atol is None else jnp.where(atol_v > 0, jnp.zeros((), real), default)
    else:
        rtol_v = rtol.astype(real)
    if hermitian:
        s, u = jnp.linalg.eigh(a, symmetrize_input=False)
        s_abs = jnp.abs(s)
        tol = jnp.maximum(atol_v[..., None], rtol_v[..., None] * jnp.max(s_abs, axis=-1, keepdims=True))
        s_inv = jnp.where(s_abs > tol, 1 / s, 0).astype(a.dtype)
        return jnp.matmul(u * s_inv[..., None, :], _mH(u))
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    tol = jnp.maximum(atol_v[..., None], rtol_v[..., None] * s[..., :1])
    s_inv = jnp.where(s > tol, 1 / s, 0).astype(a.dtype)
    return jnp.matmul(_mH(vh) * s_inv[..., None, :], _mH(u))


@lowers("aten.linalg_matrix_exp.default")
def linalg_matrix_exp(a):
    """Padé approximation with scaling and squaring; low-precision inputs computed in float32."""
    low = a.dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    x = a.astype(jnp.float32) if low else a
    if x.shape[-1] == 0:
        return a
    if x.ndim == 2:
        return jax.scipy.linalg.expm(x).astype(a.dtype)
    flat = x.reshape((-1,) + x.shape[-2:])
    out = jax.vmap(jax.scipy.linalg.expm)(flat) if flat.shape[0] else flat
    return out.reshape(x.shape).astype(a.dtype)


# --- distances and complex construction --------------------------------------------------------


@lowers("aten.dist.default")
def dist(x, y, p=2):
    """||x - y||_p over all elements; the difference is rounded to the input dtype first, as torch does."""
    diff = jnp.subtract(x, y)
    acc = jnp.float32 if diff.dtype in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)) else None
    a = jnp.abs(diff).astype(acc) if acc else jnp.abs(diff)
    p = float(p)
    if p == 0:
        out = jnp.sum(a != 0).astype(a.dtype)
    elif p == float("inf"):
        out = jnp.max(a, initial=0)
    elif p == float("-inf"):
        out = jnp.min(a) if a.size else jnp.asarray(float("inf"), a.dtype)
    elif p == 1:
        out = jnp.sum(a)
    elif p == 2:
        out = jnp.sqrt(jnp.sum(a * a))
    else:
        out = jnp.sum(a**p) ** (1.0 / p)
    return out.astype(diff.dtype)


@lowers("aten.polar.default")
def polar(magnitude, angle):
    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


@lowers("aten.complex.default")
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@lowers("aten.view_as_complex.default")
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@lowers("aten.view_as_real.default")
def view_as_real(x):
    """(..., 2) real and imaginary parts, as torch's view of a complex tensor."""
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
