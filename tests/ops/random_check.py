"""Checks for random ops, whose values cannot match torch's bit for bit.

A converted graph that draws random numbers is checked for:
  - reproducibility: the same key gives the same output, bit for bit;
  - structure: each output's shape, and dtype as JAX carries torch's;
  - exactness where torch is deterministic (every torch draw the same, e.g. p=0 dropout);
  - support: integer-valued torch outputs give integer outputs; 0/1-style outputs (torch's draws
    take at most two distinct values) give values from that set;
  - distribution: a two-sample Kolmogorov-Smirnov test between DRAWS torch draws (seeds 0..;
    OpInfo's fixed-seed wrapper is reseeded per draw) and DRAWS of ours (keys 0..) on per-draw
    statistics (mean, mean square, fraction of zeros) at significance ALPHA. Per-draw statistics
    are independent across draws even when elements within a draw are not (randperm, dropout2d),
    so the test is valid for every op; seeds are fixed, so it is deterministic.
"""

from __future__ import annotations

import contextlib
import math
import sys

import jax
import numpy as np
import torch
import torch.testing._utils as torch_testing_utils

from torch2jax.capture.torch_arrays import to_numpy

from .opinfo_harness import check_shape_and_dtype, leaves

DRAWS = 200
ALPHA = 1e-4


def check_random(prepared, model) -> None:
    inputs = [to_numpy(t) for t in prepared.inputs]

    def ours(seed):
        return leaves(model(*inputs, rng=jax.random.key(seed)))

    def theirs(seed):
        with _seeded(seed), torch.no_grad():
            return leaves(prepared.module(*(t.clone() for t in prepared.inputs)))

    first, again = ours(0), ours(0)
    expected = leaves(prepared.expected)
    assert len(first) == len(expected), f"{len(first)} outputs, torch gives {len(expected)}"
    for k, (a, b, want) in enumerate(zip(first, again, expected)):
        path = f"output[{k}]"
        a, b = np.asarray(jax.device_get(a)), np.asarray(jax.device_get(b))
        assert a.tobytes() == b.tobytes(), f"{path}: the same key gave different outputs"
        if isinstance(want, torch.Tensor):
            check_shape_and_dtype(want, a, path)

    torch_draws = [theirs(i) for i in range(DRAWS)]
    our_draws = [ours(i) for i in range(DRAWS)]
    for k in range(len(expected)):
        if not isinstance(expected[k], torch.Tensor):
            continue
        t = np.stack([_np(d[k]) for d in torch_draws])
        o = np.stack([_np(d[k]) for d in our_draws])
        dtype = expected[k].dtype
        tiny = torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0
        _check_output(f"output[{k}]", t, o, tiny)


@contextlib.contextmanager
def _seeded(seed: int):
    """Seed torch for one draw. OpInfo wraps random ops in `wrapper_set_seed` (always seed 42), so
    for the draw that wrapper is swapped, in the modules that use it, for one seeding with `seed`."""

    def reseeded(op, *args, **kwargs):
        torch.manual_seed(seed)
        return op(*args, **kwargs)

    with seed_wrapper_replaced(reseeded), torch.random.fork_rng():
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def seed_wrapper_replaced(replacement):
    """OpInfo's `wrapper_set_seed` replaced by `replacement` in every module that uses it."""
    original = torch_testing_utils.wrapper_set_seed
    users = [m for name, m in list(sys.modules.items())
             if name.startswith("torch.testing") and getattr(m, "wrapper_set_seed", None) is original]
    for module in users:
        module.wrapper_set_seed = replacement
    try:
        yield
    finally:
        for module in users:
            module.wrapper_set_seed = original


def _check_output(path: str, t: np.ndarray, o: np.ndarray, tiny: float) -> None:
    """`tiny` is the smallest normal number of the output's dtype (0 for integers and bool)."""
    if t[0].size == 0:
        return
    if all(np.array_equal(t[0], d, equal_nan=True) for d in t[1:]):
        for d in o:  # torch is deterministic here: so must we be, and equal to it
            np.testing.assert_allclose(d, t[0], rtol=1.3e-6, atol=1e-5, equal_nan=True, err_msg=f"{path}: deterministic case")
        return
    finite_t, finite_o = t[np.isfinite(t)], o[np.isfinite(o)]
    if np.all(finite_t == np.round(finite_t)):
        assert np.all(finite_o == np.round(finite_o)), f"{path}: torch draws integers, ours are not"
    support = np.unique(finite_t)
    if support.size <= 2:
        extra = np.setdiff1d(np.unique(finite_o), support)
        assert extra.size == 0, f"{path}: values {extra[:5]} outside torch's support {support}"
    stats = (("mean", _mean), ("mean square", lambda v: _mean(v * v)), ("zero fraction", lambda v: _zero_fraction(v, tiny)))
    for name, stat in stats:
        st = np.array([stat(d) for d in t])
        so = _onto_atoms(np.array([stat(d) for d in o]), st)
        stat_d, bound = _ks(st, so)
        assert stat_d <= bound, (
            f"{path}: per-draw {name} differs from torch's in distribution (KS D={stat_d:.3f} > {bound:.3f}); "
            f"torch {np.nanmean(st):.4g}±{np.nanstd(st):.3g}, ours {np.nanmean(so):.4g}±{np.nanstd(so):.3g}"
        )


def _zero_fraction(values: np.ndarray, tiny: float) -> float:
    """Fraction of elements that are zero or subnormal in the output's dtype: XLA on CPU flushes
    subnormal results to zero where torch keeps them (a softmax weight of 1e-43), so an exact-zero
    count would tell the two apart by their handling of subnormals rather than by what was drawn."""
    return float(np.mean(np.abs(values) < tiny)) if tiny else float(np.mean(values == 0))


def _mean(values: np.ndarray) -> float:
    v = np.sort(values[np.isfinite(values)].ravel())  # sorted: the sum does not depend on element order
    return float(np.sum(v) / v.size) if v.size else 0.0


def _onto_atoms(ours: np.ndarray, theirs: np.ndarray) -> np.ndarray:
    """Our statistics moved onto torch's nearest value when within float32 rounding of it.

    A draw's statistic often takes a few exact values (a row either dropped or kept), computed by
    torch and by us in a different order: the same atom then sits a few ulps apart in the two
    samples, and KS, which compares step functions, would count the whole atom as a difference.
    """
    finite = np.sort(theirs[np.isfinite(theirs)])
    if finite.size == 0:
        return ours
    scale = np.max(np.abs(finite))
    slot = np.clip(np.searchsorted(finite, ours), 1, max(finite.size - 1, 1))
    below, above = finite[slot - 1], finite[np.minimum(slot, finite.size - 1)]
    nearest = np.where(np.abs(ours - below) <= np.abs(ours - above), below, above)
    return np.where(np.abs(ours - nearest) <= 1e-5 * scale, nearest, ours)


def _ks(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample KS statistic and its critical value at ALPHA."""
    a, b = np.sort(a), np.sort(b)
    points = np.concatenate([a, b])
    fa = np.searchsorted(a, points, side="right") / a.size
    fb = np.searchsorted(b, points, side="right") / b.size
    crit = math.sqrt(-math.log(ALPHA / 2) / 2) * math.sqrt((a.size + b.size) / (a.size * b.size))
    return float(np.max(np.abs(fa - fb))), crit


def _np(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64).numpy() if value.dtype != torch.bool else value.numpy().astype(np.float64)
    return np.asarray(jax.device_get(value)).astype(np.float64)
