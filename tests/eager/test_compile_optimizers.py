"""torch.optim under torch.compile(backend=torch2jax): a whole training step (forward, loss, backward,
clip_grad_norm_, optimizer.step) runs in JAX, with nothing left to torch (no fallback warning, no op
counted as run in torch), and gives eager CPU torch's parameters.

Dynamo writes `addcmul_` / `addcdiv_` with a value as `prims.fma`, and the foreach optimizers and
clip_grad_norm_ call `_foreach_*` ops, which the decomposition table leaves whole.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from torch2jax.eager.dynamo_backend import backend
from torch2jax.eager.partition import NO_LOWERING, VALUE_SHAPED

OPTIMIZERS = {
    "sgd": lambda p, foreach: torch.optim.SGD(p, lr=0.05, foreach=foreach),
    "sgd-momentum": lambda p, foreach: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=foreach),
    "sgd-nesterov": lambda p, foreach: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, foreach=foreach),
    "adam": lambda p, foreach: torch.optim.Adam(p, lr=0.01, foreach=foreach),
    "adam-amsgrad": lambda p, foreach: torch.optim.Adam(p, lr=0.01, amsgrad=True, weight_decay=0.01, foreach=foreach),
    "adamw": lambda p, foreach: torch.optim.AdamW(p, lr=0.01, foreach=foreach),
    "rmsprop": lambda p, foreach: torch.optim.RMSprop(p, lr=0.01, foreach=foreach),
    "rmsprop-centered-momentum": lambda p, foreach: torch.optim.RMSprop(p, lr=0.01, momentum=0.9, centered=True,
                                                                         foreach=foreach),
    "adagrad": lambda p, foreach: torch.optim.Adagrad(p, lr=0.05, foreach=foreach),
}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _train(optimizer: str, foreach: bool, loss_kind: str, compiled: bool, schedule: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = OPTIMIZERS[optimizer](model.parameters(), foreach)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if schedule else None
    x = torch.randn(6, 8)
    target = torch.randint(0, 4, (6,)) if loss_kind == "cross-entropy" else torch.randn(6, 4)

    def step():
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, target) if loss_kind == "cross-entropy" else F.mse_loss(out, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    run = torch.compile(step, backend=backend) if compiled else step
    for _ in range(3):
        run()
        if scheduler is not None:
            scheduler.step()  # a new learning rate: dynamo compiles the step again
    return model


def _cases():
    """Each optimizer in the default tier, alternating its for-loop and foreach implementations; the
    other one in the slow tier (dynamo takes seconds per optimizer step)."""
    for index, optimizer in enumerate(OPTIMIZERS):
        for foreach in (False, True):
            marks = [pytest.mark.slow] if foreach == (index % 2 == 0) else []
            yield pytest.param(optimizer, foreach, marks=marks, id=f"{optimizer}-{'foreach' if foreach else 'for-loop'}")


@pytest.mark.parametrize("optimizer,foreach", list(_cases()))
def test_a_compiled_training_step_runs_in_jax_and_matches_eager(optimizer, foreach, schedule=False):
    loss_kind = "cross-entropy" if foreach else "mse"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = _train(optimizer, foreach, loss_kind, compiled=True, schedule=schedule)
    ours = [str(w.message) for w in caught if "torch2jax" in str(w.message)]
    assert not ours, ours
    assert not counters[NO_LOWERING] and not counters[VALUE_SHAPED], (dict(counters[NO_LOWERING]), dict(counters[VALUE_SHAPED]))
    assert counters["stats"]["calls_captured"], "nothing was compiled"
    eager = _train(optimizer, foreach, loss_kind, compiled=False, schedule=schedule)
    for (name, want), got in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(got, want, msg=name)


def test_a_compiled_training_step_with_an_lr_scheduler():
    test_a_compiled_training_step_runs_in_jax_and_matches_eager("adamw", True, schedule=True)


# each returns the concatenated lists of several calls
FOREACH_CALLS = {
    "add": lambda a, b: torch._foreach_add(a, b, alpha=0.5) + torch._foreach_add(a, 2.0)
    + torch._foreach_add(a, [1.0, -1.0, 3.0]) + torch._foreach_add(a, torch.tensor(0.25), alpha=2),
    "sub, mul, div": lambda a, b: torch._foreach_sub(a, b, alpha=3) + torch._foreach_mul(a, [2.0, 3.0, 4.0])
    + torch._foreach_div(a, b) + torch._foreach_mul(a, torch.tensor(3.0)) + torch._foreach_div(a, 7.0),
    "addcmul, addcdiv": lambda a, b: torch._foreach_addcmul(a, b, a, value=0.3)
    + torch._foreach_addcdiv(a, b, torch._foreach_abs(a), [0.1, 0.2, 0.3])
    + torch._foreach_addcmul(a, a, torch._foreach_exp(b), [1.5, 2.5, 3.5]),
    "max, clamp, pow": lambda a, b: torch._foreach_maximum(a, b) + torch._foreach_minimum(a, 0.1)
    + torch._foreach_clamp_min(a, [0.0, 0.5, -0.5]) + torch._foreach_clamp_max(a, b)
    + torch._foreach_pow(torch._foreach_abs(a), 1.5) + torch._foreach_pow(2.0, b),
    "lerp, unary": lambda a, b: torch._foreach_lerp(a, b, 0.7) + torch._foreach_lerp(a, b, b)
    + torch._foreach_sqrt(torch._foreach_abs(a)) + torch._foreach_neg(a) + torch._foreach_reciprocal(b)
    + torch._foreach_sign(a) + torch._foreach_sigmoid(a),
    "norms": lambda a, b: [torch.stack(torch._foreach_norm(a)), torch.stack(torch._foreach_norm(b, 1)),
                           torch.stack(torch._foreach_norm(a, float("inf")))],
}


@pytest.mark.parametrize("case", FOREACH_CALLS)
def test_foreach_ops_run_in_jax_as_in_torch(case):
    """Each `_foreach_*` overload is its per-tensor op on each element, with that element's dtype."""
    fn = FOREACH_CALLS[case]
    torch.manual_seed(0)
    a = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2).double()]
    b = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2, 2).double()]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(fn, backend=backend, fullgraph=True)(a, b)
    assert not [w for w in caught if "torch2jax" in str(w.message)]
    assert not counters[NO_LOWERING]
    want = fn(a, b)
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for have, expected in zip(got, want):
        torch.testing.assert_close(have, expected)


