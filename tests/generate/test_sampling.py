"""torch2jax.generate.sampling: the kept sets and values match transformers' logits warpers, sampling draws from the
right distribution, everything is jit-able with per-row parameters, and bad settings raise Torch2JaxError."""

from __future__ import annotations

import functools
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from torch2jax.errors import Torch2JaxError
from torch2jax.generate.sampling import filter_logits, greedy, sample, sampling_params

ROOT = Path(__file__).resolve().parents[2]
V = 50


def hf_filter(row: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """One row through transformers' own warpers, in generate's order, skipping the ones that are off."""
    scores = torch.tensor(row[None], dtype=torch.float32)
    scores = TemperatureLogitsWarper(float(temperature))(None, scores)
    if top_k > 0:
        scores = TopKLogitsWarper(int(top_k))(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(float(top_p))(None, scores)
    return scores.numpy()[0]


def tie_at_kth(row: np.ndarray, k: int, extra: int = 2) -> np.ndarray:
    """Give the `extra` logits just below the k-th largest the k-th largest's exact value."""
    row = row.copy()
    order = np.argsort(-row, kind="stable")
    row[order[k : k + extra]] = row[order[k - 1]]
    return row


def assert_same_as_hf(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    kept = np.isfinite(theirs)
    np.testing.assert_array_equal(np.isfinite(ours), kept, err_msg=f"kept set differs: {what}")
    np.testing.assert_allclose(ours[kept], theirs[kept], rtol=0, atol=1e-6, err_msg=f"values differ: {what}")


def assert_no_split_ties(scaled: np.ndarray, kept: np.ndarray, what: str) -> None:
    """Precondition for comparing with stock transformers: no top-p cut falls inside a group of equal logits.

    TopPLogitsWarper sorts with torch.sort, whose tie order is not stable (seen on CPU for rows longer than 16), so where
    equal logits straddle the cut torch's own answer depends on its sort internals (that case is tested
    separately against a stable sort)."""
    removed = np.isfinite(scaled) & ~kept
    assert not np.isin(scaled[removed], scaled[kept]).any(), f"test data splits a tie at the top-p cut: {what}"


# Per-row (temperature, top_k, top_p): every filter alone, combined, off, and out of range (top_k > V).
PARAM_TABLES = [
    [(0.7, 5, 1.0), (1.3, 10, 0.9), (0.5, 0, 0.8), (1.0, 0, 1.0)],
    [(1.0, 1, 1.0), (0.8, 60, 0.95), (2.0, 3, 0.5), (0.6, 20, 0.7)],
    [(1.1, 49, 1.0), (0.9, 50, 0.45), (1.0, 7, 0.99), (0.4, 2, 0.9)],
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("table", range(len(PARAM_TABLES)))
def test_filter_logits_matches_transformers_warpers(seed, table):
    rows = PARAM_TABLES[table]
    rng = np.random.default_rng(seed)
    logits = (rng.normal(size=(len(rows), V)) * 2).astype(np.float32)
    for b, (_, k, p) in enumerate(rows):
        if p == 1.0 and 0 < k < V - 2:
            logits[b] = tie_at_kth(logits[b], k)  # exact ties at the top-k boundary: all of them are kept
        elif p < 1.0:
            # Ties at the top-k boundary are the least likely kept tokens, so top-p would cut into them (see
            # assert_no_split_ties); with top-p on, the exact tie is at the top of the row instead.
            logits[b] = tie_at_kth(logits[b], 1, extra=1)
    temperature, top_k, top_p = sampling_params(len(rows), *zip(*rows))
    ours = np.asarray(filter_logits(jnp.asarray(logits), temperature, top_k, top_p))
    assert ours.dtype == np.float32 and ours.shape == logits.shape
    for b, (t, k, p) in enumerate(rows):
        theirs = hf_filter(logits[b], t, k, p)
        what = f"row {b}, temperature={t}, top_k={k}, top_p={p}"
        assert_no_split_ties(logits[b] / np.float32(t), np.isfinite(theirs), what)
        assert_same_as_hf(ours[b], theirs, what)
        if p == 1.0 and 0 < k < V - 2:
            assert np.isfinite(theirs).sum() == k + 2, what  # the ties at the boundary really were all kept
        if k in (0, 60) and p == 1.0:
            assert np.isfinite(ours[b]).all(), what  # filters off -> unfiltered, just scaled


def test_filter_logits_tie_at_top_p_cut_removes_lower_indices_first():
    # Four equal logits straddle the top-p cut. Stock transformers' answer here depends on torch.sort's
    # unstable tie order; ours is deterministic and equals TopPLogitsWarper run with a stable sort.
    row = np.full(V, -5.0, np.float32)
    row[[3, 17, 30, 44]] = 1.0
    row[10] = 3.0
    ours = np.asarray(filter_logits(jnp.asarray(row[None]), jnp.float32(1.0), jnp.int32(0), jnp.float32(0.8)))[0]
    with mock.patch.object(torch, "sort", functools.partial(torch.sort, stable=True)):
        theirs = hf_filter(row, 1.0, 0, 0.8)
    assert_same_as_hf(ours, theirs, "tie at the top-p cut")
    kept_ties = [i for i in (3, 17, 30, 44) if np.isfinite(ours[i])]
    assert 0 < len(kept_ties) < 4, "the test row must split the tie group"
    assert kept_ties == [3, 17, 30, 44][-len(kept_ties) :]


def test_filter_logits_edge_cases():
    def one(row, t, k, p):
        return np.asarray(filter_logits(jnp.asarray(np.asarray(row, np.float32)[None]), jnp.float32(t), jnp.int32(k), jnp.float32(p)))[0]

    # The top-p cut is inclusive: four equally likely tokens (cumulative 0.25, 0.5, ... exactly), top_p=0.5 removes the
    # two whose cumulative probability is <= 0.5. (A tie again, so the reference is the warper with a stable sort.)
    ours = one([0.0, 0.0, 0.0, 0.0], 1.0, 0, 0.5)
    with mock.patch.object(torch, "sort", functools.partial(torch.sort, stable=True)):
        assert_same_as_hf(ours, hf_filter(np.zeros(4, np.float32), 1.0, 0, 0.5), "inclusive top-p cut")
    assert np.isfinite(ours).tolist() == [False, False, True, True]

    # A top_p so small that 1 - top_p rounds to 1 in float32 still keeps the most likely token (min_tokens_to_keep=1).
    row = np.random.default_rng(5).normal(size=V).astype(np.float32)
    ours = one(row, 1.0, 0, 1e-9)
    assert_same_as_hf(ours, hf_filter(row, 1.0, 0, 1e-9), "tiny top_p")
    assert np.flatnonzero(np.isfinite(ours)).tolist() == [int(np.argmax(row))]

    # top_p=1.0 is off, as generate() skips the warper: tokens whose probability underflows to 0 stay.
    row = np.array([0.0, -50.0, -200.0, -1000.0], np.float32)
    np.testing.assert_array_equal(one(row, 1.0, 0, 1.0), row)
    np.testing.assert_array_equal(one(row, 2.0, 60, 1.0), row / 2)

    # Logits already at -inf (masked tokens) stay out, and bfloat16 logits come back as float32.
    row = np.array([1.0, -np.inf, 0.5, -np.inf], np.float32)
    ours = filter_logits(jnp.asarray(row[None], jnp.bfloat16), jnp.float32(1.0), jnp.int32(3), jnp.float32(0.99))
    assert ours.dtype == jnp.float32
    assert_same_as_hf(np.asarray(ours)[0], hf_filter(row, 1.0, 3, 0.99), "masked tokens")


def test_greedy_ties_and_top_k_1_equals_greedy():
    rng = np.random.default_rng(0)
    tied = rng.integers(0, 4, size=(16, 12)).astype(np.float32)  # many ties at the max
    np.testing.assert_array_equal(np.asarray(greedy(jnp.asarray(tied))), torch.argmax(torch.from_numpy(tied), dim=-1).numpy())
    assert greedy(jnp.asarray(tied)).dtype == jnp.int32

    # Without ties at the max, top_k=1 keeps one token whatever the temperature and top_p, so sampling is greedy.
    # (With a tie at the max, top_k=1 keeps every tied token, as TopKLogitsWarper does.)
    logits = jnp.asarray(rng.normal(size=(16, 200)).astype(np.float32))
    temperature, top_k, top_p = sampling_params(16, np.linspace(0.3, 3.0, 16), 1, np.linspace(0.05, 1.0, 16))
    want = np.asarray(greedy(logits))
    step = jax.jit(sample)
    for i in range(32):
        np.testing.assert_array_equal(np.asarray(step(logits, jax.random.key(i), temperature, top_k, top_p)), want)


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16"])
def test_greedy_is_torch_argmax_with_nan_and_infinities(dtype):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(6, 32000)).astype(np.float32)
    logits[1, [7, 40]] = np.nan  # the first NaN wins
    logits[2, [3, 9]] = np.inf
    logits[3] = -np.inf  # every token -inf: index 0
    logits[4, [100, 50]] = 1e9  # a tie at the max: the lower index
    want = torch.argmax(torch.from_numpy(logits).to(torch.float32 if dtype is np.float32 else torch.bfloat16), dim=-1)
    got = jax.jit(greedy)(jnp.asarray(logits, dtype))
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
    assert got.dtype == jnp.int32


def test_same_key_same_tokens_different_keys_different_tokens():
    logits = jnp.zeros((8, 1000), jnp.float32)  # flat: every token equally likely
    params = sampling_params(8)
    a = np.asarray(sample(logits, jax.random.key(1), *params))
    b = np.asarray(sample(logits, jax.random.key(1), *params))
    c = np.asarray(sample(logits, jax.random.key(2), *params))
    assert a.dtype == np.int32 and a.shape == (8,)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) > 1  # rows draw independently


# chi2.ppf(0.999, df) for df = 1..10, used when scipy is missing.
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124, 9: 27.877, 10: 29.588}


def chi2_critical(df: int) -> float:
    try:
        from scipy.stats import chi2
    except ImportError:
        return CHI2_999[df]
    return float(chi2.ppf(0.999, df))


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x[np.isfinite(x)].max())
    return e / e.sum()


