"""Matmul rewrites keep torch's values and gradients: a weight broadcast over a bmm as one matmul,
recurrent and linear products that read the weight as stored, gathered expert weights computed densely,
and every pass stepping aside for an op whose lowering the user replaced."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch2jax
from torch2jax import ops
from torch2jax.lowering import passes
from torch2jax.ops import linalg
from torch2jax.ops.linalg import LINEAR_WEIGHT_FIRST_ROWS

from ..helpers import as_jax, hlo_computations, max_err

# --- bmm of a weight broadcast over the batch: one matmul ---


class SequenceProjection(nn.Module):
    """x @ w.T over a whole (steps, batch, features) sequence in the form torch's decomposition gives
    an LSTM's input projection, next to a bmm of a 3-d operand expanded from size 1 (left alone)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 6))
        self.batched = nn.Parameter(torch.randn(1, 6, 5))

    def forward(self, x):
        shared = torch.bmm(x, self.w.t().expand(x.shape[0], 6, 12))
        per_step = torch.bmm(x, self.batched.expand(x.shape[0], 6, 5))
        return shared, per_step


def test_bmm_of_a_broadcast_weight_becomes_one_matmul():
    torch.manual_seed(0)
    module = SequenceProjection()
    x = torch.randn(7, 3, 6)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {0: "steps"}})
    optimized = passes.optimize(model.graph)
    # bmm(x, expand(w.T)) -> matmul(x, w.T) -> linear(x, w): one product reading w as stored (no per-call transpose)
    assert sum(node.op == passes.LINEAR for node in optimized.nodes) == 1, "the 2-d weight's bmm is rewritten"
    assert not any(node.op in (passes.MATMUL, passes.PERMUTE) for node in optimized.nodes)
    assert sum(node.op == passes.BMM for node in optimized.nodes) == 1, "a 3-d operand expanded from size 1 is left alone"
    with torch.no_grad():
        for steps in (7, 4):
            x = torch.randn(steps, 3, 6)
            for got, want in zip(model(x.numpy()), module(x)):
                assert max_err(got, want) < 1e-5
    grads = jax.grad(lambda p: jnp.sum(model.apply(p, x.numpy())[0] ** 2))(model.params)
    (module(x)[0] ** 2).sum().backward()
    assert max_err(grads["w"], module.w.grad) < 1e-4


def test_lstm_matches_torch():
    torch.manual_seed(0)
    module = nn.LSTM(6, 8, num_layers=2, bidirectional=True, batch_first=True).eval()
    x = torch.randn(3, 5, 6)
    model = torch2jax.convert(module, (x,))
    assert any(node.op == passes.BMM for node in model.graph.nodes), "torch's decomposition expands the weights"
    optimized = passes.optimize(model.graph)
    assert not any(node.op == passes.BMM for node in optimized.nodes), "no copies of the weights"
    read = [node.args[1]["ref"] for node in optimized.nodes if node.op == passes.LINEAR]
    assert sum(ref.startswith("p_weight_hh") for ref in read) == 20, "w_hh at each of 5 steps per layer and direction"
    transposed = [node.args[0].get("ref", "") for node in optimized.nodes if node.op == passes.PERMUTE]
    assert not any(ref.startswith("p_weight_hh") for ref in transposed), "w_hh is read as stored at every step"
    with torch.no_grad():
        want, (h, c) = module(x)
    got, (gh, gc) = model(x.numpy())
    assert max(max_err(got, want), max_err(gh, h), max_err(gc, c)) < 1e-5


def test_bmm_rewrite_keeps_a_view_that_something_else_reads():
    class SharedView(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(6, 4))

        def forward(self, x):
            expanded = self.w.expand(x.shape[0], 6, 4).reshape(x.shape[0], 6, 4)
            return torch.bmm(x, expanded), expanded.sum()

    torch.manual_seed(0)
    module = SharedView()
    x = torch.randn(3, 5, 6)
    model = torch2jax.convert(module, (x,))
    optimized = passes.optimize(model.graph)
    names = {node.name for node in optimized.nodes} | {i.name for i in optimized.inputs}
    for node in optimized.nodes:
        refs = [a["ref"] for a in node.args if isinstance(a, dict) and "ref" in a]
        assert all(ref in names for ref in refs), f"{node.name} reads a dropped node"
    with torch.no_grad():
        for got, want in zip(model(x.numpy()), module(x)):
            assert max_err(got, want) < 1e-5


