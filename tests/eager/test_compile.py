"""torch.compile(backend=torch2jax): training with torch.optim, buffers, randomness, dynamic shapes,
ops without a lowering, each compared with torch eager running the same steps."""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from torch2jax.eager.dynamo_backend import backend

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class ConvNet(torch.nn.Module):
    """conv + BatchNorm (running statistics are buffer mutations) + pooling + a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        h = F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        return self.head(h.flatten(1))


class Attention(torch.nn.Module):
    """A causal self-attention block: its backward has CPU SDPA's backward op, which has no decomposition.

    No bias on q/k/v: a key bias has an exact zero gradient (softmax ignores a shift per query), and
    AdamW turns round-off-sized gradients into full-sized steps, so no two correct runs would agree on it.
    """

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48, bias=False)
        self.norm = torch.nn.LayerNorm(16)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).view(x.shape[0], x.shape[1], 3, 2, 8).permute(2, 0, 3, 1, 4)
        return self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)) + x


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))


CASES = {
    "mlp": (mlp, lambda: torch.randn(6, 12)),
    "conv_batch_norm": (ConvNet, lambda: torch.randn(4, 3, 8, 8)),
    "attention": (Attention, lambda: torch.randn(2, 5, 16)),
}
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
}


def _train(module, call, make_optimizer, batches):
    optimizer = make_optimizer(module.parameters())
    losses = []
    for x in batches:
        optimizer.zero_grad()
        loss = call(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_training_steps_match_eager(name, optimizer):
    """Three steps of loss.backward() + optimizer.step() outside the compiled region: same params as eager."""
    torch.manual_seed(0)
    make, data = CASES[name]
    ours = make().train()
    reference = copy.deepcopy(ours)
    batches = [data() for _ in range(3)]
    got = _train(ours, torch.compile(ours, backend=backend), OPTIMIZERS[optimizer], batches)
    want = _train(reference, reference, OPTIMIZERS[optimizer], batches)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for (key, value), (_, expected) in zip(ours.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(value, expected, rtol=1e-4, atol=1e-5, msg=lambda m, key=key: f"{key}: {m}")
    assert counters["aot_autograd"]["ok"] >= 1, "the backend did not compile a graph"


def test_step_inside_compiled_region_matches_eager():
    """backward() and optimizer.step() inside the compiled function."""
    torch.manual_seed(0)
    ours = mlp()
    reference = copy.deepcopy(ours)
    batches = [torch.randn(6, 12) for _ in range(3)]

    def step(module, optimizer, x):
        optimizer.zero_grad()
        loss = module(x).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    compiled = torch.compile(step, backend=backend)
    for x in batches:
        compiled(ours, opt_ours, x)
        step(reference, opt_ref, x)
    for a, b in zip(ours.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_batch_norm_running_stats_written_back():
    torch.manual_seed(0)
    ours = ConvNet().train()
    reference = copy.deepcopy(ours)
    compiled = torch.compile(ours, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 3, 8, 8)
            torch.testing.assert_close(compiled(x), reference(x), rtol=1e-5, atol=1e-5)
    assert int(ours.bn.num_batches_tracked) == 3
    assert not torch.equal(ours.bn.running_mean, torch.zeros(8)), "running_mean never changed"
    torch.testing.assert_close(ours.bn.running_mean, reference.bn.running_mean)
    torch.testing.assert_close(ours.bn.running_var, reference.bn.running_var)


def test_dropout_differs_per_call_and_follows_the_seed():
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Dropout(0.5)).train()
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    first, second = compiled(x), compiled(x)
    assert not torch.equal(first, second), "two calls drew the same dropout mask"
    kept = first != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(first[kept], (model[0](x) * 2)[kept])
    torch.manual_seed(1)
    assert torch.equal(compiled(x), first), "the same torch seed gave another mask"


def test_parameters_cross_once_per_version(monkeypatch):
    """A parameter becomes a JAX array on its first call and again only after a write (an optimizer step)."""
    from torch2jax.eager import handoff

    shared_calls = []
    original = handoff.shared
    monkeypatch.setattr(handoff, "shared", lambda t: shared_calls.append(tuple(t.shape)) or original(t))
    torch.manual_seed(0)
    model = mlp()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(6, 12))
    weights = {tuple(p.shape) for p in model.parameters()}
    assert sorted(shared_calls) == sorted(tuple(p.shape) for p in model.parameters()), shared_calls
    shared_calls.clear()
    with torch.no_grad():
        model[0].weight.mul_(2)  # a write bumps the version: that weight crosses again, the others do not
        torch.testing.assert_close(compiled(x := torch.randn(6, 12)), model(x))
    assert shared_calls == [tuple(model[0].weight.shape)] and shared_calls[0] in weights


def test_buffers_cross_once_not_per_call(monkeypatch):
    """BatchNorm's running statistics are state like the weights: shared once, not copied in on every call
    (only the input, new on every call, goes through the per-call path)."""
    from torch2jax.eager import handoff

    per_call = []
    original = handoff.per_call
    monkeypatch.setattr(handoff, "per_call", lambda t: per_call.append(tuple(t.shape)) or original(t))
    torch.manual_seed(0)
    model = ConvNet().eval()
    compiled = torch.compile(model, backend=backend)
    inputs = [torch.randn(4, 3, 8, 8) for _ in range(3)]
    with torch.no_grad():
        for x in inputs:
            torch.testing.assert_close(compiled(x), model(x))
    assert per_call == [tuple(x.shape) for x in inputs], per_call


def test_dynamic_batch_compiles_one_graph():
    torch.manual_seed(0)
    model = mlp()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for batch in (2, 3, 7):
        x = torch.randn(batch, 12)
        torch.testing.assert_close(compiled(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1
    assert counters["aot_autograd"]["total"] == 1


@pytest.mark.parametrize("mask", ["causal", "additive"])
def test_cpu_attention_kernel_matches_torch(mask):
    """The CPU flash kernel the backend keeps whole: its output and its logsumexp, as torch computes them."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8)
    bias = torch.randn(5, 6) if mask == "additive" else None

    def attend(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, mask == "causal", attn_mask=bias, scale=0.3)

    got, want = torch.compile(attend, backend=backend)(q, k, v), attend(q, k, v)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