def np_top_k(x: np.ndarray, k: int) -> np.ndarray:
    return np.where(x < np.sort(x)[::-1][k - 1], -np.inf, x)


def np_top_p(x: np.ndarray, p: float) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    remove_sorted = np.cumsum(np_softmax(x)[order]) <= 1 - p
    remove_sorted[-1] = False
    remove = np.zeros(x.shape, bool)
    remove[order] = remove_sorted
    return np.where(remove, -np.inf, x)


def test_one_step_distribution_chi_square():
    logits = np.array([0.3, 1.5, -0.4, 0.9, 2.0, -1.0, 0.6, 1.2, -0.1, 0.0, 1.8, -0.7])
    t, k, p, n = 0.7, 8, 0.9, 40000

    # The expected distribution, computed here with numpy: temperature, then top-k, then top-p.
    expected_logits = np_top_p(np_top_k(logits / t, k), p)
    kept = np.isfinite(expected_logits)
    np.testing.assert_array_equal(np.flatnonzero(kept), [1, 3, 4, 7, 10])
    # Why this row discriminates: top-p applied before top-k keeps token 6 as well, so a wrong order would draw a
    # token outside the kept set; ignoring the temperature gives the probabilities checked against at the end.
    assert np.isfinite(np_top_k(np_top_p(logits / t, p), k)).sum() == 6
    expected = np_softmax(expected_logits)[kept]

    params = sampling_params(1, t, k, p)
    draw = jax.jit(jax.vmap(lambda key: sample(jnp.asarray(logits[None], jnp.float32), key, *params)[0]))
    tokens = np.asarray(draw(jax.random.split(jax.random.key(0), n)))
    counts = np.bincount(tokens, minlength=len(logits))
    assert counts[~kept].sum() == 0, f"tokens outside the kept set were drawn: {counts}"

    observed = counts[kept]
    critical = chi2_critical(int(kept.sum()) - 1)
    statistic = ((observed - n * expected) ** 2 / (n * expected)).sum()
    assert statistic < critical, f"chi2 {statistic:.1f} >= {critical:.1f}: observed {observed}, expected {n * expected}"

    # The same samples must NOT fit softmax(logits) over the kept set (temperature ignored): the test can tell.
    no_temperature = np_softmax(np.where(kept, logits, -np.inf))[kept]
    wrong = ((observed - n * no_temperature) ** 2 / (n * no_temperature)).sum()
    assert wrong > 10 * critical, f"chi2 with the temperature ignored is only {wrong:.1f}"


