"""OpInfo ops whose results torch defines only up to a choice it leaves open, compared by what is defined.

Each entry says what is left open and checks everything else, as strictly as the element-wise
comparison does:
  - uninitialized memory (`empty`...): only the shape and dtype are defined;
  - unstable order (`sort` without stable=True, `topk`, `kthvalue`, `mode`): which of several equal
    elements an index points at is implementation-defined, so values must equal torch's and every
    index must point at an element holding that value;
  - signs of singular vectors and eigenvectors: values must equal torch's, the factors must rebuild
    the input and be orthonormal, and each vector must be torch's up to sign;
  - `matrix_exp`: checked normwise against torch's float64 result, since torch's own float32 entries
    are off by up to 0.24% where terms cancel (and its bfloat16 result is NaN on these samples);
  - random ops whose draws happen inside a larger op (`rrelu` in training, fractional max pooling):
    the deterministic part is checked exactly and the random part by the property it must have.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np
import torch

from torch2jax.capture.torch_arrays import to_numpy

from .opinfo_harness import Prepared, check_shape_and_dtype, compare


@dataclass(frozen=True)
class Comparison:
    why: str
    check: Callable[[Prepared, object], None]


def _numpy(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    value = np.asarray(jax.device_get(value))
    return value.astype(np.float32) if str(value.dtype) == "bfloat16" else value


def _inputs(prepared: Prepared) -> list[np.ndarray]:
    return [to_numpy(t) for t in prepared.inputs]


def _outputs(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


# --- uninitialized memory ----------------------------------------------------------------------


def _shape_and_dtype(prepared: Prepared, model) -> None:
    ours, theirs = _outputs(model(*_inputs(prepared))), _outputs(prepared.expected)
    assert len(ours) == len(theirs), f"{len(ours)} outputs, torch gives {len(theirs)}"
    for k, (got, want) in enumerate(zip(ours, theirs)):
        check_shape_and_dtype(want, got, f"output[{k}]")


# --- unstable order ----------------------------------------------------------------------------


def _arg(sample, position: int, name: str, default):
    return sample.args[position] if len(sample.args) > position else sample.kwargs.get(name, default)


def _gathered(x: np.ndarray, indices: np.ndarray, dim: int, keepdim: bool) -> np.ndarray:
    if x.ndim == 0:
        return x.reshape(indices.shape)
    if not keepdim:
        indices = np.expand_dims(indices, dim)
    picked = np.take_along_axis(x, indices.astype(np.int64), axis=dim)
    return picked if keepdim else np.squeeze(picked, dim)


def _order_check(dim_at: int, keepdim_at: int | None = None, values: bool = True, sorted_at: int | None = None):
    """Values equal torch's (as multisets along `dim` when the op leaves their order open too); each
    of our indices points at an element equal to our value there. stable=True samples compare exactly."""

    def check(prepared: Prepared, model) -> None:
        sample = prepared.sample
        got = _outputs(model(*_inputs(prepared)))
        if sample.kwargs.get("stable"):
            return compare(prepared.expected, got if isinstance(prepared.expected, (list, tuple)) else got[0], "output")
        x = _numpy(prepared.inputs[0])
        dim = _arg(sample, dim_at, "dim", -1)
        keepdim = True if keepdim_at is None else _arg(sample, keepdim_at, "keepdim", False)
        want = _outputs(prepared.expected)
        if not values:  # argsort: indices only
            indices = _numpy(got[0])
            np.testing.assert_array_equal(_gathered(x, indices, dim, keepdim), _gathered(x, _numpy(want[0]), dim, keepdim),
                                          err_msg="x[our indices] != x[torch's indices]")
            return
        if sorted_at is not None and not _arg(sample, sorted_at, "sorted", True) and x.ndim:
            ours_sorted, torch_sorted = (np.sort(_numpy(v), axis=dim) for v in (got[0], want[0]))
            np.testing.assert_array_equal(ours_sorted, torch_sorted, err_msg="values (in any order)")
        else:
            compare(want[0], got[0], "values")
        indices = _numpy(got[1])
        np.testing.assert_array_equal(_gathered(x, indices, dim, keepdim), _numpy(got[0]), err_msg="x[indices] != values")

    return check


# --- signs of singular vectors and eigenvectors --------------------------------------------------

RTOL = 2e-5  # float32 LAPACK on small, well-scaled matrices


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


def _run(prepared: Prepared, model, rng=None):
    kwargs = {"rng": jax.random.key(0)} if rng else {}
    got = [_numpy(g) for g in _outputs(model(*_inputs(prepared), **kwargs))]
    return got, [_numpy(w) for w in _outputs(prepared.expected)]


def _check_svd_factors(a, u, s, v, tu, ts, tv):
    """A == U diag(S) V^H with orthonormal U, V, S equal to torch's and vectors torch's up to sign."""
    assert (u.shape, s.shape, v.shape) == (tu.shape, ts.shape, tv.shape), "factor shapes differ from torch's"
    scale = float(np.abs(ts).max()) if ts.size else 1.0
    _close(s, ts, scale, "singular values")
    k = s.shape[-1]
    _close((u[..., :, :k] * s[..., None, :]) @ _mH(v[..., :, :k]), a, scale, "U diag(S) V^H == A")
    _orthonormal_columns(u, "U^H U == I")
    _orthonormal_columns(v, "V^H V == I")
    _same_up_to_sign(u[..., :, :k], tu[..., :, :k], ts, "U columns are torch's up to sign")
    _same_up_to_sign(v[..., :, :k], tv[..., :, :k], ts, "V columns are torch's up to sign")


def _linalg_svd(prepared: Prepared, model) -> None:
    (u, s, vh), (tu, ts, tvh) = _run(prepared, model)
    _check_svd_factors(_numpy(prepared.inputs[0]), u, s, _mH(vh), tu, ts, _mH(tvh))


def _svd(prepared: Prepared, model) -> None:
    """Legacy torch.svd returns V, not Vh."""
    (u, s, v), (tu, ts, tv) = _run(prepared, model)
    _check_svd_factors(_numpy(prepared.inputs[0]), u, s, v, tu, ts, tv)


def _lowrank(center: bool):
    """torch.{pca,svd}_lowrank(a @ b^T, q=rank): exact factors of the (centered) product, found from
    random projections. With svd_lowrank's M the target a @ b^T - M has full rank: then the factors
    must be orthonormal, S at most the true top-q singular values (it is the spectrum of a
    projection), and the residual within 2x of the optimal rank-q one."""

    def check(prepared: Prepared, model) -> None:
        (u, s, v), (tu, ts, tv) = _run(prepared, model, rng=True)
        a, b = (_numpy(t) for t in prepared.inputs[:2])
        x = a @ np.swapaxes(b, -1, -2)
        if center and prepared.sample.kwargs.get("center", True):
            x = x - x.mean(axis=-2, keepdims=True)
        _orthonormal_columns(u, "U^H U == I")
        _orthonormal_columns(v, "V^H V == I")
        scale = float(np.abs(ts).max()) if ts.size else 1.0
        if center or len(prepared.inputs) == 2:
            _close(s, ts, scale, "singular values")
            _close((u * s[..., None, :]) @ _mH(v), x, scale, "U diag(S) V^H == A")
            return
        x = x - _numpy(prepared.inputs[2])  # svd_lowrank's M
        true = np.linalg.svd(x.astype(np.float64), compute_uv=False)
        q = s.shape[-1]
        assert np.all(s <= true[..., :q] * (1 + RTOL) + RTOL * scale), "S exceeds the true singular values"
        residual = np.linalg.norm((u * s[..., None, :]) @ _mH(v) - x, axis=(-2, -1))
        optimal = np.sqrt(np.sum(true[..., q:] ** 2, axis=-1))
        assert np.all(residual <= 2 * optimal + RTOL * scale), f"rank-{q} residual {residual} vs optimal {optimal}"

    return check


def _eigh(prepared: Prepared, model) -> None:
    """Only the UPLO triangle is read: the identity holds for the Hermitian matrix built from it."""
    (w, v), (tw, tv) = _run(prepared, model)
    x = _numpy(prepared.inputs[0])
    uplo = _arg(prepared.sample, 0, "UPLO", "L")
    tri = np.tril(x) if uplo == "L" else np.triu(x)
    hermitian = tri + _mH(tri) - np.eye(x.shape[-1], dtype=x.dtype) * np.diagonal(x, axis1=-2, axis2=-1)[..., None, :]
    scale = float(np.abs(tw).max()) if tw.size else 1.0
    _close(w, tw, scale, "eigenvalues (ascending)")
    _close(hermitian @ v, v * w[..., None, :], scale, "A V == V diag(w)")
    _orthonormal_columns(v, "V^H V == I")
    _same_up_to_sign(v, tv, tw, "eigenvectors are torch's up to sign")


def _matrix_exp(prepared: Prepared, model) -> None:
    """Normwise within 1e-5 of float64 truth (~80 float32 ulps), 2 ulps in bfloat16 (where torch's own
    CPU result is NaN on these samples)."""
    (got,), _ = _run(prepared, model)
    truth = torch.linalg.matrix_exp(prepared.inputs[0].double()).numpy()
    if truth.size == 0:
        assert got.shape == truth.shape
        return
    norm = np.linalg.norm(truth, axis=(-2, -1))
    error = np.linalg.norm(got.astype(np.float64) - truth, axis=(-2, -1)) / np.maximum(norm, 1e-30)
    tolerance = 2.0**-7 if prepared.inputs[0].dtype == torch.bfloat16 else 1e-5
    assert np.all(error <= tolerance), f"normwise error vs float64 {error.max():.2e} > {tolerance:.1e}"


# --- random draws inside a larger op -----------------------------------------------------------


def _rrelu_training(prepared: Prepared, model) -> None:
    """x >= 0 passes through; x < 0 is scaled by a slope drawn from U(lower, upper), different draws
    for different elements and keys."""
    sample = prepared.sample
    if not _arg(sample, 2, "training", False):
        return compare(prepared.expected, model(*_inputs(prepared)), "output")
    lower, upper = _arg(sample, 0, "lower", 1 / 8), _arg(sample, 1, "upper", 1 / 3)
    x = _numpy(prepared.inputs[0])
    draws = [_numpy(model(*_inputs(prepared), rng=jax.random.key(seed))) for seed in range(4)]
    negative = x < 0
    for out in draws:
        np.testing.assert_array_equal(out[~negative], x[~negative], err_msg="x >= 0 must pass through")
        slopes = out[negative] / x[negative]
        tol = 1e-6 if x.dtype == np.float32 else 1e-2
        assert np.all((slopes >= lower - tol) & (slopes <= upper + tol)), "slope outside [lower, upper]"
    if negative.sum() > 4 and upper > lower:
        assert not np.array_equal(draws[0], draws[1]), "different keys gave the same slopes"


def _fractional_max_pool(prepared: Prepared, model) -> None:
    """Each output is the maximum of some window of the pooling size inside the input, the windows
    start at non-decreasing offsets along each spatial dim, and the shape and dtype equal torch's."""
    sample = prepared.sample
    x = _numpy(prepared.inputs[0])
    kernel = _arg(sample, 0, "kernel_size", None)
    got = _outputs(model(*_inputs(prepared), rng=jax.random.key(0)))
    out = _numpy(got[0])
    want = _outputs(prepared.expected)[0]
    assert out.shape == tuple(want.shape), f"shape {out.shape}, torch {tuple(want.shape)}"
    n_spatial = 3 if "3d" in prepared.case_id else 2
    kernel = (kernel,) * n_spatial if isinstance(kernel, int) else tuple(kernel)
    windows = np.lib.stride_tricks.sliding_window_view(x, kernel, axis=tuple(range(x.ndim - n_spatial, x.ndim)))
    maxima = windows.max(axis=tuple(range(-n_spatial, 0)))  # every window's max, by window start
    lead = x.ndim - n_spatial

    def planes(a):  # (*batch dims, the spatial plane flattened); no -1, which an empty batch cannot infer
        return a.reshape(*a.shape[:lead], math.prod(a.shape[lead:]))

    flat = planes(maxima)
    hits = (planes(out)[..., :, None] == flat[..., None, :]).any(-1)
    assert hits.all(), "an output is not the maximum of any pooling window"
    if len(got) > 1:  # return_indices: flat positions within each spatial plane
        indices = planes(_numpy(got[1]))
        plane = planes(x)
        np.testing.assert_array_equal(np.take_along_axis(plane, indices.astype(np.int64), -1),
                                      out.reshape(indices.shape), err_msg="x[indices] != output")