class Recurrence(nn.Module):
    """h <- tanh(x_t + h @ w.T), unrolled: a new transpose of w at every step, as torch's RNN
    decomposition writes it; `head` is transposed for one matmul and `probe` also read elsewhere."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.w = nn.Parameter(torch.randn(dim, dim) / dim**0.5)
        self.head = nn.Parameter(torch.randn(3, dim))
        self.probe = nn.Parameter(torch.randn(dim, dim))

    def forward(self, x):
        h = torch.zeros(x.shape[1], x.shape[2])
        for t in range(x.shape[0]):
            h = torch.tanh(x[t] + h @ self.w.t())
        seen = self.probe.t()
        return h @ self.head.t(), (h @ seen) @ seen + seen.sum()


def test_recurrent_matmuls_read_the_weight_as_stored(tmp_path):
    torch.manual_seed(0)
    module = Recurrence()
    x = torch.randn(5, 4, 8)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {1: "batch"}})
    optimized = passes.optimize(model.graph)
    read = sorted(node.args[1]["ref"] for node in optimized.nodes if node.op == passes.LINEAR)
    assert read == ["p_head"] + ["p_probe"] * 2 + ["p_w"] * 5
    transposed = [node.args[0]["ref"] for node in optimized.nodes if node.op == passes.PERMUTE]
    assert transposed == ["p_probe"], "probe's transpose is also summed; no other transpose is left"
    with torch.no_grad():
        for batch in (4, 2):
            x = torch.randn(5, batch, 8)
            assert all(max_err(got, want) < 1e-5 for got, want in zip(model(x.numpy()), module(x)))
    hlo = jax.jit(model.apply).lower(model.params, x.numpy()).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert len(dots) == 8 and all(re.search(r"= f32\[[38],2\]", line) for line in dots), (
        f"at 2 rows every dot puts the weight first (features x batch): {dots}")
    grads = jax.grad(lambda p: sum(jnp.sum(o ** 2) for o in model.apply(p, x.numpy())))(model.params)
    sum((o ** 2).sum() for o in module(x)).backward()
    for name in ("w", "head", "probe"):  # float32 rounding at the gradient's scale (probe's reach 200)
        want = dict(module.named_parameters())[name].grad
        assert max_err(grads[name], want) < 1e-6 * float(want.abs().max())
    torch2jax.save(model, tmp_path / "recurrence")
    loaded = torch2jax.load(tmp_path / "recurrence")
    x = torch.randn(5, 3, 8)
    with torch.no_grad():
        assert all(max_err(got, want) < 1e-5 for got, want in zip(loaded(x.numpy()), module(x)))


class Dense(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(24, 40)
        self.proj = nn.Linear(40, 16, bias=False)

    def forward(self, x):
        return self.proj(torch.relu(self.fc(x)))


@pytest.mark.parametrize("rows", [1, 8, LINEAR_WEIGHT_FIRST_ROWS, LINEAR_WEIGHT_FIRST_ROWS + 1, 200])
def test_linear_puts_the_weight_first_at_few_rows(rows):
    torch.manual_seed(0)
    module = Dense()
    x = torch.randn(rows, 24, requires_grad=True)
    model = torch2jax.convert(module, (x.detach(),))
    ops = [node.op for node in passes.optimize(model.graph).nodes]
    assert ops == [passes.LINEAR, "aten.relu.default", passes.LINEAR], "no transpose, mm or addmm left"
    got = jax.jit(model.apply)(model.params, as_jax(x))
    want = module(x)
    assert max_err(got, want) < 1e-5
    loss = lambda p, xj: jnp.sum(jnp.sin(model.apply(p, xj)))  # noqa: E731
    grads, grad_x = jax.grad(loss, argnums=(0, 1))(model.params, as_jax(x))
    torch.sin(want).sum().backward()
    assert max_err(grad_x, x.grad) < 1e-5
    for name, param in module.named_parameters():  # float32 rounding at the scale of a sum over rows
        assert max_err(grads[name], param.grad) < 1e-6 * float(param.grad.abs().max()), name
    if rows == 1:
        return  # a one-row product is a matrix-vector product either way round: no operand order to check
    hlo = jax.jit(model.apply).lower(model.params, as_jax(x)).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    first = [line for line in dots if re.search(rf"= f32\[(40|16),{rows}\]", line)]
    assert len(dots) == 2 and len(first) == (2 if rows <= LINEAR_WEIGHT_FIRST_ROWS else 0), dots


@pytest.mark.parametrize("rows", [1, 2, 128])
def test_few_row_linear_reads_the_stored_weight(rows):
    """A bfloat16 Linear at one row (batch-1 decode) widens the weight inside the matrix-vector loop, at 2 to 64 rows
    (batched decode) is one bfloat16 dot accumulating in float32: the compiled function holds no float32 copy of
    the weight, which above 64 rows (a prefill, the copy amortized over the rows) it does."""
    torch.manual_seed(0)
    module = nn.Linear(512, 1024, bias=False).to(torch.bfloat16)
    x = torch.randn(rows, 512, dtype=torch.bfloat16)
    model = torch2jax.convert(module, (x,))
    xj = jnp.asarray(x.float().numpy(), jnp.bfloat16)
    got, want = jax.jit(model.apply)(model.params, xj), module(x).float()
    assert max_err(got, want) <= 2 ** -7 * float(want.abs().max())  # one bfloat16 rounding of the output
    hlo = jax.jit(model.apply).lower(model.params, xj).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    assert ("f32[1024,512]" in entry) == (rows > LINEAR_WEIGHT_FIRST_ROWS), entry


def test_linear_rows_symbolic_in_the_artifact(tmp_path):
    """With the rows symbolic, the operand order is a conditional on them, settled when the loaded
    artifact is compiled for actual shapes; batched (vmap) and scaled addmm calls keep torch's values."""
    torch.manual_seed(0)
    module = Dense()
    x = torch.randn(8, 24)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {0: "rows"}})
    torch2jax.save(model, tmp_path / "dense")
    loaded = torch2jax.load(tmp_path / "dense")
    with torch.no_grad():
        for rows in (3, 100):
            x = torch.randn(rows, 24)
            assert max_err(loaded(x.numpy()), module(x)) < 1e-5
        stacked = torch.randn(3, 5, 24)
        batched = jax.vmap(model.apply, in_axes=(None, 0))(model.params, stacked.numpy())
        assert max_err(batched, module(stacked)) < 1e-5
    hlo = jax.jit(loaded.apply).lower(loaded.params, np.zeros((6, 24), np.float32)).compile().as_text()
    assert "conditional" not in hlo
    assert len(re.findall(r"= f32\[(?:40|16),6\]\S* dot\(", hlo)) == 2, hlo


