"""Mutated buffers as explicit state, PRNG keys for random ops, and what cannot be converted."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.errors import Torch2JaxError, UnsupportedOpsError

from ..helpers import max_err


class NormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4, momentum=0.3)

    def forward(self, x):
        return self.bn(self.conv(x)).relu().mean((2, 3))


class KVCache(torch.nn.Module):
    """Appends each step's key to a fixed-size cache buffer and attends over what is filled so far."""

    def __init__(self, slots: int = 6, width: int = 4):
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.register_buffer("cache", torch.zeros(slots, width))
        self.register_buffer("filled", torch.zeros((), dtype=torch.int64))

    def forward(self, x):  # x: [width], one step
        key = self.proj(x)
        slot = torch.nn.functional.one_hot(self.filled, self.cache.shape[0]).to(key.dtype)[:, None]
        self.cache.mul_(1 - slot).add_(slot * key)
        self.filled.add_(1)
        scores = (self.cache @ x).masked_fill(torch.arange(self.cache.shape[0]) >= self.filled, -1e9)
        return scores.softmax(0) @ self.cache


STATE = {  # model, inputs of step i, dynamic shapes
    "norm": (NormNet, lambda i: (torch.randn(2 + i, 3, 6, 6) * (1 + i),), {"x": {0: "batch"}}),
    "kv": (KVCache, lambda i: (torch.randn(4),), None),
}


@pytest.mark.parametrize("name", sorted(STATE))
def test_state_after_every_step_matches_torch(name, tmp_path):
    make, inputs, dynamic = STATE[name]
    torch.manual_seed(0)
    module = make().train()
    model = torch2jax.convert(module, inputs(0), dynamic_shapes=dynamic)
    assert set(model.manifest["mutated_buffers"] if model.manifest else []) <= set(module.state_dict())
    for key, value in module.state_dict().items():  # conversion leaves the module's state alone
        assert max_err(model.params[key], value) == 0, key
    torch2jax.save(model, tmp_path / "m")
    loaded = torch2jax.load(tmp_path / "m")
    params = dict(model.params)
    for step in range(4):
        x = inputs(step + 1)
        with torch.no_grad():
            want = module(*x)
        np_x = [t.numpy() for t in x]
        got_bound = model(*np_x)  # updates model.params, as calling the torch module updates its buffers
        got_loaded = loaded(*np_x)
        got_pure, updates = model.apply(params, *np_x, mutable=True)
        params = {**params, **updates}
        for got in (got_bound, got_loaded, got_pure):
            assert max_err(got, want) < 1e-5, step
        for key, value in module.state_dict().items():
            for where, state in (("bound", model.params), ("loaded", loaded.params), ("apply", params)):
                assert max_err(state[key], value) < 1e-5, (step, key, where)


def test_params_do_not_alias_the_torch_tensors():
    module = NormNet().eval()
    model = torch2jax.convert(module, (torch.randn(2, 3, 6, 6),))
    before = np.asarray(model.params["conv.weight"]).copy()
    with torch.no_grad():
        module.conv.weight.add_(1.0)
        module.bn.running_mean.add_(1.0)
    assert np.array_equal(np.asarray(model.params["conv.weight"]), before)
    assert not np.asarray(model.params["bn.running_mean"]).any()


def test_apply_without_mutable_refuses_to_drop_updates():
    model = torch2jax.convert(NormNet().train(), (torch.randn(2, 3, 6, 6),))
    with pytest.raises(Torch2JaxError, match="mutable=True"):
        model.apply(model.params, np.ones((2, 3, 6, 6), np.float32))


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(x) + torch.rand_like(x) * 0


def test_random_ops_take_an_explicit_key(tmp_path):
    model = torch2jax.convert(Noisy().train(), (torch.ones(64, 64),))
    x = np.ones((64, 64), np.float32)
    with pytest.raises(Torch2JaxError, match="PRNG key"):
        model(x)
    key = jax.random.key(3)
    first = np.asarray(model(x, rng=key))
    assert np.array_equal(first, np.asarray(model(x, rng=key))), "same key, same draw"
    assert not np.array_equal(first, np.asarray(model(x, rng=jax.random.key(4))))
    kept = first != 0
    assert abs(kept.mean() - 0.75) < 0.03 and np.allclose(first[kept], 1 / 0.75)  # torch's dropout scaling
    assert np.array_equal(np.asarray(model.apply(model.params, x, rng=key)), first)
    torch2jax.save(model, tmp_path / "noisy")
    loaded = torch2jax.load(tmp_path / "noisy")
    assert np.array_equal(np.asarray(loaded(x, rng=key)), first), "the artifact draws what the in-memory model draws"
    with pytest.raises(Torch2JaxError, match="PRNG key"):
        loaded(x)


class AttentionDropout(torch.nn.Module):
    """Attention kept whole (one SDPA node) that drops attention weights in training."""

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.5 if self.training else 0.0)