torch.library.define("t2jtest::shifted", "(Tensor x) -> Tensor")


@torch.library.impl("t2jtest::shifted", "CPU")
def _shifted(x):
    return x + 3


@torch.library.register_fake("t2jtest::shifted")
def _shifted_fake(x):
    return torch.empty_like(x)


class WithCustomOp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x):
        return torch.ops.t2jtest.shifted(self.linear(x).sin()).cos() * 2


def test_op_without_lowering_runs_in_torch_with_a_warning():
    from torch2jax import ops

    assert "t2jtest.shifted.default" not in ops.registered()
    torch.manual_seed(0)
    model = WithCustomOp()
    x = torch.randn(3, 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(model, backend=backend)
        got = compiled(x)
        compiled(x)
    torch.testing.assert_close(got, model(x))
    ours = [str(w.message) for w in caught if "torch2jax" in str(w.message)]
    assert len(ours) == 1, ours
    assert "t2jtest.shifted.default" in ours[0] and "test_compile.py" in ours[0] and "torch.ops.t2jtest.shifted" in ours[0]


def test_value_dependent_shapes_run_in_torch_between_jax_parts():
    """Export refuses these; compiled, they run in torch (shape from values) and the rest in JAX."""

    def masked(x):
        y = torch.sin(x) * 3
        kept = y[y > 0]
        return kept.sum() + torch.nonzero(y < -1).shape[0], y.cos()

    x = torch.randn(4, 6)
    with warnings.catch_warnings(record=True) as caught, torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        warnings.simplefilter("always")
        got = torch.compile(masked, backend=backend, fullgraph=True)(x)
    torch.testing.assert_close(got, masked(x))
    assert counters["torch2jax_value_shaped"], "nothing ran in torch: the graph should hold value-dependent shapes"
    ours = [str(w.message) for w in caught if "torch2jax" in str(w.message)]
    assert ours and all("depends on tensor values" in m for m in ours), ours


def test_pyproject_declares_the_backend_entry_point():
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["torch_dynamo_backends"]
    module, _, name = declared["torch2jax"].partition(":")
    assert getattr(importlib.import_module(module), name) is backend


def test_installed_entry_point_reaches_the_backend():
    """`backend="torch2jax"` with no import; needs the package installed from this pyproject.toml."""
    installed = importlib.metadata.distribution("torch2jax-aot")
    if not any(p.group == "torch_dynamo_backends" for p in installed.entry_points):
        pytest.skip("the installed package metadata predates the entry point in pyproject.toml: reinstall (make install)")
    assert "torch2jax" in torch._dynamo.list_backends()
    torch.manual_seed(0)
    model = mlp()
    x = torch.randn(3, 12)
    torch.testing.assert_close(torch.compile(model, backend="torch2jax")(x), model(x))
    assert counters["aot_autograd"]["ok"] == 1, "the name did not reach this backend"


def test_bfloat16_gradients_match_eager():
    """bfloat16 forward and backward (its weight gradients are the dots XLA CPU needs widened), within
    bfloat16's tolerance of torch's own bfloat16 run."""
    torch.manual_seed(0)
    ours = mlp().to(torch.bfloat16)
    reference = copy.deepcopy(ours)
    x = torch.randn(6, 12, dtype=torch.bfloat16)
    torch.compile(ours, backend=backend)(x).float().square().sum().backward()
    reference(x).float().square().sum().backward()
    for a, b in zip(ours.parameters(), reference.parameters()):
        assert a.grad.dtype == torch.bfloat16
        torch.testing.assert_close(a.grad, b.grad)
