"""Weight-only int8 / int4 quantization of a converted model's matmul weights (runtime/quantize.py)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import torch

import torch2jax
from torch2jax.capture.converter import quantize_like
from torch2jax.errors import ExportError, InputSpecError
from torch2jax.lowering import passes
from torch2jax.runtime.quantize import dequantize_array, quantize_array, share_quantized_params

from ..helpers import hlo_computations, torch_out


@pytest.mark.parametrize("scheme, levels", [("int8", 127), ("int4", 7)])
def test_quantized_weights_are_within_half_a_step_of_the_float_ones(scheme, levels):
    w = np.random.default_rng(0).standard_normal((24, 128)).astype(np.float32)
    w[3] = 0.0  # an all-zero row keeps a usable scale
    values, scale = quantize_array(w, scheme, 32)
    assert values.dtype == (np.int8 if scheme == "int8" else np.uint8)
    assert values.shape == ((24, 128) if scheme == "int8" else (24, 64))
    back = dequantize_array(values, scale, scheme, 32)
    step = np.repeat(scale, 32, axis=1) if scheme == "int4" else scale[:, None]
    assert np.all(np.abs(back - w) <= step / 2 + 1e-7)
    assert np.all(back[3] == 0) and np.abs(w).max() <= levels * step.max() + 1e-6


def test_int4_packs_the_column_halves_in_the_low_and_high_nibbles():
    w = np.array([[-7, 6, 0, -7]], np.float32)  # two groups of 2, each with scale max|w| / 7 = 1
    values, scale = quantize_array(w, "int4", 2)
    assert scale.tolist() == [[1.0, 1.0]]
    assert values.tolist() == [[0x09, 0x96]]  # (-7 & 0xF) | (0 << 4), 6 | ((-7 & 0xF) << 4): two's complement nibbles
    assert dequantize_array(values, scale, "int4", 2).tolist() == w.tolist()


def test_int4_with_an_odd_number_of_groups_pads_the_high_half():
    w = np.array([[1, -2, 3, -4, 5, -7]], np.float32)  # three groups of 2: columns 0-3 low, 4-5 high, then zeros
    values, scale = quantize_array(w, "int4", 2)
    assert values.shape == (1, 4) and scale.shape == (1, 3)
    assert [v >> 4 for v in values[0, 2:]] == [0, 0]
    np.testing.assert_allclose(dequantize_array(values, scale, "int4", 2), w, rtol=0, atol=scale.max() / 2)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 64)
        self.up = torch.nn.Linear(64, 128)
        self.down = torch.nn.Linear(128, 64, bias=False)
        self.norm = torch.nn.LayerNorm(64)
        self.head = torch.nn.Linear(64, 50, bias=False)
        self.head.weight = self.embed.weight  # tied: the embedding reads it too, so it stays float

    def forward(self, ids):
        h = self.embed(ids)
        return self.head(self.norm(h + self.down(torch.relu(self.up(h)))))


@pytest.mark.parametrize("scheme", ["int8", "int4", "int8-dynamic"])
def test_a_quantized_model_computes_what_torch_does_with_the_weights_dequantized(scheme, tmp_path):
    module = MLP().eval()
    ids = torch.randint(0, 50, (2, 7))
    jm = torch2jax.convert(module, (ids,), dynamic_shapes={"ids": {0: "batch", 1: "seq"}}, quantize=scheme, group_size=32)
    assert jm.quantization["params"] == ["up.weight", "down.weight"]  # not the tied embedding/head, the norm, the biases
    assert jm.params["up.weight"].dtype == (np.uint8 if scheme == "int4" else np.int8)
    assert jm.params["up.bias"].dtype == np.float32 and jm.params["embed.weight"].dtype == np.float32
    want = torch_out(quantize_like(module, jm.quantization), ids)
    np.testing.assert_allclose(np.asarray(jm(ids.numpy())), want.numpy(), rtol=1e-5, atol=1e-5)
    out = torch2jax.save(jm, tmp_path / scheme)
    for loaded in (torch2jax.load(out), torch2jax.load(out, from_graph=True)):
        assert loaded.quantization["scheme"] == scheme
        np.testing.assert_allclose(np.asarray(loaded(ids.numpy())), want.numpy(), rtol=1e-5, atol=1e-5)
    quantized = jm.quantization
    assert quantized["bytes_after"] < quantized["bytes_before"]


def test_int4_with_an_odd_number_of_groups_computes_what_torch_does():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.ReLU(), torch.nn.Linear(64, 96)).eval()  # 3 groups of 32
    for rows in (1, 3, 100):  # the matrix-vector product, the blocked rows, the whole weight
        x = torch.randn(rows, 96)
        jm = torch2jax.convert(module, (x,), quantize="int4", group_size=32)
        assert jm.params["0.weight"].shape == (64, 64)  # 96 columns: 64 in the low nibbles, 32 and padding in the high
        want = torch_out(quantize_like(module, jm.quantization), x)
        np.testing.assert_allclose(np.asarray(jm(x.numpy())), want.numpy(), rtol=1e-5, atol=1e-5)


class EmbedOnly(MLP):
    """The same params as MLP; forward reads only the embedding and the norm (as an image encoder reads none of the
    language model's projections)."""

    def forward(self, ids):
        return self.norm(self.embed(ids))


def test_another_entry_point_over_the_params_takes_the_quantized_placeholders():
    ids = torch.randint(0, 50, (2, 7))
    jm = torch2jax.convert(MLP().eval(), (ids,), quantize="int8")
    other = torch2jax.convert(EmbedOnly().eval(), (ids,))
    shared = share_quantized_params(other.graph, jm)
    placeholders = {inp.target: inp.meta for inp in shared.inputs if inp.kind == "parameter"}
    assert placeholders["up.weight"].dtype == "int8" and placeholders["up.weight_scale"].shape == [128]
    assert placeholders["norm.weight"].dtype == "float32"
    with pytest.raises(ExportError, match="2 quantized weights are also read by another entry point.*up.weight"):
        share_quantized_params(torch2jax.convert(MLP().eval(), (ids,)).graph, jm)


def test_dead_nodes_are_dropped_and_a_graph_without_any_is_kept():
    ids = torch.randint(0, 50, (2, 7))
    graph = torch2jax.convert(MLP().eval(), (ids,)).graph
    assert passes.drop_dead_nodes(graph) is graph
    product = next(node for node in graph.nodes if node.op == "aten.mm.default")
    dead = dataclasses.replace(product, name="unused_product")
    assert passes.drop_dead_nodes(dataclasses.replace(graph, nodes=[*graph.nodes, dead])).nodes == graph.nodes


def test_quantize_asks_for_a_known_scheme():
    with pytest.raises(InputSpecError, match="quantize must be one of int8, int4"):
        torch2jax.convert(MLP().eval(), (torch.zeros(1, 3, dtype=torch.long),), quantize="int3")
    with pytest.raises(InputSpecError, match="group_size must be an even integer"):
        torch2jax.convert(MLP().eval(), (torch.zeros(1, 3, dtype=torch.long),), quantize="int4", group_size=5)


def test_scales_are_sharded_with_their_weights():
    import jax
    from jax.sharding import PartitionSpec as P

    from torch2jax.runtime import sharding

    mesh = jax.make_mesh((1, 1), ("data", "model"))
    tree = {"q_proj.weight": ((128, 32), "uint8"), "q_proj.weight_scale": ((128, 2), "float32"),
            "o_proj.weight": ((64, 128), "int8"), "o_proj.weight_scale": ((64,), "float32"),
            "norm.weight": ((64,), "float32")}
    placed = sharding.plan(tree, sharding.auto_mesh(mesh), "auto", {"q_proj": "colwise", "o_proj": "rowwise"}).placements
    assert placed["q_proj.weight"].spec == P("model", None) and placed["q_proj.weight_scale"].spec == P("model", None)
    assert placed["o_proj.weight"].spec == P(None, "model") and placed["o_proj.weight_scale"].spec == P()  # one per row
    assert placed["q_proj.weight_scale"].rule == "with q_proj.weight"


@pytest.mark.parametrize("dynamic", [None, {"ids": {0: "batch", 1: "seq"}}], ids=["static", "symbolic-batch"])
def test_int8_dynamic_multiplies_int8_by_int8_without_a_float_weight(dynamic):
    # static shapes reach the Linears as mm of a flattened input; a symbolic batch as a matmul of the 3-d input
    module = LastPositionHead().eval()
    ids = torch.randint(0, 50, (2, 5))
    jm = torch2jax.convert(module, (ids,), dynamic_shapes=dynamic, quantize="int8-dynamic")
    jaxpr = jax.make_jaxpr(lambda p, x: jm.apply(p, x))(jm.params, ids.numpy())
    dots = [eqn for eqn in _eqns(jaxpr.jaxpr) if eqn.primitive.name == "dot_general"]
    int8_dots = [eqn for eqn in dots if all(v.aval.dtype == np.int8 for v in eqn.invars)]
    weights = {jm.params[name].shape for name in ("up.weight", "down.weight", "head.weight")}
    assert {tuple(v.aval.shape) for eqn in int8_dots for v in eqn.invars} >= weights  # each platform's branch has one
    assert all(eqn.outvars[0].aval.dtype == np.int32 for eqn in int8_dots)
    converts = [eqn for eqn in _eqns(jaxpr.jaxpr) if eqn.primitive.name == "convert_element_type"
                and eqn.invars[0].aval.dtype == np.int8 and tuple(eqn.invars[0].aval.shape) in weights]
    assert not converts, "an int8-dynamic weight was widened to float"


class LastPositionHead(MLP):
    """An untied head on the last position only, as a causal LM's: with a symbolic batch torch.export writes it as a
    bmm of the weight broadcast over the batch (passes.shared_matmul_operand makes that a matmul)."""

    def __init__(self):
        super().__init__()
        self.head.weight = torch.nn.Parameter(self.embed.weight.detach().clone())

    def forward(self, ids):
        h = self.embed(ids)
        h = self.norm(h + self.down(torch.relu(self.up(h))))
        return self.head(h[:, -1:, :])


def _eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.core.jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 8, 100])
def test_few_rows_never_write_the_float_weight_out_whole(scheme, rows):
    """On CPU a weight-only quantized Linear at 2 to 64 rows dequantizes a block of the weight's rows at a time, and at
    one row inside the matrix-vector product: no float32 copy of the whole weight in the compiled function (XLA:CPU
    writes one out before a matrix product; with 100 rows that is amortized, so it stays). Values as torch's with the
    weight dequantized."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).eval()  # 2 blocks
    x = torch.randn(rows, 64)
    jm = torch2jax.convert(module, (x,), quantize=scheme, group_size=32)
    want = torch_out(quantize_like(module, jm.quantization), x)
    np.testing.assert_allclose(np.asarray(jm(x.numpy())), want.numpy(), rtol=1e-5, atol=1e-5)
    hlo = jax.jit(jm.apply).lower(jm.params, x.numpy()).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    halves = ("f32[512,32]", "f32[512,256]") if scheme == "int4" else ()  # int4 unpacks each column half whole
    whole = [shape for shape in ("f32[512,64]", "f32[64,512]", "f32[512,512]", *halves) if shape in entry]
    assert bool(whole) == (rows > 64), whole
    if scheme == "int4" and rows == 1:  # each column half unpacks elementwise inside its product: nothing interleaved
        products = [c for c in hlo_computations(hlo) if " dot(" in c]
        assert products and not any("concatenate(" in c for c in products), products


def test_one_row_of_a_wide_int8_weight_never_writes_the_float_weight_out():
    """XLA:CPU fuses a dequantization into a one-row product only while the row is under 16 KiB; past that it wrote the
    float32 weight out transposed on every call (1536 x 4096: 14.5 ms for a 0.3 ms product). Past FUSED_ROW_FEATURES
    the row is multiplied in parts, each dequantizing its own columns inside its product: no float32 weight, whole or
    in part, is written out. Values as torch's with the weight dequantized."""
    from torch2jax.ops.linalg import FUSED_ROW_FEATURES

    torch.manual_seed(0)
    module = torch.nn.Linear(FUSED_ROW_FEATURES + 1024, 256).eval()
    x = torch.randn(1, FUSED_ROW_FEATURES + 1024)
    jm = torch2jax.convert(module, (x,), quantize="int8")
    want = torch_out(quantize_like(module, jm.quantization), x)
    np.testing.assert_allclose(np.asarray(jm(x.numpy())), want.numpy(), rtol=1e-4, atol=1e-4)
    hlo = jax.jit(jm.apply).lower(jm.params, x.numpy()).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    products = [c for c in hlo_computations(hlo) if " dot(" in c]
    assert len(products) == 2 and all("s8[" in c and "convert(" in c for c in products), products  # int8 read in the loop
    assert not any(shape in entry for shape in ("f32[256,4096]", "f32[4096,256]", "f32[256,2048]", "f32[2048,256]")), entry