@pytest.mark.parametrize("op", ["_foreach_addcdiv.Tensor", "_foreach_addcmul.Tensor", "_foreach_max.default"])
def test_foreach_overloads_dynamo_cannot_trace(op):
    """Overloads torch.compile cannot trace (a CPU tensor of scalars; _foreach_max), given the lowering
    directly with the output metadata torch eager's results have."""
    from torch2jax.ir.graph import Node, TensorMeta
    from torch2jax.lowering.interpreter import LoweringContext
    from torch2jax.ops import lookup

    torch.manual_seed(0)
    tensors = [[torch.randn(3, 4), torch.randn(5).double()] for _ in range(3)]
    args = tensors if op != "_foreach_max.default" else tensors[:1]
    if op != "_foreach_max.default":
        args = [*args, torch.tensor([0.5, -2.0])]
    packet, overload = op.split(".")
    want = getattr(getattr(torch.ops.aten, packet), overload)(*args)
    metas = [TensorMeta(str(t.dtype).removeprefix("torch."), list(t.shape)) for t in want]
    ctx = LoweringContext(Node("n", f"aten.{op}", [], {}, metas), {}, None, 0)
    arrays = [[t.numpy() for t in a] if isinstance(a, list) else a.numpy() for a in args]
    got = lookup(f"aten.{op}").fn(ctx, *arrays)
    for have, expected in zip(got, want):
        torch.testing.assert_close(torch.from_numpy(np.asarray(have)).to(expected.dtype), expected)
