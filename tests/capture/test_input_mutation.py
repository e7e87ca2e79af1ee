"""forward() writing into its inputs: the writes are dropped with a warning naming each input and line, the outputs
are torch's; a forward whose only effect is such a write is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torch2jax
from torch2jax import ExportError, InputMutationWarning


class Prompter(torch.nn.Module):
    """Adds a learned border to its input in place and reads the input again afterwards (as TVP's prompter does)."""

    def __init__(self):
        super().__init__()
        self.pad = torch.nn.Parameter(torch.randn(1, 3, 2, 8))

    def forward(self, pixels):
        pixels[:, :, :2, :] += self.pad
        return pixels.mean(dim=1), pixels * 2


class FillsItsArgument(torch.nn.Module):
    def forward(self, out, x):
        out.copy_(x * 3)


def test_writes_into_an_input_are_dropped_with_a_warning_and_outputs_match():
    module = Prompter()
    pixels = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = module(pixels.clone())
    with pytest.warns(InputMutationWarning, match=r"input 'pixels', at pixels\[:, :, :2, :\] \+= self.pad"):
        model = torch2jax.convert(module, (pixels.clone(),))
    given = pixels.numpy().copy()
    got = model(given)
    for want, out in zip(expected, got):
        np.testing.assert_allclose(np.asarray(out), want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(given, pixels.numpy())  # the caller's array keeps its values
    assert all(o.kind != "user_input_mutation" for o in model.graph.outputs)


def test_a_forward_whose_only_effect_is_a_write_into_an_input_is_refused():
    with pytest.raises(ExportError, match=r"returns nothing and modifies its input\(s\) in place(.|\n)*input 'out'"):
        torch2jax.convert(FillsItsArgument(), (torch.zeros(3), torch.ones(3)))


def test_verification_gives_each_run_its_own_copy_of_the_inputs():
    """torch's forward writes into the example; the converted model and the float64 reference must see the values the
    caller gave, else the comparison measures the write, not the conversion."""
    from torch2jax.diagnose.verify import verify

    module = Prompter()
    pixels = torch.randn(2, 3, 8, 8)
    with pytest.warns(InputMutationWarning):
        model = torch2jax.convert(module, (pixels.clone(),))
    report = verify(module, model, (pixels,), {})
    assert report.passed and report.max_abs < 1e-5
    assert not any(o.note for r in report.runs for o in r.outputs), "passed within tolerance, not as ill-conditioned"
