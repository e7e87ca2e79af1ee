"""torch2jax.convert: sample models against torch, output structure, params, dynamic dims, purity."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax

from ..helpers import max_err, torch_out


@pytest.mark.parametrize("name", ["mlp", "cnn", "tiny_gpt"])
def test_sample_model_matches_torch_at_two_sizes(converted, name):
    module, args, model = converted(name)
    assert max_err(model(*[a.numpy() for a in args]), torch_out(module, *args)) < 1e-4
    bigger = [torch.cat([a, a[:1]], 0) for a in args]  # one more along the symbolic batch dim
    assert max_err(model(*[a.numpy() for a in bigger]), torch_out(module, *bigger)) < 1e-4


def test_sequence_length_is_symbolic(converted):
    module, _, model = converted("tiny_gpt")
    tokens = torch.randint(0, 128, (1, 7))
    assert max_err(model(tokens.numpy()), torch_out(module, tokens)) < 1e-4


def test_params_keyed_by_state_dict_names_with_tied_weights_once(converted):
    module, _, model = converted("tiny_gpt")
    names = set(module.state_dict())
    assert set(model.params) == names - {"head.weight"}
    assert model.graph.aliases == {"head.weight": "tok.weight"}
    np.testing.assert_array_equal(np.asarray(model.params["tok.weight"]), module.tok.weight.detach().numpy())


def test_buffers_are_params(converted):
    module, _, model = converted("cnn")
    assert "features.1.running_mean" in model.params
    np.testing.assert_allclose(np.asarray(model.params["features.1.running_var"]), module.features[1].running_var.numpy())


class Structured(torch.nn.Module):
    def forward(self, x, y):
        return {"sum": x + y, "parts": (x * 2, [y - 1, x.mean()])}


def test_output_structure_is_preserved():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    model = torch2jax.convert(Structured(), (x, y))
    out = model(x.numpy(), y.numpy())
    ref = Structured()(x, y)
    assert set(out) == {"sum", "parts"} and isinstance(out["parts"], tuple) and isinstance(out["parts"][1], list)
    assert max_err(out["parts"][1][0], ref["parts"][1][0]) < 1e-6
    assert max_err(out["sum"], ref["sum"]) < 1e-6


class KwargModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 2)

    def forward(self, x, *, scale):
        return self.proj(x) * scale


def test_kwargs_inputs():
    x, scale = torch.randn(2, 4), torch.tensor(3.0)
    module = KwargModel()
    model = torch2jax.convert(module, (x,), {"scale": scale})
    assert max_err(model(x.numpy(), scale=scale.numpy()), torch_out(module, x, scale=scale)) < 1e-5
    with pytest.raises(torch2jax.SignatureError, match="scale"):
        model(x.numpy())


def test_dynamic_shapes_torch_form_matches_plain_form():
    from torch.export import Dim

    module = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    plain = torch2jax.convert(module, (x,), dynamic_shapes={"input": {0: "batch"}})
    torch_form = torch2jax.convert(module, (x,), dynamic_shapes={"input": {0: Dim("batch")}})
    for model in (plain, torch_form):
        assert model.graph.user_inputs[0].meta.shape == ["batch", 4]
        x5 = torch.randn(5, 4)
        assert max_err(model(x5.numpy()), torch_out(module, x5)) < 1e-5


class CapacityModel(torch.nn.Module):
    """NLLB-MoE's router keeps tokens whose running count is under ceil(fraction * tokens) (a float times a size)."""

    def forward(self, x):
        import math

        tokens = x.shape[0]
        return (torch.cumsum(x, 0) < math.ceil(0.4 * tokens)).to(x.dtype) + (torch.cumsum(x, 0) < math.floor(0.7 * tokens))


def test_rounding_a_float_times_a_symbolic_size_saves_and_loads(tmp_path):
    module = CapacityModel()
    x = torch.ones(6, 2)
    model = torch2jax.convert(module, (x,), dynamic_shapes={"x": {0: "tokens"}})
    torch2jax.save(model, tmp_path / "m")
    loaded = torch2jax.load(tmp_path / "m")
    for rows in (6, 11):
        ones = torch.ones(rows, 2)
        np.testing.assert_array_equal(np.asarray(loaded(ones.numpy())), torch_out(module, ones).numpy())


class LastRowsModel(torch.nn.Module):
    """NLLB-MoE's router keeps the last `tokens` entries of a flattened [batch, keys] mask: bounds jax cannot order."""

    def forward(self, mask):
        return mask.reshape(-1)[-mask.shape[0]:] * 2


