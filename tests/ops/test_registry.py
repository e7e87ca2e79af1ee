"""The op registry: its contract, and core-opset coverage (every core op lowered or explained)."""

from __future__ import annotations

import pytest

from torch2jax import ops
from torch2jax.diagnose.coverage import NOT_LOWERED, coverage
from torch2jax.ops import registry


def test_every_core_op_is_lowered_or_has_a_documented_reason():
    missing = [op for op, state in coverage().items() if state == "missing"]
    assert not missing, f"{len(missing)} core ATen ops have no lowering and no reason in coverage.NOT_LOWERED: {missing}"


def test_not_lowered_reasons_are_real():
    lowered = ops.registered()
    for op, reason in NOT_LOWERED.items():
        assert op not in lowered, f"{op} is lowered now: remove it from NOT_LOWERED"
        assert len(reason) > 10


def test_duplicate_registration_is_an_error():
    @registry.lowers("t2jtest.dup.default")
    def first(x):
        return x

    try:
        with pytest.raises(ValueError, match="already has a lowering"):
            registry.lowers("t2jtest.dup.default")(lambda x: x)
        ops.register_lowering("t2jtest::dup", lambda x: x + 1, replace=True)
        assert ops.lookup("t2jtest.dup.default").fn(1) == 2
    finally:
        registry._REGISTRY.pop("t2jtest.dup.default")


@pytest.mark.parametrize(
    "given, name",
    [("mylib::op", "mylib.op.default"), ("mylib::op.out", "mylib.op.out"), ("aten.add.Tensor", "aten.add.Tensor")],
)
def test_canonical_names(given, name):
    assert registry.canonical_op_name(given) == name


def test_lowerings_do_not_import_torch():
    import subprocess
    import sys

    code = "import sys, torch2jax.ops as ops; ops.registered(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_op_wrapped_by_with_effects_is_checked_for_a_lowering_too():
    from torch2jax.errors import UnsupportedOpsError
    from torch2jax.ir.graph import Graph, GraphInput, GraphOutput, Node, TensorMeta
    from torch2jax.lowering import interpreter

    graph = Graph(
        inputs=[GraphInput("token", "token", None), GraphInput("x", "user_input", TensorMeta("float32", [2]))],
        nodes=[Node("fx", "higher_order.with_effects", [{"ref": "token"}, {"op": "aten.not_a_real_op.default"}, {"ref": "x"}], {})],
        outputs=[GraphOutput("user_output", {"ref": "x"})],
    )
    with pytest.raises(UnsupportedOpsError, match=r"aten.not_a_real_op.default \(node fx\)"):
        interpreter.check_supported(graph)