def test_jit_with_per_row_parameter_arrays():
    rng = np.random.default_rng(3)
    row = rng.normal(size=V).astype(np.float32)
    logits = jnp.asarray(np.tile(row, (64, 1)))
    best = int(np.argmax(row))
    top3 = set(np.argsort(-row)[:3].tolist())
    step = jax.jit(sample)
    filt = jax.jit(filter_logits)

    # Call 1: every row greedy through top_k=1, at different temperatures.
    params = sampling_params(64, np.linspace(0.5, 2.0, 64), 1, 1.0)
    assert (np.asarray(step(logits, jax.random.key(0), *params)) == best).all()

    # Call 2, same shapes and the same compiled function: even rows top_k=3, odd rows a tiny top_p (only the best).
    even = np.arange(64) % 2 == 0
    params = sampling_params(64, 1.0, np.where(even, 3, 0), np.where(even, 1.0, 1e-3))
    tokens = np.asarray(step(logits, jax.random.key(1), *params))
    assert (tokens[~even] == best).all()
    assert set(tokens[even].tolist()) <= top3 and len(set(tokens[even].tolist())) > 1
    kept = np.isfinite(np.asarray(filt(logits, *params)))
    assert (kept.sum(axis=1) == np.where(even, 3, 1)).all()
    np.testing.assert_array_equal(np.asarray(filt(logits, *params)), np.asarray(filter_logits(logits, *params)))


