"""Issue 55: what the jax device compiles for one call must not change what a later call computes.

The device keeps compiled kernels between calls (eager/compiled_lowerings.py). Once an integer-tensor
index had compiled aten.index.Tensor, a boolean index (`x[x > 0]`, masked_select, printing a tensor)
reused that entry and failed for the rest of the process. So these tests run an integer index first
and then the data-dependent calls, each from an empty kernel cache, and run the OpInfo samples of the
indexing, masked and data-dependent ops in orders other than op_db's: reversed, and every sample that
reads values (boolean masks, nonzero, unique, ...) after every integer-indexing one.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from tests.eager.test_opinfo_eager import DATA_DEPENDENT, KNOWN_FAILURES
from tests.ops.opinfo_harness import case_id, prepare, run_eager_and_compare
from tests.ops.skips import SKIPS
from torch2jax.eager import compiled_lowerings


@pytest.fixture
def fresh_kernels(monkeypatch):
    """An empty compiled-kernel cache, so the calls' order in this test alone decides what is compiled."""
    monkeypatch.setattr(compiled_lowerings, "_COMPILED", {})
    monkeypatch.setattr(compiled_lowerings, "_VARIANTS", {})


def _integer_index_first() -> None:
    """The call that used to poison the cache: aten.index.Tensor with an int64 index tensor."""
    a = torch.arange(12.0).reshape(3, 4)
    j = torch.tensor([0, 2])
    torch.testing.assert_close(a.to("jax")[j.to("jax")].cpu(), a[j])


def test_the_issue_repro_in_a_fresh_process():
    code = """
import torch, torch2jax.eager as te
te.enable()
a = torch.randn(3, 4, device="jax"); j = torch.tensor([0, 2], device="jax")
a[j]
x = torch.tensor([1.0, -2.0, 3.0], device="jax")
print(repr(x))
print(repr(x[x > 0]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["tensor([ 1., -2.,  3.], device='jax:0')", "tensor([1., 3.], device='jax:0')"]


def test_printing_and_a_boolean_read_after_an_integer_index(fresh_kernels):
    _integer_index_first()
    x = torch.tensor([1.0, -2.0, 3.0], device="jax")
    assert str(x) == repr(x) == "tensor([ 1., -2.,  3.], device='jax:0')"  # printing masks with masked_select
    assert repr(x[x > 0]) == "tensor([1., 3.], device='jax:0')"


def _masked_select(t: torch.Tensor) -> torch.Tensor:
    return torch.masked_select(t, t > 0)


def _boolean_rows(t: torch.Tensor) -> torch.Tensor:
    return t[t[:, 0] > 0]


def _boolean_read_2d(t: torch.Tensor) -> torch.Tensor:
    return t[t > 0]


def _index_add_of_selected_rows(t: torch.Tensor) -> torch.Tensor:
    source = t[t[:, 1] > 0]  # a boolean-selected source: its row count is a value
    target = torch.zeros(2, t.shape[1], device=t.device)
    index = torch.arange(source.shape[0], device=t.device) % 2
    return target.index_add_(0, index, source)


def _boolean_write(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t[t < 0] = 0.0
    return t


@pytest.mark.parametrize("fn", [_masked_select, _boolean_rows, _boolean_read_2d, _index_add_of_selected_rows,
                                _boolean_write], ids=lambda fn: fn.__name__.strip("_"))
def test_boolean_indexing_after_an_integer_index(fn, fresh_kernels):
    _integer_index_first()
    t = torch.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0], [7.0, 8.0, -9.0], [-1.0, -1.0, 2.0]])
    torch.testing.assert_close(fn(t.to("jax")).cpu(), fn(t))


# OpInfo samples in other orders -------------------------------------------------------------------------

INDEXING = ("__getitem__", "index_put", "index_select", "index_add", "index_copy", "index_fill", "index_reduce.amax",
            "take", "take_along_dim", "gather", "scatter", "scatter_add", "put", "_unsafe_masked_index",
            "_unsafe_masked_index_put_accumulate")
MASKED = ("masked_fill", "masked_scatter", "masked_select", "where")
SIZED_BY_VALUES = (DATA_DEPENDENT - {"__getitem__"}) | {"nonzero_static", "count_nonzero"}
EVERY_SAMPLE = ("__getitem__", "index_put")  # their integer and boolean indices are what is tested
SAMPLES_PER_CASE = 4  # of the others, in the default tier (~15 s); the slow tier runs every sample (~3 min)


def _reads_values(case: str, sample) -> bool:
    """A sample whose result size depends on the values: a data-dependent op, or a boolean index."""
    if case in SIZED_BY_VALUES:
        return True
    index = sample.args[0] if case in EVERY_SAMPLE and sample.args else ()
    index = index if isinstance(index, (list, tuple)) else [index]
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def _samples(per_case: int | None) -> list[tuple[str, int, bool, object]]:
    """(case, sample index, reads values, prepared sample) in op_db's order: float32, else int64 (bincount);
    `per_case` samples of each case but EVERY_SAMPLE's (None: all)."""
    wanted = set(INDEXING) | set(MASKED) | SIZED_BY_VALUES
    found = []
    for opinfo in op_db:
        case = case_id(opinfo)
        if case not in wanted:
            continue
        supported = opinfo.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in supported else torch.int64
        name = str(dtype).removeprefix("torch.")
        if dtype not in supported or SKIPS.get((case, name)) or SKIPS.get((case, "*")) or KNOWN_FAILURES.get(case):
            continue
        torch.manual_seed(0)
        kept = 0
        for index, sample in enumerate(opinfo.sample_inputs("cpu", dtype, requires_grad=False)):
            if case not in EVERY_SAMPLE and per_case is not None and kept >= per_case:
                break
            try:
                prepared = prepare(opinfo, sample)
            except Exception:  # the sample fails in torch eager itself: nothing to compare with
                continue
            found.append((case, index, _reads_values(case, sample), prepared))
            kept += 1
    assert {case for case, *_ in found} == wanted, f"no samples for {wanted - {case for case, *_ in found}}"
    return found


@pytest.mark.parametrize("per_case", [SAMPLES_PER_CASE, pytest.param(None, marks=pytest.mark.slow)],
                         ids=[f"{SAMPLES_PER_CASE}-samples", "every-sample"])
def test_opinfo_samples_give_torchs_results_in_any_order(per_case, fresh_kernels, record_property):
    """Each order starts from an empty kernel cache; a sample that changes its result with the order fails."""
    samples = _samples(per_case)
    assert any(reads for _, _, reads, _ in samples) and not all(reads for _, _, reads, _ in samples)
    orders = {
        "reversed": samples[::-1],
        "values-read-after-indexing": [s for s in samples if not s[2]] + [s for s in samples if s[2]],
    }
    failures = []
    for order, run in orders.items():
        compiled_lowerings._COMPILED.clear()
        compiled_lowerings._VARIANTS.clear()
        started = time.perf_counter()
        for case, index, _, prepared in run:
            try:
                run_eager_and_compare(prepared)
            except Exception as err:
                failures.append(f"{order}: {case} sample {index}: {type(err).__name__}: {str(err)[:300]}")
        record_property(f"{order}_seconds", round(time.perf_counter() - started, 1))
    assert not failures, f"{len(failures)} of {sum(map(len, orders.values()))} sample runs failed:\n" + "\n".join(failures)
