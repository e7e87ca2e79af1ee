"""Every OpInfo in PyTorch's op database, exported, converted, run under jax.jit, compared with torch.

Default (make test): SAMPLES_PER_OP samples per op and dtype. Full sweep: T2J_OPINFO_SAMPLES=0.
A sample torch.export cannot export is skipped as torch's limit; known gaps live in skips.py,
one reason per entry.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from .opinfo_harness import SAMPLES_PER_OP, TorchLimit, convert_sample, prepare, run_and_compare
from .skips import SKIPS

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int32": torch.int32, "bool": torch.bool}


def _cases():
    for opinfo in op_db:
        supported = opinfo.supported_dtypes("cpu")
        for dtype_name, dtype in DTYPES.items():
            if dtype not in supported:
                continue
            case_id = f"{opinfo.name}.{opinfo.variant_test_name}" if opinfo.variant_test_name else opinfo.name
            reason = SKIPS.get((case_id, dtype_name)) or SKIPS.get((case_id, "*"))
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            yield pytest.param(opinfo, dtype, id=f"{case_id}-{dtype_name}", marks=marks)


@pytest.mark.parametrize("opinfo,dtype", list(_cases()))
def test_opinfo(opinfo, dtype):
    torch.manual_seed(0)
    samples = opinfo.sample_inputs("cpu", dtype, requires_grad=False)
    ran = 0
    torch_limits = []
    for sample in samples:
        if SAMPLES_PER_OP and ran >= SAMPLES_PER_OP:
            break
        try:
            prepared = prepare(opinfo, sample)
        except Exception as err:  # the sample itself fails in torch eager
            torch_limits.append(f"eager: {err}")
            continue
        try:
            model = convert_sample(prepared)
        except TorchLimit as err:
            torch_limits.append(str(err))
            continue
        run_and_compare(prepared, model)
        ran += 1
    if ran == 0:
        pytest.skip("torch.export cannot export any sample (torch's limit): " + (torch_limits[0] if torch_limits else "no samples"))
