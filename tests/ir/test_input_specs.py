"""The --input spec parser."""

from __future__ import annotations

import numpy as np
import pytest

from torch2jax.errors import InputSpecError
from torch2jax.ir import input_specs as specs


def test_static_and_symbolic_dims():
    spec = specs.parse("x=float32[batch,3,224,224]")
    assert (spec.name, spec.dtype, spec.dims) == ("x", "float32", ["batch", 3, 224, 224])
    assert spec.example_shape({}) == (2, 3, 224, 224)
    assert spec.dynamic_dims() == {0: "batch"}


def test_example_sizes_and_value_ranges():
    spec = specs.parse("ids=int64[batch=3, seq=7](5..9)")
    assert spec.sizes == {"batch": 3, "seq": 7}
    values = specs.example_array(spec, specs.merged_sizes([spec]), np.random.default_rng(0))
    assert values.shape == (3, 7) and values.dtype == np.int64
    assert values.min() >= 5 and values.max() < 9


def test_file_inputs():
    item = specs.parse("x=data/x.npy")
    assert isinstance(item, specs.FileInput) and str(item.path) == "data/x.npy"


@pytest.mark.parametrize(
    "text, problem",
    [
        ("float32[2,3]", "NAME="),
        ("x=float33[2]", "unknown dtype"),
        ("x=float32[2,-3]", "bad dim"),
        ("x=float32(2,3)", "expected NAME=DTYPE"),
        ("x=int32[2](5..1)", "empty value range"),
    ],
)
def test_bad_specs_name_the_problem_and_the_forms(text, problem):
    with pytest.raises(InputSpecError, match="Accepted forms") as info:
        specs.parse(text)
    assert problem in str(info.value)


def test_conflicting_sizes():
    with pytest.raises(InputSpecError, match="two example sizes"):
        specs.merged_sizes([specs.parse("a=float32[n=2]"), specs.parse("b=float32[n=3]")])
