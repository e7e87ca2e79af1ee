"""The tests/models zoo through torch.compile(backend=torch2jax), compared with torch eager.

A few architectures in the default run (one of each family: encoder, decoder, vision, conv, the
hand-written ones); the whole zoo with `-m slow`. Each is compiled with dynamic=True where the zoo
declares dynamic dims and run at two batch sizes, which must share one dynamo graph.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch._dynamo.utils import counters

from torch2jax.eager.dynamo_backend import backend

from ..models.zoo import MODELS

FAST = ["bert", "llama", "embedding_bag_scatter"]  # a transformer, a decoder, a sparse op; the rest in the slow tier


def _rebatched(value, batch: int):
    """The example input with its batch dim (dim 0 of every tensor of 2+ dims) grown to `batch`."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2:
        return torch.cat([value] * (batch // value.shape[0]) + [value[: batch % value.shape[0]]])
    return value


def _check(name: str) -> None:
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    case = MODELS[name]()
    module = case.module.eval()
    dynamic = case.dynamic_shapes is not None
    compiled = torch.compile(module, backend=backend, dynamic=dynamic)
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
        sizes = (2, 3) if dynamic else (None,)
        for batch in sizes:
            args, kwargs = case.args, case.kwargs
            if batch is not None:
                args, kwargs = pytree.tree_map(lambda v, b=batch: _rebatched(v, b), (args, kwargs))
            want, got = module(*args, **kwargs), compiled(*args, **kwargs)
            want_leaves, got_leaves = pytree.tree_leaves(want), pytree.tree_leaves(got)
            assert len(want_leaves) == len(got_leaves)
            for k, (w, g) in enumerate(zip(want_leaves, got_leaves)):
                torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m, k=k, b=batch: f"batch {b}, output {k}: {m}")
    assert counters["aot_autograd"]["ok"] >= 1, "no graph reached the backend"
    if dynamic:
        assert counters["stats"]["unique_graphs"] == 1, f"{counters['stats']['unique_graphs']} dynamo graphs for two batch sizes"


@pytest.mark.parametrize("name", FAST)
def test_zoo_model_compiles_and_matches_eager(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(MODELS) - set(FAST)))
def test_zoo_model_compiles_and_matches_eager_slow(name):
    _check(name)


@pytest.mark.slow
def test_llama_training_matches_eager():
    """Three AdamW steps of the zoo's Llama (attention forward and backward kept whole) against eager."""
    import copy

    torch._dynamo.reset()
    torch.manual_seed(0)
    case = MODELS["llama"]()
    ours = case.module.train()
    reference = copy.deepcopy(ours)
    ids = case.args[0]

    def train(module, call):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(call(ids).logits.flatten(0, 1), ids.flatten())
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    torch.testing.assert_close(train(ours, torch.compile(ours, backend=backend)), train(reference, reference))
    for (name, got), (_, want) in zip(ours.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-5, msg=lambda m, name=name: f"{name}: {m}")