def test_scaled_addmm_of_a_transpose_stays_addmm():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, 4))
            self.b = nn.Parameter(torch.randn(5))

        def forward(self, x):
            return torch.addmm(self.b, x, self.w.t(), beta=0.5, alpha=2.0)

    module = Scaled()
    x = torch.randn(3, 4)
    model = torch2jax.convert(module, (x,))
    ops = [node.op for node in passes.optimize(model.graph).nodes]
    assert passes.LINEAR not in ops and passes.ADDMM in ops
    with torch.no_grad():
        assert max_err(model(x.numpy()), module(x)) < 1e-5


class ConvBNHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.norm(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("op, module, x", [
    ("aten.addmm.default", Dense(), torch.randn(8, 24)),  # linear_products
    ("aten.convolution.default", ConvBNHead(), torch.randn(2, 3, 8, 8)),  # fold_conv_batch_norm
    ("aten.bmm.default", nn.LSTM(6, 8, batch_first=True), torch.randn(3, 5, 6)),  # shared_matmul_operand
])
def test_passes_leave_ops_whose_lowering_the_user_replaced(op, module, x):
    original = ops.lookup(op)
    calls = []

    def recording(*args, **kwargs):
        calls.append(op)
        return original.fn(*args, **kwargs)

    torch2jax.register_lowering(op, recording, ctx=original.ctx, replace=True)
    try:
        module = module.eval()
        model = torch2jax.convert(module, (x,))
        got = model(x.numpy())
    finally:
        torch2jax.register_lowering(op, original.fn, ctx=original.ctx, replace=True)
    assert calls, f"a pass bypassed the user's lowering of {op}"
    assert ops.lookup(op).module == original.module
    with torch.no_grad():
        assert max_err(jax.tree.leaves(got)[0], jax.tree.leaves(module(x))[0]) < 1e-5


# --- mixture of experts: gathered expert weights computed densely ---


class GatheredExperts(nn.Module):
    """A router picks top-2 of `experts` expert matrices per token; each token's matrices are
    gathered and applied with bmm, as transformers' exportable batched_mm experts do."""

    def __init__(self, experts: int, dim: int = 8, hidden: int = 12):
        super().__init__()
        self.router = nn.Linear(dim, experts)
        self.up = nn.Parameter(torch.randn(experts, hidden, dim) / dim**0.5)
        self.down = nn.Parameter(torch.randn(experts, hidden, dim) / hidden**0.5)

    def forward(self, x):
        weights, ids = torch.topk(self.router(x).softmax(-1), 2)
        ids = ids.reshape(-1)
        rows = x.repeat_interleave(2, dim=0)
        h = torch.bmm(self.up[ids], rows.unsqueeze(-1)).squeeze(-1).relu()  # experts on the left
        out = torch.bmm(h.unsqueeze(1), self.down[ids]).squeeze(1)  # and on the right
        return (out * weights.reshape(-1, 1)).view(x.shape[0], 2, -1).sum(1)


@pytest.mark.parametrize("experts, rewritten", [(4, 2), (passes.DENSE_EXPERTS_MAX + 1, 0)])
def test_gathered_expert_bmm_is_computed_densely(experts, rewritten):
    torch.manual_seed(0)
    module = GatheredExperts(experts)
    x = torch.randn(10, 8)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {0: "tokens"}})
    optimized = passes.optimize(model.graph)
    assert sum(node.op == passes.EXPERT_BMM for node in optimized.nodes) == rewritten
    assert sum(node.op == passes.BMM for node in optimized.nodes) == 2 - rewritten
    assert not any(node.op == passes.INDEX for node in optimized.nodes) or not rewritten, "the gathers are gone"
    with torch.no_grad():
        for tokens in (10, 3, 1):  # 1 token: 2 rows, each gathers its expert (ops/linalg.expert_bmm)
            x = torch.randn(tokens, 8)
            assert max_err(model(x.numpy()), module(x)) < 1e-5
    for tokens in (3, 1):
        x = torch.randn(tokens, 8)
        grads = jax.grad(lambda p, x=x: jnp.sum(model.apply(p, x.numpy()) ** 2))(model.params)
        params = dict(module.named_parameters())
        want = torch.autograd.grad((module(x) ** 2).sum(), [params[name] for name in ("up", "down", "router.weight")])
        for name, expected in zip(("up", "down", "router.weight"), want):
            assert max_err(grads[name], expected) < 1e-5, (tokens, name)