def test_sampling_params_broadcasts_and_casts():
    t, k, p = sampling_params(3)
    assert (t.shape, k.shape, p.shape) == ((3,), (3,), (3,))
    assert (t.dtype, k.dtype, p.dtype) == (jnp.float32, jnp.int32, jnp.float32)
    np.testing.assert_array_equal(t, 1.0)
    np.testing.assert_array_equal(k, 0)
    np.testing.assert_array_equal(p, 1.0)
    t, k, p = sampling_params(3, [0.5, 1.0, 2.0], np.array([0, 5, 10]), jnp.asarray([0.9, 1.0, 0.5]))
    np.testing.assert_allclose(t, [0.5, 1.0, 2.0])
    np.testing.assert_array_equal(k, [0, 5, 10])
    np.testing.assert_allclose(p, [0.9, 1.0, 0.5])
    assert sampling_params(2, top_k=4.0)[1].tolist() == [4, 4]  # an integral float (e.g. from JSON) is an integer


@pytest.mark.parametrize(
    ("kwargs", "texts"),
    [
        ({"temperature": 0.0}, ["temperature", "> 0", "got 0.0"]),
        ({"temperature": -1.0}, ["temperature", "> 0", "got -1.0"]),
        ({"temperature": [1.0, 0.0]}, ["temperature", "> 0", "got 0.0 at row 1"]),
        ({"temperature": float("nan")}, ["temperature", "> 0", "got nan"]),
        ({"top_k": -1}, ["top_k", "integer >= 0", "got -1"]),
        ({"top_k": 1.5}, ["top_k", "integer >= 0", "got 1.5"]),
        ({"top_p": 0.0}, ["top_p", "(0, 1]", "got 0.0"]),
        ({"top_p": 1.5}, ["top_p", "(0, 1]", "got 1.5"]),
        ({"top_p": float("nan")}, ["top_p", "(0, 1]", "got nan"]),
        ({"temperature": [1.0, 1.0, 1.0]}, ["temperature", "expected length 2", "shape (3,)"]),
        ({"top_k": [1]}, ["top_k", "expected length 2", "shape (1,)"]),
        ({"top_p": [[0.5, 0.5]]}, ["top_p", "expected length 2", "shape (1, 2)"]),
    ],
)
def test_sampling_params_errors(kwargs, texts):
    with pytest.raises(Torch2JaxError) as info:
        sampling_params(2, **kwargs)
    message = str(info.value)
    assert message.startswith(texts[0] + " "), message  # names the argument
    for text in texts[1:]:
        assert text in message, message


def test_temperature_message_suggests_greedy():
    with pytest.raises(Torch2JaxError, match=r"temperature must be > 0 when sampling \(got 0\.0\); use do_sample=False"):
        sampling_params(1, temperature=0.0)


def test_sampling_module_needs_no_torch():
    code = textwrap.dedent(
        """
        import sys
        sys.modules["torch"] = None  # any `import torch` now raises ImportError
        import jax, jax.numpy as jnp
        from torch2jax.generate.sampling import sample, sampling_params
        print(int(sample(jnp.arange(4.0)[None], jax.random.key(0), *sampling_params(1, top_k=1))[0]))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "3"
