"""The OpInfo suite on the eager jax device: the export suite's harness, samples and tolerances.

Each sample's op runs on `jax` tensors op by op (torch2jax.eager) and is compared with torch eager
on CPU (tests/ops/opinfo_harness.run_eager_and_compare). Ops whose output size depends on the
values (nonzero, unique, masked_select, boolean indexing) run here, where export refuses them.

Default (make test): float32, SAMPLES_PER_OP samples, every EAGER_STRIDE-th op of op_db plus the
data-dependent ones, to bound the time. `make test-ops-eager` (T2J_EAGER_OPINFO=all): every op,
recording docs/opinfo_eager_results.json (T2J_OPINFO_EAGER_REPORT) for docs/ops.md's eager column;
T2J_EAGER_OPINFO_DTYPES=float32,int32,bool,bfloat16 sweeps other dtypes too.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from tests.ops.opinfo_harness import NotOnJaxDevice, TorchLimit, case_id, run_eager_and_compare, run_samples, verdict
from tests.ops.skips import SKIPS

EVERY_OP = os.environ.get("T2J_EAGER_OPINFO") == "all"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int32": torch.int32, "bool": torch.bool}
CHOSEN = os.environ.get("T2J_EAGER_OPINFO_DTYPES", "float32").split(",")  # a sweep names others
EAGER_STRIDE = 24
DATA_DEPENDENT = {"nonzero", "unique", "unique_consecutive", "masked_select", "__getitem__", "argwhere", "bincount",
                  "repeat_interleave"}
# Cases expected to fail on the eager device, one reason each; shrinking this is progress.
KNOWN_FAILURES = {
    "nn.functional.rrelu": "aten::rrelu_with_noise has no lowering (a random op torch does not decompose)",
    "logcumsumexp": "aten::_logcumsumexp has no lowering (export decomposes logcumsumexp before it)",
    "linalg.eigvals": "aten::_linalg_eigvals has no lowering (export refuses it too)",
    "linalg.lstsq": "aten::linalg_lstsq has no lowering",
    "linalg.lstsq.grad_oriented": "aten::linalg_lstsq has no lowering",
    "cholesky_solve": "aten::_cholesky_solve_helper has no lowering (export decomposes before it)",
    "nn.functional.ctc_loss": "aten::_ctc_loss has no lowering",
    "nn.functional.embedding_bag": "the _embedding_bag lowering fails on the sample's empty per_sample_weights",
    "nn.functional.pad.replicate_negative": "replication_pad2d's lowering cannot pad an axis cropped to empty",
    "tensor_split": "torch wants the indices tensor on the CPU; the harness moves every input to the jax device",
    "to": "a sample asks for pinned memory, which the jax device does not have",
}


def _cases():
    for index, opinfo in enumerate(op_db):
        if not (EVERY_OP or index % EAGER_STRIDE == 0 or opinfo.name in DATA_DEPENDENT):
            continue
        supported = opinfo.supported_dtypes("cpu")
        for name in CHOSEN:
            if DTYPES[name] not in supported:
                continue
            case = case_id(opinfo)
            reason = SKIPS.get((case, name)) or SKIPS.get((case, "*")) or (
                not EVERY_OP and name == "float32" and KNOWN_FAILURES.get(case))
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            yield pytest.param(opinfo, DTYPES[name], id=f"{case}-{name}", marks=marks)


@pytest.mark.parametrize("opinfo,dtype", list(_cases()))
def test_opinfo_eager(opinfo, dtype, record_property):
    def check(prepared):
        if not prepared.inputs:  # a factory op: the sample creates its tensors on the CPU
            raise TorchLimit("no tensor inputs: nothing runs on the jax device")
        try:
            run_eager_and_compare(prepared)
        except NotOnJaxDevice as err:
            raise TorchLimit(f"{err}: nothing ran on the jax device") from None

    verdict(run_samples(opinfo, dtype, check), record_property, limit="torch eager runs no sample of this op",
            refusal="refused")
