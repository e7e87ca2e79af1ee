"""verify's float64 judgement: a float32 output beyond tolerance passes only when it is as close to torch's float64
result as torch's own float32 one (an ill-conditioned model), never when it is far from both."""

from __future__ import annotations

import torch

from torch2jax.diagnose.verify import OutputCheck, Run, _check_output, _judge_against_float64


class Triple(torch.nn.Module):
    def forward(self, x):
        return x * 3


def _judged(torch_error: float, our_error: float) -> OutputCheck:
    x = torch.linspace(-1, 1, 64, dtype=torch.float32).reshape(8, 8)
    exact = x.double() * 3
    noise = torch.sin(torch.arange(64, dtype=torch.float64).reshape(8, 8))  # a fixed, sign-changing pattern
    want = (exact + torch_error * noise).float()  # torch's float32 result, off the exact one
    have = (exact + our_error * noise.flip(0)).float()
    run = Run("example inputs", [_check_output("out", want, have)])
    assert not run.passed  # beyond float32 tolerance from torch's result
    _judge_against_float64(run, Triple(), (x,), {}, [want], [have])
    return run.outputs[0]


def test_an_output_nearer_float64_than_torchs_float32_passes_with_the_reason():
    check = _judged(torch_error=1e-3, our_error=1e-4)
    assert check.passed and "as close to torch's float64 result as torch's float32 one" in check.note


def test_an_output_far_from_float64_still_fails():
    check = _judged(torch_error=1e-3, our_error=1e-2)
    assert not check.passed and check.note == ""
