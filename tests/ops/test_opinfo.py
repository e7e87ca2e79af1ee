"""Every OpInfo in PyTorch's op database, exported, converted, run under jax.jit, compared with torch.

Default (make test), to stay inside CI's time: every op in float32, and every fourth op in one more
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
from .opinfo_harness import case_id, convert_op_sample, refuse_value_dependent, run_and_compare, run_samples, verdict
from .skips import SKIPS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int32": torch.int32, "bool": torch.bool}
# "rotate" (make test), "all", or a comma-separated list of DTYPES names (a sweep one dtype at a time)
DTYPE_CHOICE = os.environ.get("T2J_OPINFO_DTYPES", "rotate")
KNOWN = {} if os.environ.get("T2J_RUN_KNOWN_FAILURES") else KNOWN_FAILURES


def _dtypes_for(index: int, supported) -> list[str]:
    names = [name for name, dtype in DTYPES.items() if dtype in supported]
    if DTYPE_CHOICE == "all":
        return names
    if DTYPE_CHOICE != "rotate":
        return [name for name in names if name in DTYPE_CHOICE.split(",")]
    if "float32" not in names:
        return names[:1]
    others = [n for n in names if n != "float32"]
    if index % 4 or not others:
        return ["float32"]
    return ["float32", others[index % len(others)]]  # the cases the every-other-op rotation ran, a subset


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
    """Every sample up to the quota (the report, T2J_OPINFO_REPORT, counts samples); fails with the first failure."""

    def check(prepared):
        try:
            prepared, model = convert_op_sample(opinfo, prepared.sample, prepared)
        except UnsupportedOpsError as err:
            refuse_value_dependent(err)
        run_and_compare(prepared, model)

    verdict(run_samples(opinfo, dtype, check), record_property,
            limit="torch.export cannot export any sample (torch's limit)",
            refusal="refused by design: output shape depends on the input values; docs/limitations.md")
