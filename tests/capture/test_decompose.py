"""decomposition.decompose keeps torch's list of CompositeImplicitAutograd ops between calls (torch makes it afresh for
every table and every decomposition), and makes it again once a custom op has been registered since."""

from __future__ import annotations

import torch
import torch.export.exported_program as exported_program
from torch._export import utils as export_utils

from torch2jax.capture import decomposition


def test_the_op_list_is_kept_until_a_custom_op_is_registered(monkeypatch):
    calls = []
    original = export_utils._collect_all_valid_cia_ops
    monkeypatch.setattr(export_utils, "_collect_all_valid_cia_ops", lambda: calls.append(1) or original())
    monkeypatch.setattr(decomposition, "_cia_memo", {})
    with decomposition._cia_ops_remembered():
        first = exported_program._collect_all_valid_cia_ops()
        assert exported_program._collect_all_valid_cia_ops() == first and len(calls) == 1
        library = torch.library.Library("t2j_decompose_test", "DEF")
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x + x, "CompositeImplicitAutograd")
        again = exported_program._collect_all_valid_cia_ops()
        assert len(calls) == 2 and torch.ops.t2j_decompose_test.twice.default in again - first
    assert exported_program._collect_all_valid_cia_ops is original  # torch's own outside a decomposition


def test_a_model_decomposes_the_same_with_the_list_kept():
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x).softmax(-1) @ x.T

    ep = torch.export.export(Model(), (torch.randn(3, 4),))
    with decomposition._cia_ops_remembered():
        kept = ep.run_decompositions(decomposition.decompositions())
    fresh = ep.run_decompositions(decomposition.decompositions())
    assert str(kept.graph) == str(fresh.graph)