def test_attention_dropout_draws_from_the_key_and_keeps_the_expectation():
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    eval_model = torch2jax.convert(AttentionDropout().eval(), (q, k, v))
    assert not eval_model.needs_rng, "dropout_p=0 draws nothing"
    model = torch2jax.convert(AttentionDropout().train(), (q, k, v))
    assert model.needs_rng
    args = [t.numpy() for t in (q, k, v)]
    first = np.asarray(model(*args, rng=jax.random.key(0)))
    assert np.array_equal(first, np.asarray(model(*args, rng=jax.random.key(0))))
    assert not np.array_equal(first, np.asarray(model(*args, rng=jax.random.key(1))))
    # E[dropout(w) / (1 - p)] = w, so the mean over draws approaches attention without dropout.
    draws = jax.vmap(lambda key: model(*args, rng=key))(jax.random.split(jax.random.key(2), 4000))
    want = AttentionDropout().eval()(q, k, v).numpy()
    assert np.abs(np.asarray(draws).mean(0) - want).max() < 0.1
    assert np.abs(np.asarray(draws).std(0)).min() > 0.05, "every output varies between draws"


def test_in_place_writes_to_inputs_are_dropped_with_a_warning_naming_them_and_the_fix():
    """More cases in tests/capture/test_input_mutation.py."""
    class Bump(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    x = torch.randn(3)
    with pytest.warns(torch2jax.InputMutationWarning, match=r"(?s)input 'x', at x.add_\(1\).*x = x \+ 1"):
        model = torch2jax.convert(Bump(), (x.clone(),))
    np.testing.assert_allclose(np.asarray(model(x.numpy())), (x + 1).numpy() * 2, rtol=1e-6)


def test_data_dependent_shapes_are_taken_from_the_example_or_refused_with_the_bounded_alternative():
    class Positive(torch.nn.Module):
        def forward(self, x):
            return torch.nonzero(x > 0)

    x = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0])
    with pytest.warns(UserWarning, match="refuses inputs that give another"):
        model = torch2jax.convert(Positive(), (x,))  # the count (3) is the example's, checked at run time
    other = torch.tensor([-0.5, 1.0, 2.0, 0.0, 3.0])
    assert np.array_equal(np.asarray(model(other.numpy())), Positive()(other).numpy())
    with pytest.raises(torch2jax.ExamplePathError, match="example gave 3"):
        model(np.ones(5, np.float32))

    class Counted(torch.nn.Module):  # no run-time check of the length is possible: refused, with the alternative
        def forward(self, x):
            return torch.bincount(x)

    with pytest.raises(UnsupportedOpsError, match=r"(?s)depends on the input values.*max\(x\) \+ 1.*test_state.py"):
        torch2jax.convert(Counted(), (torch.tensor([1, 2, 1]),))

    class Bounded(torch.nn.Module):
        def forward(self, x):
            return torch.nonzero_static(x > 0, size=5, fill_value=-1)

    x = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.0])
    got = torch2jax.convert(Bounded(), (x,))(x.numpy())
    assert np.array_equal(np.asarray(got), Bounded()(x).numpy())


def test_sizes_torch_knows_without_the_values_are_lowered():
    """repeat_interleave with output_size, nonzero of an empty tensor: static sizes, so no refusal."""

    class Spread(torch.nn.Module):
        def forward(self, x, repeats):
            return torch.repeat_interleave(x, repeats, dim=0, output_size=6)

    x, repeats = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    model = torch2jax.convert(Spread(), (x, repeats))
    assert np.array_equal(np.asarray(model(x.numpy(), repeats.numpy())), Spread()(x, repeats).numpy())
    other = torch.tensor([3, 0, 0, 3])  # another split of the same output_size
    assert np.array_equal(np.asarray(model(x.numpy(), other.numpy())), Spread()(x, other).numpy())

    class Where(torch.nn.Module):
        def forward(self, x):
            return torch.argwhere(x)

    empty = torch.zeros(5, 0)
    got = torch2jax.convert(Where(), (empty,))(empty.numpy())
    assert np.asarray(got).shape == (0, 2)


@pytest.mark.slow  # the console script twice (~70 s); train-mode dropout with a key is tested in Python above
def test_cli_converts_a_train_mode_model_with_dropout_and_runs_it_with_a_seed(tmp_path):
    from ..helpers import cli

    source = tmp_path / "drop.py"
    source.write_text(
        "import torch\nclass M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.lin = torch.nn.Linear(8, 8)\n        self.drop = torch.nn.Dropout(0.5)\n"
        "    def forward(self, x):\n        return self.drop(self.lin(x))\n"
    )
    out = tmp_path / "drop"
    result = cli("convert", f"{source}:M", "--input", "x=float32[batch=4,8]", "--train", "--out", str(out), "-q")
    assert result.returncode == 0, result.stderr
    assert "random ops: shapes and dtypes compared, not values" in result.stdout
    np.save(tmp_path / "x.npy", np.ones((3, 8), np.float32))
    draws = []
    for seed in ("1", "1", "2"):
        ran = cli("run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "--out", str(tmp_path / "y.npz"), "--seed", seed)
        assert ran.returncode == 0, ran.stderr
        draws.append(np.load(tmp_path / "y.npz")["output"])
    assert np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[0], draws[2])