def test_gathered_expert_bmm_bfloat16_rounds_as_torch():
    torch.manual_seed(0)
    module = GatheredExperts(4).to(torch.bfloat16)
    x = torch.randn(16, 8, dtype=torch.bfloat16)
    model = torch2jax.convert(module, (x,))
    assert any(node.op == passes.EXPERT_BMM for node in passes.optimize(model.graph).nodes)
    with torch.no_grad():
        want = module(x).float()
    got = np.asarray(model(jnp.asarray(x.float().numpy(), jnp.bfloat16)), np.float32)
    assert max_err(got, want) <= 2 ** -7 * float(want.abs().max())


class GroupedExperts(torch.nn.Module):
    """Rows sorted by expert times each expert's matrix, as transformers' grouped_mm experts compute them: its
    `transformers::grouped_mm_fallback` custom op (float32 on CPU under export), or torch's `_grouped_mm` (bfloat16)."""

    def __init__(self, fallback: bool):
        super().__init__()
        self.fallback = fallback
        self.w = torch.nn.Parameter(torch.randn(3, 8, 8))

    def forward(self, x, offs):
        if self.fallback:
            return torch.ops.transformers.grouped_mm_fallback(x, self.w, offs=offs)
        return torch._grouped_mm(x, self.w, offs=offs)


