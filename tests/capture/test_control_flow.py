"""torch.cond / while_loop / scan / map lower to lax control flow, with subgraphs in the portable graph."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch._higher_order_ops import map as torch_map

import torch2jax
from torch2jax.errors import GraphFormatError
from torch2jax.ir.graph import Graph

from ..conftest import load_sample
from ..helpers import cli, max_err, torch_out

SAMPLE = load_sample("control_flow")


def _rnn():
    torch.manual_seed(0)
    return SAMPLE.GatedScanRNN().eval()


def _errors(got, want) -> list[float]:
    return [max_err(g, w) for g, w in zip(got, want)]


def test_scan_with_a_nested_cond_matches_torch_through_the_artifact(tmp_path):
    module = _rnn()
    model = torch2jax.convert(module, SAMPLE.example_inputs(), dynamic_shapes=SAMPLE.dynamic_shapes())
    assert set(model.graph.subgraphs) == {"scan_combine_graph_0"}
    assert model.graph.subgraphs["scan_combine_graph_0"].subgraphs, "the cond's branches nest inside the scan body"
    torch2jax.save(model, tmp_path / "rnn")
    # a mix of steps with positive and negative means, so both branches run, at another time and batch size
    x = torch.randn(9, 5, 8) + torch.linspace(-1, 1, 9)[:, None, None]
    want = torch_out(module, x)
    for loaded in (torch2jax.load(tmp_path / "rnn"), torch2jax.load(tmp_path / "rnn", from_graph=True)):
        assert max(_errors(loaded(x.numpy()), want)) < 1e-5
    assert torch2jax.load(tmp_path / "rnn").manifest["vjp_order"] == 1


def test_grads_through_scan_and_cond_match_torch_autograd():
    module = _rnn()
    x = torch.randn(7, 3, 8) + torch.linspace(-1, 1, 7)[:, None, None]
    model = torch2jax.convert(module, (x,))

    def loss(params, xs):
        out, per_step = model.apply(params, xs)
        return jnp.sum(out**2) + jnp.sum(jnp.sin(per_step))

    grads, grad_x = jax.grad(loss, argnums=(0, 1))(model.params, x.numpy())
    xt = x.clone().requires_grad_(True)
    out, per_step = module(xt)
    (out.pow(2).sum() + per_step.sin().sum()).backward()
    for name, param in module.named_parameters():
        assert max_err(grads[name], param.grad) < 1e-4, name
    assert max_err(grad_x, xt.grad) < 1e-4


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x.cos() * 2, (x,))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_takes_the_branch_torch_takes(sign):
    module = Branchy().eval()
    model = torch2jax.convert(module, (torch.rand(3, 4),), dynamic_shapes={"x": {0: "batch"}})
    x = sign * torch.rand(5, 4)
    assert max_err(model(x.numpy()), torch_out(module, x)) < 1e-6


def test_while_loop_saves_without_a_vjp_and_says_so(tmp_path):
    module = SAMPLE.Refine()
    model = torch2jax.convert(module, (torch.randn(3),), dynamic_shapes={"x": {0: "n"}})
    with pytest.warns(UserWarning, match="cannot be reverse-differentiated"):
        torch2jax.save(model, tmp_path / "refine")
    loaded = torch2jax.load(tmp_path / "refine")
    assert loaded.manifest["vjp_order"] == 0
    x = torch.full((5,), 0.3)
    steps, out = loaded(x.numpy())
    want_steps, want_out = torch_out(module, x)
    assert int(steps) == int(want_steps) > 1
    assert max_err(out, want_out) == 0


def test_map_over_the_leading_dim():
    class Mapped(torch.nn.Module):
        def forward(self, xs, y):
            return torch_map(lambda x, y: x.sin() @ y, xs, y)

    module = Mapped()
    xs, y = torch.randn(6, 3, 4), torch.randn(4, 2)
    model = torch2jax.convert(module, (xs, y))
    assert max_err(model(xs.numpy(), y.numpy()), torch_out(module, xs, y)) < 1e-5


def test_cli_converts_and_verifies_the_control_flow_sample(tmp_path):
    with warnings.catch_warnings():
        result = cli("convert", "sample_models/control_flow.py:GatedScanRNN", "--out", str(tmp_path / "rnn"), "-q")
    assert result.returncode == 0, result.stderr
    assert "ok  second size (time=7, batch=4)" in result.stdout


def test_a_missing_subgraph_is_a_format_error():
    module = Branchy().eval()
    data = torch2jax.convert(module, (torch.rand(3, 4),)).graph.to_json()
    data["subgraphs"] = {}
    with pytest.raises(GraphFormatError, match="uses subgraph"):
        Graph.from_json(data)


def test_while_loop_counter_keeps_the_integer_dtype():
    # a carry that starts as a python-level int tensor keeps torch's dtype (int64 -> int32 without x64)
    module = SAMPLE.Refine()
    steps, _ = torch2jax.convert(module, (torch.randn(3),))(np.full(3, 50.0, np.float32))
    assert np.asarray(steps).dtype == np.int32 and int(steps) == 1