COMPARISONS: dict[str, Comparison] = {
    **{name: Comparison("uninitialized memory: only shape and dtype are defined", _shape_and_dtype)
       for name in ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted")},
    "sort": Comparison("order of equal elements unspecified without stable=True", _order_check(dim_at=0)),
    "argsort": Comparison("order of equal elements unspecified without stable=True", _order_check(dim_at=0, values=False)),
    "topk": Comparison("which of several equal elements is returned is unspecified", _order_check(dim_at=1, sorted_at=3)),
    "kthvalue": Comparison("which of several equal elements is returned is unspecified", _order_check(dim_at=1, keepdim_at=2)),
    "mode": Comparison("which occurrence of the mode is returned is unspecified", _order_check(dim_at=0, keepdim_at=1)),
    "linalg.svd": Comparison("singular vectors are defined up to sign", _linalg_svd),
    "svd": Comparison("singular vectors are defined up to sign", _svd),
    "linalg.eigh": Comparison("eigenvectors are defined up to sign", _eigh),
    "pca_lowrank": Comparison("random projections; singular vectors defined up to sign", _lowrank(center=True)),
    "svd_lowrank": Comparison("random projections; singular vectors defined up to sign", _lowrank(center=False)),
    "matrix_exp": Comparison("torch's own float32 result is off float64 where terms cancel (bfloat16: NaN); "
                             "checked against float64", _matrix_exp),
    "nn.functional.rrelu": Comparison("training mode draws a random slope per element", _rrelu_training),
    "nn.functional.fractional_max_pool2d": Comparison("random window offsets", _fractional_max_pool),
    "nn.functional.fractional_max_pool3d": Comparison("random window offsets", _fractional_max_pool),
}