@pytest.mark.parametrize("fallback", [True, False], ids=["transformers-fallback", "aten-bfloat16"])
def test_grouped_mm_is_a_ragged_dot_over_the_selected_experts(fallback):
    import transformers.integrations.moe  # noqa: F401  registers transformers::grouped_mm_fallback

    torch.manual_seed(0)
    dtype = torch.float32 if fallback else torch.bfloat16
    module = GroupedExperts(fallback).to(dtype)
    x, offs = torch.randn(10, 8, dtype=dtype), torch.tensor([2, 2, 7], dtype=torch.int32)  # expert 1 gets no rows
    model = torch2jax.convert(module, (x, offs))
    assert {node.op for node in model.graph.nodes} == {"transformers.grouped_mm_fallback.default" if fallback
                                                       else "aten._grouped_mm.default"}
    got = np.asarray(model(jnp.asarray(x.float().numpy(), jnp.bfloat16 if not fallback else jnp.float32), offs.numpy()),
                     np.float32)
    with torch.no_grad():
        want = module(x, offs).float()
    assert max_err(got[:7], want[:7]) <= (1e-5 if fallback else 0.0)  # bfloat16: one rounding of a float32 sum, as torch
    assert not got[7:].any()  # rows past the last offset: zeros (transformers' fallback; torch's kernel leaves them unset)


class Scaled(nn.Module):
    """A Linear of a row scaled elementwise first, as an RMSNorm's weight scales it."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(64))
        self.proj = nn.Linear(64, 256, bias=False)

    def forward(self, x):
        return self.proj(x * self.scale * 2.0)


def _computations_computing_the_row_with_a_dot(hlo: str) -> int:
    """How many compiled computations hold both a dot and a multiply (the row's scaling): 0 when the row is written out
    before the product reads it."""
    return sum(" dot(" in c and " multiply(" in c for c in hlo_computations(hlo))


def test_one_row_product_reads_its_row_written_out():
    """At one row (batch-1 decode) XLA:CPU fuses what makes the weight (a dequantization) into a matrix-vector loop.
    What makes the row (a norm's scaling) is written out first (linalg._computed_once): fused, the loop computes it
    again for every weight element. Values, NaN and -inf included, as torch's."""
    torch.manual_seed(0)
    module = Scaled().eval()
    x = torch.randn(1, 64)
    model = torch2jax.convert(module, (x,))
    for special in (None, float("nan"), float("-inf")):
        row = x.clone()
        if special is not None:
            row[0, 5] = special
        with torch.no_grad():
            np.testing.assert_allclose(np.asarray(model(row.numpy())), module(row).numpy(), rtol=1e-5, atol=1e-5)
    hlo = jax.jit(model.apply).lower(model.params, x.numpy()).compile().as_text()
    assert " dot(" in hlo and _computations_computing_the_row_with_a_dot(hlo) == 0, hlo


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_stored_weight_is_never_transposed_whole(rows, dtype):
    """A Linear's stored weight [out, in] is never written out transposed, at one row or many: written as x @ weight.T,
    XLA:CPU copied the transposed float32 weight out on every call (a 1536 x 4096 float32 weight at one row: 14 ms of copy for a
    0.75 ms product). Values as x @ weight.T."""
    x = jax.random.normal(jax.random.key(0), (rows, 4096), dtype)
    weight = jax.random.normal(jax.random.key(1), (1536, 4096), dtype)  # the shape XLA:CPU copied
    hlo = jax.jit(linalg.linear).lower(x, weight).compile().as_text()
    assert "[4096,1536]" not in hlo[hlo.index("ENTRY"):], hlo  # inside a fusion it is a loop's order, not a copy
    want = np.asarray(x, np.float32) @ np.asarray(weight, np.float32).T
    np.testing.assert_allclose(np.asarray(linalg.linear(x, weight), np.float32), want, rtol=2e-2 if dtype == jnp.bfloat16 else 1e-4,
                               atol=0.5 if dtype == jnp.bfloat16 else 2e-3)


def test_a_symbolic_row_count_takes_the_one_row_product_of_a_low_precision_weight():
    """With the rows a symbol (an exported artifact's batch x tokens), the product's form is a switch on the count, and
    every branch, the one-row one included, has the symbolic shape."""
    from jax import export

    rows = export.symbolic_shape("rows")[0]
    weight = jax.random.normal(jax.random.key(1), (256, 1024), jnp.bfloat16)
    exported = export.export(jax.jit(linalg.linear))(jax.ShapeDtypeStruct((rows, 1024), jnp.bfloat16), weight)
    for count in (1, 3, 100):
        x = jax.random.normal(jax.random.key(count), (count, 1024), jnp.bfloat16)
        np.testing.assert_allclose(np.asarray(exported.call(x, weight), np.float32),
                                   np.asarray(linalg.linear(x, weight), np.float32), rtol=1e-2, atol=0.1)