def test_the_last_batch_of_a_flattened_batch_by_keys_slice_saves_and_loads(tmp_path):
    module = LastRowsModel()
    model = torch2jax.convert(module, (torch.randn(3, 5),), dynamic_shapes={"mask": {0: "batch", 1: "keys"}})
    torch2jax.save(model, tmp_path / "m")
    loaded = torch2jax.load(tmp_path / "m")
    for shape in ((3, 5), (2, 7), (4, 2)):
        mask = torch.randn(*shape)
        np.testing.assert_array_equal(np.asarray(loaded(mask.numpy())), torch_out(module, mask).numpy())


def test_apply_is_pure_and_traceable(converted):
    module, args, model = converted("mlp")
    x = args[0].numpy()
    jitted = jax.jit(model.apply)
    np.testing.assert_allclose(np.asarray(jitted(model.params, x)), np.asarray(model(x)), rtol=1e-6, atol=1e-6)

    def loss(params, x):
        return jnp.sum(model.apply(params, x) ** 2)

    grads = jax.grad(loss)(model.params, x)
    x_t = args[0].clone()
    module.zero_grad()
    (module(x_t) ** 2).sum().backward()
    assert max_err(grads["fc1.weight"], module.fc1.weight.grad) < 1e-4
    per_example = jax.vmap(lambda row: model.apply(model.params, row[None])[0])(x)
    np.testing.assert_allclose(np.asarray(per_example), np.asarray(model(x)), rtol=1e-5, atol=1e-6)


def test_wrong_inputs_give_clear_errors(converted):
    _, args, model = converted("mlp")
    x = args[0].numpy()
    takes = r"the model takes \(x: float32\[batch, 16\]\)"
    with pytest.raises(torch2jax.SignatureError, match=r"unexpected input: 2 positional inputs given, " + takes):
        model(x, x)
    with pytest.raises(torch2jax.SignatureError, match="axis 1 must be 16"):
        model(np.ones((2, 15), np.float32))
    with pytest.raises(torch2jax.SignatureError, match="expects dtype float32"):
        model(np.ones((2, 16), np.int32))


