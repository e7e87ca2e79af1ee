"""Decompositions whose factors are defined only up to sign or phase, checked by their identities.

Singular vectors and eigenvectors are unique only up to a sign per vector (a phase for complex), and
which sign LAPACK picks is implementation-defined: torch's MKL and JAX's LAPACK differ on some OpInfo
samples, so skips.py skips the element-wise OpInfo comparison and these tests check instead, on the
same torch inputs run through the converter: the sign-free outputs equal torch's, the factors
reconstruct the input, are orthonormal, and match torch's vectors up to sign.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from .opinfo_harness import CallFn, Prepared, convert_sample

RTOL = 2e-5  # float32 LAPACK on small, well-scaled matrices


def _convert_and_run(fn, *tensors, rng=None):
    """(our outputs as numpy, torch eager's outputs as numpy), via the converter."""
    module = CallFn(fn)
    with torch.no_grad():
        expected = module(*tensors)
    model = convert_sample(Prepared(module, tensors, expected))
    got = model(*[t.numpy() for t in tensors], **({"rng": rng} if rng is not None else {}))
    got = [np.asarray(jax.device_get(g)) for g in (got if isinstance(got, (list, tuple)) else [got])]
    want = [t.numpy() for t in (expected if isinstance(expected, (list, tuple)) else [expected])]
    return got, want


def _samples(name, empty=True):
    """The OpInfo's float32 sample inputs, one per distinct (shape, kwargs); batched empty ones dropped."""
    opinfo = next(o for o in op_db if o.name == name and not o.variant_test_name)
    torch.manual_seed(0)
    seen = {}
    for sample in opinfo.sample_inputs("cpu", torch.float32):
        shape = tuple(sample.input.shape)
        if 0 in shape and (not empty or len(shape) > 2):
            continue
        seen.setdefault((shape, tuple(sorted(sample.kwargs.items()))), sample)
    return list(seen.values())


def _mH(x):
    return np.conj(np.swapaxes(x, -1, -2))


def _close(got, want, scale=1.0, what=""):
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * max(1.0, scale) * 10, err_msg=what)


def _orthonormal_columns(q, what):
    k = q.shape[-1]
    _close(_mH(q) @ q, np.broadcast_to(np.eye(k, dtype=q.dtype), q.shape[:-2] + (k, k)), what=what)


def _same_up_to_sign(ours, theirs, values, what):
    """Column i of `ours` is +-column i of `theirs` wherever values[i] is simple (apart from its neighbours)."""
    if ours.size == 0:
        return
    overlap = np.abs(np.sum(np.conj(ours) * theirs, axis=-2))  # |<ours_i, theirs_i>|
    gaps = np.abs(np.diff(values, axis=-1))
    isolated = np.ones(values.shape, bool)
    isolated[..., 1:] &= gaps > 1e-3
    isolated[..., :-1] &= gaps > 1e-3
    np.testing.assert_allclose(overlap[isolated], 1.0, atol=1e-4, err_msg=what)


