"""bfloat16 ops whose results differ from torch's beyond bfloat16's tolerance on many OpInfo samples,
because torch rounds to bfloat16 at every step (grid coordinates, products, window sums) while the
lowerings compute in float32 and round once. On those samples the OpInfo harness accepts ours only when
it is as close to the float64 result as torch's; this pins the stronger fact measured for the issue:
on every sample ours is at least as close as torch's, in max and in mean error.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from torch2jax.capture.torch_arrays import to_numpy

from .opinfo_harness import _in_float64, case_id, compare, convert_op_sample, leaves, prepare

CASES = ["grid_sampler_2d", "grid_sampler_3d", "cross", "linalg.cross", "nn.functional.adaptive_avg_pool3d"]
SAMPLES = 8  # per op (cross has 3): all of them would add ~1 min for the same answer


@pytest.mark.parametrize("case", CASES)
def test_bfloat16_result_is_at_least_as_close_to_float64_as_torchs(case):
    opinfo = next(o for o in op_db if case_id(o) == case)
    torch.manual_seed(0)
    differing = 0
    for sample in itertools.islice(opinfo.sample_inputs("cpu", torch.bfloat16, requires_grad=False), SAMPLES):
        prepared, model = convert_op_sample(opinfo, sample, prepare(opinfo, sample))
        got = model(*[to_numpy(t) for t in prepared.inputs])
        try:
            compare(prepared.expected, got, "output")
            continue
        except AssertionError:
            differing += 1
        module, wide = _in_float64(prepared)
        with torch.no_grad():
            exact = leaves(module(*wide))
        for want, ours, truth in zip(leaves(prepared.expected), leaves(got), exact):
            truth = truth.numpy()
            ours_error = np.abs(np.asarray(ours).astype(np.float64) - truth)
            torch_error = np.abs(want.double().numpy() - truth)
            assert ours_error.max() <= torch_error.max(), (case, ours_error.max(), torch_error.max())
            assert ours_error.mean() <= torch_error.mean(), (case, ours_error.mean(), torch_error.mean())
    assert differing, f"{case}: no sample differs from torch's bfloat16 result any more: drop it from this test"