@torch.library.custom_op("t2jtest::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("t2jtest::enigma", mutates_args=())
def enigma(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@enigma.register_fake
def _(x):
    return torch.empty_like(x)


class TwoUnknownOps(torch.nn.Module):
    def forward(self, x):
        y = torch.ops.t2jtest.mystery(x)
        return torch.ops.t2jtest.enigma(y + 1)


def test_unsupported_ops_all_reported_with_schema_and_source():
    with pytest.raises(torch2jax.UnsupportedOpsError) as info:
        torch2jax.convert(TwoUnknownOps(), (torch.randn(2),))
    message = str(info.value)
    assert info.value.ops == ["t2jtest.mystery.default", "t2jtest.enigma.default"]
    assert "t2jtest::mystery(Tensor x) -> Tensor" in message
    assert "test_convert.py" in message and "torch.ops.t2jtest.enigma(y + 1)" in message


def test_registering_a_lowering_makes_a_custom_op_convert():
    from torch2jax.ops import registry

    torch2jax.register_lowering("t2jtest::mystery", lambda x: x)
    torch2jax.register_lowering(torch.ops.t2jtest.enigma.default)(lambda x: x)
    try:
        x = torch.randn(3)
        model = torch2jax.convert(TwoUnknownOps(), (x,))
        assert max_err(model(x.numpy()), x + 1) < 1e-6
    finally:
        registry._REGISTRY.pop("t2jtest.mystery.default")
        registry._REGISTRY.pop("t2jtest.enigma.default")


# a custom op defined the classic way: a Library fragment with a schema, a CPU kernel and a fake kernel
_CLASSIC = torch.library.Library("t2jclassic", "DEF")
_CLASSIC.define("scaled_tanh(Tensor x, float scale) -> Tensor")
_CLASSIC.impl("scaled_tanh", lambda x, scale: torch.tanh(x) * scale, "CPU")
torch.library.register_fake("t2jclassic::scaled_tanh")(lambda x, scale: torch.empty_like(x))


def test_classic_library_op_with_a_registered_lowering_converts_and_saves(tmp_path):
    from torch2jax.ops import registry

    class UsesClassic(torch.nn.Module):
        def forward(self, x):
            return torch.ops.t2jclassic.scaled_tanh(x, 3.0) + 1

    @torch2jax.register_lowering("t2jclassic::scaled_tanh")
    def scaled_tanh(x, scale):
        import jax.numpy as jnp

        return jnp.tanh(x) * scale

    try:
        x = torch.randn(4, 5)
        model = torch2jax.convert(UsesClassic(), (x,))
        assert max_err(model(x.numpy()), UsesClassic()(x)) < 1e-6
        torch2jax.save(model, tmp_path / "classic")
        assert max_err(torch2jax.load(tmp_path / "classic")(x.numpy()), UsesClassic()(x)) < 1e-6
    finally:
        registry._REGISTRY.pop("t2jclassic.scaled_tanh.default")


class Branchy(torch.nn.Module):
    """A branch on a value, then NumPy: not even the example's path can be traced."""

    def forward(self, x):
        if x.sum() > 0:
            return torch.from_numpy(x.numpy() + 1)
        return x - 1


def test_export_failure_carries_torch_reason_and_hint():
    with pytest.raises(torch2jax.ExportError, match="torch.cond"):
        torch2jax.convert(Branchy(), (torch.ones(3),))  # the side that calls NumPy


def test_import_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, torch2jax; torch2jax.load; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


class Casts(torch.nn.Module):
    def forward(self, x, ids):
        return x.to(torch.bfloat16).float() * 2, ids.to(dtype=torch.float32).sum(-1), torch.zeros_like(x, dtype=torch.int32)


def test_dtype_keyword_arguments_survive_the_graph():
    x, ids = torch.randn(2, 3), torch.randint(0, 5, (2, 4))
    model = torch2jax.convert(Casts(), (x, ids))
    got = model(x.numpy(), ids.numpy())
    want = Casts()(x, ids)
    assert [str(g.dtype) for g in got] == ["float32", "float32", "int32"]
    for g, w in zip(got, want):
        assert max_err(g, w) == 0.0
    again = torch2jax.ir.graph.Graph.loads(model.graph.dumps())  # JSON round trip keeps the kwargs
    assert [n.kwargs for n in again.nodes] == [n.kwargs for n in model.graph.nodes]


def test_bfloat16_conversion_is_as_accurate_as_torch_bfloat16(converted):
    """Rounding differs op by op (XLA fuses in float32), so both bf16 runs are judged against float32."""
    module, args, _ = converted("tiny_gpt")
    model = torch2jax.convert(module, args, dynamic_shapes={"tokens": {0: "batch"}}, dtype="bfloat16")
    assert {str(p.dtype) for p in model.params.values()} == {"bfloat16"}
    assert next(module.parameters()).dtype == torch.float32, "the user's module must stay float32"
    from torch2jax.capture.converter import cast

    module_bf16, _, _ = cast(module, args, {}, torch.bfloat16)
    tokens = torch.randint(0, 128, (3, 16))
    reference = torch_out(module, tokens)
    ours = np.asarray(model(tokens.numpy()), dtype=np.float32)
    assert str(model(tokens.numpy()).dtype) == "bfloat16"
    torch_bf16_error = max_err(torch_out(module_bf16, tokens).float(), reference)
    assert max_err(ours, reference) <= 1.5 * torch_bf16_error


@pytest.mark.parametrize("bounds", [(1, 1), (4, 4), (5, 3)])
def test_a_dynamic_dim_with_no_room_to_vary_is_a_clear_error(bounds):
    low, high = bounds
    spec = {"input": {0: {"name": "batch", "min": low, "max": high}}}
    with pytest.raises(torch2jax.InputSpecError, match=rf"dynamic dim 'batch' has range \[{low}, {high}\], which leaves it no room"):
        torch2jax.convert(torch.nn.Linear(3, 2), (torch.randn(2, 3),), dynamic_shapes=spec)


class CheckedValues(torch.nn.Module):
    """`torch._check_tensor_all` (transformers' torch_compilable_check on a tensor): `_is_all_true` in the graph."""

    def forward(self, x):
        torch._check_tensor_all(x > -100)
        return x * 2


def test_a_check_on_tensor_values_converts_and_runs():
    x = torch.randn(3)
    model = torch2jax.convert(CheckedValues(), (x,))
    assert np.allclose(model(x.numpy()), (x * 2).numpy())


class FeaturesAtTokens(torch.nn.Module):
    """A multimodal merge: the valid rows of per-frame features (`features[frame_mask]`, a data-dependent count)
    written into the text embeddings at the placeholder tokens (as Qwen2-Audio's forward does)."""

    def forward(self, embeds, features, frame_mask, token_mask):
        selected = features[frame_mask]
        return embeds.masked_scatter(token_mask[..., None].expand_as(embeds), selected)


class SummedSelection(torch.nn.Module):
    def forward(self, features, frame_mask):
        return features[frame_mask].sum(0)


def _masks(counts, shape, seed):
    """A bool mask of `shape` with counts[i] leading True values per row."""
    mask = torch.zeros(shape, dtype=torch.bool)
    for row, count in enumerate(counts):
        mask[row, :count] = True
    return mask[:, torch.randperm(shape[1], generator=torch.Generator().manual_seed(seed))]


def test_selected_rows_written_at_tokens_convert_for_any_count():
    embeds, features = torch.randn(2, 7, 4), torch.randn(2, 6, 4)
    example = (embeds, features, _masks([3, 2], (2, 6), 0), _masks([2, 3], (2, 7), 1))
    model = torch2jax.convert(FeaturesAtTokens(), example)
    for counts, tokens in (([3, 2], [2, 3]), ([6, 1], [4, 3]), ([0, 0], [0, 0]), ([6, 6], [6, 6])):
        inputs = (embeds, features, _masks(counts, (2, 6), 2), _masks(tokens, (2, 7), 3))
        assert max_err(model(*(t.numpy() for t in inputs)), FeaturesAtTokens()(*inputs)) == 0


def test_selected_rows_read_otherwise_take_the_examples_count():
    """Read otherwise than as a scatter's source, the rows' count is the example's, checked at run time."""
    with pytest.warns(UserWarning, match="refuses inputs that give another"):
        model = torch2jax.convert(SummedSelection(), (torch.randn(2, 6, 4), _masks([3, 2], (2, 6), 0)))
    features, same = torch.randn(2, 6, 4), _masks([1, 4], (2, 6), 1)  # five rows, as in the example
    assert max_err(model(features.numpy(), same.numpy()), SummedSelection()(features, same)) < 1e-5
    with pytest.raises(torch2jax.ExamplePathError, match="example gave 5"):
        model(features.numpy(), _masks([3, 3], (2, 6), 1).numpy())


class Chunks(torch.nn.Module):
    """Overlapping windows over a transposed tensor's storage, as Longformer's sliding chunks take them."""

    def forward(self, x):
        return (x * 2).transpose(0, 1).as_strided((2, 4, 4), (2, 1, 6)) + 1


def test_as_strided_reads_a_views_storage_not_its_elements_in_order():
    """torch's as_strided indexes the storage: the transposed view's elements lie there column by column."""
    x = torch.randn(4, 6)
    model = torch2jax.convert(Chunks(), (x,))
    assert "torch2jax.as_strided_view.default" in model.graph.ops()
    other = torch.randn(4, 6)
    assert max_err(model(other.numpy()), Chunks()(other)) < 1e-6


def test_a_kv_cache_returned_as_an_output_is_plain_tensors():
    """A base model called with use_cache=True returns transformers' cache object, which torch.export refuses as an
    output: it comes back as {"keys": [per layer], "values": [per layer]}, as torch computed them."""
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         vocab_size=64, intermediate_size=32)
    module, ids = LlamaModel(config).eval(), torch.randint(0, 64, (2, 5))
    model = torch2jax.convert(module, (), {"input_ids": ids, "use_cache": True})
    got = model(input_ids=ids.numpy(), use_cache=True)["cache"]
    with torch.no_grad():
        want = module(input_ids=ids, use_cache=True).cache
    assert len(got["keys"]) == len(got["values"]) == 2
    for layer, keys, values in zip(want.layers, got["keys"], got["values"]):
        assert max_err(keys, layer.keys) < 1e-5 and max_err(values, layer.values) < 1e-5


class Entropy(torch.nn.Module):
    """torch.distributions checks its arguments' values when built (as BLT's patcher builds a Categorical)."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(6, 10)

    def forward(self, x):
        return torch.distributions.Categorical(logits=self.head(x)).entropy()


def test_distribution_argument_checks_do_not_stop_the_export_and_stay_on_afterwards():
    validating = torch.distributions.Distribution._validate_args
    module = Entropy().eval()
    x = torch.randn(3, 6)
    model = torch2jax.convert(module, (x,))
    assert max_err(model(x.numpy()), torch_out(module, x)) < 1e-5
    assert not model.graph.example_values, "no check of the logits' values taken from the example, or kept"
    assert torch.distributions.Distribution._validate_args == validating
