"""Pinning a symbolic dim: one traced graph served as another entry point (prefill as the one-token decode)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from torch2jax.errors import GraphFormatError, SignatureError
from torch2jax.ir.graph import Graph, GraphInput, GraphOutput, TensorMeta
from torch2jax.ir.structure import LEAF
from torch2jax.lowering import interpreter
from torch2jax.runtime import stablehlo
from torch2jax.runtime.model import Model


def identity_graph() -> Graph:
    """y = x for x: float32[batch, tokens]."""
    return Graph(
        inputs=[GraphInput("x", "user_input", TensorMeta("float32", ["batch", "tokens"]))],
        nodes=[],
        outputs=[GraphOutput("user_output", {"ref": "x"})],
        in_spec={"type": "tuple", "children": [{"type": "tuple", "children": [LEAF]}, {"type": "dict", "keys": [], "children": []}]},
        symbols={"batch": {"min": 1, "max": 8}, "tokens": {"min": 1, "max": 64}},
    )


def test_a_pinned_dim_is_exported_as_its_size_and_checked_by_name():
    graph = identity_graph()
    pinned = graph.with_fixed_dims({"tokens": 1})
    assert pinned.fixed_dims() == {"tokens": 1} and graph.fixed_dims() == {}  # the original is untouched
    (spec,) = stablehlo.input_specs(pinned)
    assert spec.shape[1] == 1 and not isinstance(spec.shape[0], int)  # batch stays symbolic
    (spec,) = stablehlo.input_specs(graph)
    assert not isinstance(spec.shape[1], int)
    model = Model(interpreter.build(pinned), {}, pinned)
    np.testing.assert_array_equal(model(jnp.ones((3, 1))), np.ones((3, 1)))
    with pytest.raises(SignatureError, match=r"'tokens' = 2, outside its declared range \[1, 1\]"):
        model(jnp.ones((3, 2)))


def test_pinning_a_dim_the_graph_does_not_have_names_the_ones_it_has():
    with pytest.raises(GraphFormatError, match=r"cannot pin dims \['seq'\].*\['batch', 'tokens'\]"):
        identity_graph().with_fixed_dims({"seq": 1})
