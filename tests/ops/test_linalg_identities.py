"""Every OpInfo sample of the decompositions whose factors torch defines only up to sign or phase.

The default sweep (test_opinfo.py) runs one sample per op; these ops get every sample here, compared
as comparisons.py says (values equal torch's, factors rebuild the input, are orthonormal, and equal
torch's up to sign), since their lowerings have the most code paths (full/reduced, batched, empty).
"""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from .opinfo_harness import case_id, convert_sample, prepare, run_and_compare

OPS = ("linalg.svd", "svd", "linalg.eigh", "linalg.eig", "matrix_exp", "pca_lowrank", "svd_lowrank")


def _samples():
    """One sample per kind of input (batched or not, empty or not, wide or tall) and arguments."""
    for opinfo in op_db:
        if case_id(opinfo) not in OPS:
            continue
        torch.manual_seed(0)
        seen = set()
        for i, sample in enumerate(opinfo.sample_inputs("cpu", torch.float32)):
            shape = tuple(sample.input.shape)
            kind = (len(shape), 0 in shape, shape[-2] < shape[-1] if len(shape) > 1 else None)
            key = (kind, repr(sample.args), repr(sorted(sample.kwargs.items())))
            if key not in seen:
                seen.add(key)
                yield pytest.param(opinfo, sample, id=f"{case_id(opinfo)}-{i}-{tuple(sample.input.shape)}")


@pytest.mark.parametrize("opinfo,sample", list(_samples()))
def test_every_sample(opinfo, sample):
    prepared = prepare(opinfo, sample)
    run_and_compare(prepared, convert_sample(prepared))