@pytest.mark.parametrize("sample", _samples("linalg.svd"), ids=lambda s: f"{tuple(s.input.shape)}-{s.kwargs}")
def test_linalg_svd(sample):
    a = sample.input
    full = sample.kwargs.get("full_matrices", True)
    (u, s, vh), (tu, ts, tvh) = _convert_and_run(lambda x: torch.linalg.svd(x, full_matrices=full), a)
    assert (u.shape, s.shape, vh.shape) == (tu.shape, ts.shape, tvh.shape)
    scale = float(np.abs(ts).max()) if ts.size else 1.0
    _close(s, ts, scale, "singular values")
    k = s.shape[-1]
    _close((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a.numpy(), scale, "U diag(S) Vh == A")
    _orthonormal_columns(u, "U^H U == I")
    _orthonormal_columns(_mH(vh), "Vh Vh^H == I")
    _same_up_to_sign(u[..., :, :k], tu[..., :, :k], ts, "U columns are torch's up to sign")
    _same_up_to_sign(_mH(vh)[..., :, :k], _mH(tvh)[..., :, :k], ts, "V columns are torch's up to sign")


@pytest.mark.parametrize("sample", _samples("svd", empty=False), ids=lambda s: f"{tuple(s.input.shape)}-{s.kwargs}")
def test_svd(sample):
    """Legacy torch.svd: returns V (not Vh); `some` picks reduced or full factors."""
    a = sample.input
    some = sample.kwargs.get("some", True)
    (u, s, v), (tu, ts, tv) = _convert_and_run(lambda x: torch.svd(x, some=some), a)
    assert (u.shape, s.shape, v.shape) == (tu.shape, ts.shape, tv.shape)
    scale = float(np.abs(ts).max()) if ts.size else 1.0
    _close(s, ts, scale, "singular values")
    k = s.shape[-1]
    _close((u[..., :, :k] * s[..., None, :]) @ _mH(v[..., :, :k]), a.numpy(), scale, "U diag(S) V^H == A")
    _orthonormal_columns(u, "U^H U == I")
    _orthonormal_columns(v, "V^H V == I")
    _same_up_to_sign(u[..., :, :k], tu[..., :, :k], ts, "U columns are torch's up to sign")
    _same_up_to_sign(v[..., :, :k], tv[..., :, :k], ts, "V columns are torch's up to sign")


@pytest.mark.parametrize("sample", _samples("linalg.eigh"), ids=lambda s: f"{tuple(s.input.shape)}-{s.kwargs}")
def test_linalg_eigh(sample):
    """Only the UPLO triangle is read: the identity holds for the Hermitian matrix built from it."""
    a = sample.input
    uplo = sample.kwargs.get("UPLO", "L")
    (w, v), (tw, tv) = _convert_and_run(lambda x: torch.linalg.eigh(x, UPLO=uplo), a)
    x = a.numpy()
    tri = np.tril(x) if uplo == "L" else np.triu(x)
    hermitian = tri + _mH(tri) - np.eye(x.shape[-1], dtype=x.dtype) * np.diagonal(x, axis1=-2, axis2=-1)[..., None, :]
    scale = float(np.abs(tw).max()) if tw.size else 1.0
    _close(w, tw, scale, "eigenvalues (ascending)")
    _close(hermitian @ v, v * w[..., None, :], scale, "A V == V diag(w)")
    _orthonormal_columns(v, "V^H V == I")
    _same_up_to_sign(v, tv, tw, "eigenvectors are torch's up to sign")


@pytest.mark.parametrize("sample", _samples("linalg.eig"), ids=lambda s: f"{tuple(s.input.shape)}")
def test_linalg_eig(sample):
    """geev's order and normalization match torch's on these samples; the identity is checked too."""
    a = sample.input
    (w, v), (tw, tv) = _convert_and_run(torch.linalg.eig, a)
    scale = float(np.abs(tw).max()) if tw.size else 1.0
    _close(w, tw, scale, "eigenvalues")
    _close(a.numpy().astype(v.dtype) @ v, v * w[..., None, :], scale, "A V == V diag(w)")
    np.testing.assert_allclose(np.linalg.norm(v, axis=-2), 1.0, atol=1e-5) if v.size else None


@pytest.mark.parametrize("shape,q,center", [((6, 4), 4, True), ((2, 5, 3), 3, False), ((4, 4), 4, True)])
def test_pca_lowrank(shape, q, center):
    """Random projections inside: with q = rank the factors reconstruct the (centered) input exactly."""
    torch.manual_seed(0)
    a = torch.randn(*shape)
    (u, s, v), (tu, ts, tv) = _convert_and_run(
        lambda x: torch.pca_lowrank(x, q=q, center=center), a, rng=jax.random.key(0)
    )
    x = a.numpy() - (a.numpy().mean(axis=-2, keepdims=True) if center else 0)
    scale = float(np.abs(ts).max())
    _close(s, ts, scale, "singular values")
    _close((u * s[..., None, :]) @ _mH(v), x, scale, "U diag(S) V^H == A - mean")
    _orthonormal_columns(u, "U^H U == I")
    _orthonormal_columns(v, "V^H V == I")


@pytest.mark.parametrize("shape,q", [((6, 4), 4), ((2, 3, 5), 3)])
def test_svd_lowrank(shape, q):
    torch.manual_seed(0)
    a = torch.randn(*shape)
    (u, s, v), (tu, ts, tv) = _convert_and_run(lambda x: torch.svd_lowrank(x, q=q), a, rng=jax.random.key(0))
    scale = float(np.abs(ts).max())
    _close(s, ts, scale, "singular values")
    _close((u * s[..., None, :]) @ _mH(v), a.numpy(), scale, "U diag(S) V^H == A")
    _orthonormal_columns(u, "U^H U == I")
    _orthonormal_columns(v, "V^H V == I")


@pytest.mark.parametrize("sample", _samples("matrix_exp"), ids=lambda s: f"{tuple(s.input.shape)}")
def test_matrix_exp_accuracy(sample):
    """Against float64 truth, normwise: within 1e-5 relative (~80 float32 ulps).

    Element-wise comparison with torch's float32 result fails on entries that cancel (e.g. 0.148 from
    terms of size ~400): torch's float32 value there is itself off by 0.24% from float64. JAX's Pade
    expm is normwise up to ~10x less accurate than torch's Taylor one on one sample (2.4e-6 vs 2.4e-7).
    """
    a = sample.input
    (got,), (want32,) = _convert_and_run(torch.linalg.matrix_exp, a)
    truth = torch.linalg.matrix_exp(a.double()).numpy()
    norm = np.linalg.norm(truth, axis=(-2, -1))
    ours = np.linalg.norm(got.astype(np.float64) - truth, axis=(-2, -1)) / norm
    torch_own = np.linalg.norm(want32.astype(np.float64) - truth, axis=(-2, -1)) / norm
    assert np.all(ours <= 1e-5), (ours, torch_own)
