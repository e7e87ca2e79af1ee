"""The OpInfo suite through torch.compile(backend=torch2jax): the export way's harness, comparisons and
tolerances (tests/ops/opinfo_harness.py), each op compiled with fullgraph=True and run from torch tensors.

Each op costs a dynamo + aot_autograd compile (about 0.3 s), so the default run takes every
T2J_OPINFO_COMPILE_EVERY-th op (default 16) in float32, SAMPLES_PER_OP samples; `make test-ops-compile`
runs every op in the export way's dtype rotation (T2J_OPINFO_COMPILE_EVERY=1 T2J_OPINFO_DTYPES=...).
A sample dynamo cannot capture as one graph is torch.compile's limit, skipped as such; an op whose output
shape depends on the input values (nonzero, unique) runs in torch by design and is counted as refused, as
export refuses it; an op the backend ran in torch for want of a lowering fails, as it does for export.
T2J_OPINFO_COMPILE_REPORT=<file> records the outcomes for docs/ops.md (tests/eager/conftest.py).
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from torch2jax.errors import UnsupportedOpsError

from ..ops.known_failures import KNOWN_FAILURES
from ..ops.opinfo_harness import (
    case_id,
    compile_sample,
    refuse_value_dependent,
    run_and_compare_compiled,
    run_samples,
    verdict,
)
from ..ops.skips import SKIPS
from ..ops.test_opinfo import DTYPES, _dtypes_for

EVERY = int(os.environ.get("T2J_OPINFO_COMPILE_EVERY", "16"))


def _cases():
    for index, opinfo in enumerate(op_db):
        if index % EVERY:
            continue
        supported = opinfo.supported_dtypes("cpu")
        names = ["float32"] if EVERY > 1 and torch.float32 in supported else _dtypes_for(index, supported)
        for dtype_name in names:
            case = case_id(opinfo)
            reason = SKIPS.get((case, dtype_name)) or SKIPS.get((case, "*")) or KNOWN_FAILURES.get((case, dtype_name))
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            yield pytest.param(opinfo, DTYPES[dtype_name], id=f"{case}-{dtype_name}", marks=marks)


@pytest.mark.parametrize("opinfo,dtype", list(_cases()))
def test_opinfo_compile(opinfo, dtype, record_property):
    def check(prepared):
        try:
            run_and_compare_compiled(prepared, compile_sample(prepared))
        except UnsupportedOpsError as err:
            refuse_value_dependent(err)

    verdict(run_samples(opinfo, dtype, check), record_property,
            limit="torch.compile cannot capture any sample (torch's limit)",
            refusal="refused by design: output shape depends on the input values, so torch runs it")
