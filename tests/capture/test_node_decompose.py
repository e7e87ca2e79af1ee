"""Decomposition node by node (capture/node_decompose.py) gives what torch's whole retrace gives, and leaves to
that retrace every program it cannot handle exactly."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from torch.export import Dim

from torch2jax.capture import decomposition, node_decompose


class Block(torch.nn.Module):
    """The high-level ops transformer and vision models export with: linear, layer_norm, dropout, to, reshape,
    conv2d, batch_norm, softmax, matmul."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.norm = torch.nn.LayerNorm(16)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, image, x):
        y = self.bn(self.conv(image)).reshape(image.shape[0], -1)[:, :16]
        for layer in self.layers:
            x = self.drop(torch.nn.functional.gelu(layer(self.norm(x))))
        scores = (x @ x.transpose(-1, -2)).softmax(-1).to(torch.float64).to(torch.float32)
        return scores @ x + y.unsqueeze(1)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(2, 3, 4, 4), torch.randn(2, 5, 16)


def _ops(ep) -> collections.Counter:
    return collections.Counter(str(n.target) for n in ep.graph.nodes if n.op == "call_function")


def test_a_plain_program_decomposes_node_by_node_as_the_retrace_does(monkeypatch):
    model, inputs = Block().eval(), _inputs()
    ep = torch.export.export(model, inputs)
    before = str(ep.graph)
    retraced = ep.run_decompositions(decomposition.decompositions())
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", _refused)
    by_node = decomposition.decompose(ep)
    assert str(ep.graph) == before, "the exported program given is left as it was"
    assert _ops(by_node) == _ops(retraced)  # batch_norm to its no-training form, as the retrace's dispatcher does
    torch.testing.assert_close(by_node.module()(*inputs), model(*inputs), rtol=0, atol=0)


def test_identical_ops_on_identical_shapes_are_traced_once(monkeypatch):
    traced = []
    original = node_decompose._trace_alone
    monkeypatch.setattr(node_decompose, "_trace_alone", lambda node, *rest: traced.append(str(node.target)) or original(node, *rest))
    decomposition.decompose(torch.export.export(Block().eval(), _inputs()))
    assert traced.count("aten.linear.default") == 1 and traced.count("aten.layer_norm.default") == 1


class InPlaceOnFresh(torch.nn.Module):
    """A residual added in place, a mask filled in place, an index_put on zeros: new tensors, viewed by nothing."""

    def forward(self, x):
        h = torch.nn.functional.linear(x, torch.ones(4, 4))
        before = h * 1
        h += x
        h.masked_fill_(x > 1, 0.0)
        out = torch.zeros(3, 4)
        out.index_put_((torch.tensor([0, 2]),), h[:2], accumulate=True)
        return h, before, out


def test_in_place_ops_on_new_tensors_are_made_functional(monkeypatch):
    x = torch.randn(3, 4) * 2
    ep = torch.export.export(InPlaceOnFresh(), (x,))
    assert any(str(n.target).endswith("_.Tensor") or "_.Scalar" in str(n.target) for n in ep.graph.nodes)
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", _refused)
    decomposed = decomposition.decompose(ep)
    assert not any(n.target._schema.is_mutable for n in decomposed.graph.nodes if isinstance(n.target, torch._ops.OpOverload))
    torch.testing.assert_close(decomposed.module()(x), InPlaceOnFresh()(x), rtol=0, atol=0)


class InPlaceThroughHighLevelAlias(torch.nn.Module):
    """type_as and to return their input when the dtype already matches, which their schemas do not say: the write
    must reach what they returned."""

    def forward(self, x):
        h = x * 2
        same = h.type_as(x)
        also = h.to(torch.float32)
        h.add_(1)
        return same, also


def test_in_place_ops_reach_tensors_a_high_level_op_returned_as_is(monkeypatch):
    x = torch.randn(3, 4)
    ep = torch.export.export(InPlaceThroughHighLevelAlias(), (x,))
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", _refused)
    decomposed = decomposition.decompose(ep)
    torch.testing.assert_close(decomposed.module()(x), InPlaceThroughHighLevelAlias()(x), rtol=0, atol=0)


class InPlaceOnBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)
        return torch.nn.functional.linear(x, torch.eye(4)) * self.count


class InPlaceOnView(torch.nn.Module):
    def forward(self, x):
        y = torch.nn.functional.layer_norm(x, (4,))
        y[:, 0].mul_(2)
        return y


class InPlaceWidening(torch.nn.Module):
    def forward(self, x):
        y = torch.nn.functional.layer_norm(x, (4,))
        y.add_(x.double())  # computed in float64, kept float32: not what add(y, x.double()) gives
        return y


class Dynamic(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.layer_norm(x, (4,))


@pytest.mark.parametrize(("model", "dims"), [(InPlaceOnBuffer(), None), (InPlaceOnView(), None), (InPlaceWidening(), None),
                                             (Dynamic(), ({0: Dim("batch", min=2, max=64)},))],
                         ids=["mutated-buffer", "mutated-view", "widening-in-place", "dynamic-shape"])
def test_programs_that_need_functionalization_or_symbols_are_retraced(model, dims, monkeypatch):
    x = torch.randn(3, 4)
    expected = copy.deepcopy(model)(x)  # before anything runs the model (its buffer counts calls)
    ep = torch.export.export(model, (x,), dynamic_shapes=dims)
    assert node_decompose.decompose_nodes(ep, decomposition.decompositions(), lambda _op: True) is None
    calls = []
    original = torch.export.ExportedProgram.run_decompositions
    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    decomposed = decomposition.decompose(ep)
    assert calls == [1]
    assert "aten.layer_norm.default" not in _ops(decomposed)
    torch.testing.assert_close(decomposed.module()(x), expected, rtol=0, atol=0)


def _refused(*_args, **_kwargs):
    raise AssertionError("a plain program is decomposed node by node, without torch's whole retrace")
