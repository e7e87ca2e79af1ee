"""Every OpInfo in PyTorch's op database, exported, converted, run under jax.jit, compared with torch.

Default (make test), to stay inside CI's time: every op in float32, and every other op in one more
dtype taken in turn (bfloat16, int32, bool), SAMPLES_PER_OP samples each. Full sweep (make test-ops-full):
T2J_OPINFO_DTYPES=all T2J_OPINFO_SAMPLES=0, every dtype and every sample (T2J_OPINFO_DTYPES=float32: one dtype).
A sample torch.export cannot export is skipped as torch's limit; a sample whose output shape depends
on its values (nonzero, unique, ...) is refused by the converter by design, and counted as not passed.
Ops whose results torch leaves partly open are compared by what is defined (comparisons.py); known
gaps live in skips.py, one reason per entry.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from torch2jax.errors import UnsupportedOpsError

from .known_failures import KNOWN_FAILURES
from .opinfo_harness import SAMPLES_PER_OP, TorchLimit, case_id, convert_op_sample, prepare, run_and_compare
from .skips import SKIPS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int32": torch.int32, "bool": torch.bool}
# "rotate" (make test), "all", or a comma-separated list of DTYPES names (a sweep one dtype at a time)
DTYPE_CHOICE = os.environ.get("T2J_OPINFO_DTYPES", "rotate")
KNOWN = {} if os.environ.get("T2J_RUN_KNOWN_FAILURES") else KNOWN_FAILURES
CAPPED_TORCH_LIMITS = 20  # a capped run stops looking for an exportable sample after this many torch limits


def _dtypes_for(index: int, supported) -> list[str]:
    names = [name for name, dtype in DTYPES.items() if dtype in supported]
    if DTYPE_CHOICE == "all":
        return names
    if DTYPE_CHOICE != "rotate":
        return [name for name in names if name in DTYPE_CHOICE.split(",")]
    if "float32" not in names:
        return names[:1]
    others = [n for n in names if n != "float32"]
    if index % 2 or not others:
        return ["float32"]
    return ["float32", others[index % len(others)]]


def _cases():
    for index, opinfo in enumerate(op_db):
        supported = opinfo.supported_dtypes("cpu")
        for dtype_name in _dtypes_for(index, supported):
            dtype = DTYPES[dtype_name]
            case = case_id(opinfo)
            reason = SKIPS.get((case, dtype_name)) or SKIPS.get((case, "*")) or KNOWN.get((case, dtype_name))
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            yield pytest.param(opinfo, dtype, id=f"{case}-{dtype_name}", marks=marks)


@pytest.mark.parametrize("opinfo,dtype", list(_cases()))
def test_opinfo(opinfo, dtype, record_property):
    """Every sample up to the quota; a failing sample does not stop the others, so the report counts
    samples (T2J_OPINFO_REPORT); the case fails with the first failure."""
    torch.manual_seed(0)
    samples = opinfo.sample_inputs("cpu", dtype, requires_grad=False)
    ran = 0
    torch_limits, refused, failures = [], [], []
    for index, sample in enumerate(samples):
        if SAMPLES_PER_OP and ran + len(failures) + len(refused) >= SAMPLES_PER_OP:
            break
        if SAMPLES_PER_OP and len(torch_limits) >= CAPPED_TORCH_LIMITS:
            break  # an op torch.export rejects sample after sample (gaussian_nll_loss: 324 of 324, 15 s)
        try:
            prepared = prepare(opinfo, sample)
        except Exception as err:  # the sample itself fails in torch eager
            torch_limits.append(f"eager: {err}")
            continue
        try:
            prepared, model = convert_op_sample(opinfo, sample, prepared)
            run_and_compare(prepared, model)
        except TorchLimit as err:
            torch_limits.append(str(err))
            continue
        except UnsupportedOpsError as err:
            if "depends on the input values" not in str(err):
                failures.append((index, err))
                continue
            refused.append(", ".join(err.ops))
            continue
        except Exception as err:
            failures.append((index, err))
            continue
        ran += 1
    record_property("samples", {"passed": ran, "failed": len(failures), "refused": len(refused),
                                "torch-limit": len(torch_limits)})
    if failures:
        index, first = failures[0]
        raise AssertionError(f"{len(failures)} of {ran + len(failures)} samples failed; sample {index}: "
                             f"{type(first).__name__}: {first}") from first
    if ran == 0 and refused:
        pytest.skip(f"refused by design: output shape depends on the input values ({refused[0]}); docs/limitations.md")
    if ran == 0:
        pytest.skip("torch.export cannot export any sample (torch's limit): " + (torch_limits[0] if torch_limits else "no samples"))
