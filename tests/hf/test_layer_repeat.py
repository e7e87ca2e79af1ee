"""A deep decoder traced at 3 and 4 layers with a middle layer repeated must be the program torch.export
gives when it traces every layer, and must fall back to tracing every layer where it would not be."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.generate.lms import PAD, build_lm, hf_greedy
from torch2jax.capture.converter import StageTimer
from torch2jax.hf.steps import causal_lm as decoder
from torch2jax.hf.steps.kv_cache import cache_layout
from torch2jax.hf.steps.layer_repeat import NotRepeatable, first_difference, repeat_layers
from torch2jax.ir.graph import Graph, GraphInput, GraphOutput, Node, TensorMeta

LAYERS = 6
REPEAT = decoder.SLICE_UNITS  # repeat from 5 units (the default, 10, would make these models slow to build)


def _capture(lm: torch.nn.Module, repeat: bool | int) -> tuple:
    notes: list[str] = []
    layout = cache_layout(lm, 32)
    captured = decoder.capture_step(lm, layout, 2, StageTimer(lambda stage, message: notes.append(message)), repeat=repeat)
    return captured, notes


@pytest.mark.parametrize("arch", [pytest.param("llama", marks=pytest.mark.slow), "gpt2",
                                  pytest.param("mixtral", marks=pytest.mark.slow)])  # llama, mixtral: the slowest builds
def test_the_repeated_graph_is_the_traced_graph(arch):
    lm = build_lm(arch, LAYERS)
    repeated, notes = _capture(lm, repeat=REPEAT)
    assert any("torch.export of 3 of the 6 layers" in n for n in notes), notes
    assert not any("of all" in n for n in notes), notes
    traced, _ = _capture(lm, repeat=False)
    assert first_difference(repeated.graph, traced.graph) is None
    assert list(repeated.tensors) == list(traced.tensors)
    assert all(repeated.tensors[k].data_ptr() == traced.tensors[k].data_ptr() for k in traced.tensors)  # the same weights
    assert repeated.graph.aliases == traced.graph.aliases


@pytest.mark.slow  # builds and traces two alternating stacks (~3 CPU-minutes); blocks of one layer repeat above
def test_alternating_layers_repeat_as_blocks():
    """Gemma2 alternates sliding and full attention layers: the repeated unit is a block of two."""
    lm = build_lm("gemma2", 12)
    repeated, notes = _capture(lm, repeat=REPEAT)
    assert any("torch.export of 6 of the 12 layers" in n for n in notes), notes
    assert any("repeat a middle block of 2 layers" in n for n in notes), notes
    traced, _ = _capture(lm, repeat=False)
    assert first_difference(repeated.graph, traced.graph) is None


@pytest.mark.slow  # traces every layer of a mixed stack (~50 s)
def test_layers_built_differently_are_all_traced():
    import transformers

    config = transformers.Qwen2MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                         num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=32, shared_expert_intermediate_size=64, mlp_only_layers=[3])
    lm = transformers.Qwen2MoeForCausalLM(config).eval()  # layer 3 is dense, the others MoE
    _, notes = _capture(lm, repeat=REPEAT)
    assert any("of all 6 layers (layer 3 is not built like layer 1)" in n for n in notes), notes
    assert not any("of 3 of the 6 layers" in n for n in notes), notes  # refused before tracing anything twice


@pytest.mark.slow  # traces 3, 4 and every layer (~100 s); the refusals below run in the default tier
def test_a_layer_that_reads_its_own_index_is_caught_by_the_four_layer_check(monkeypatch):
    """Built alike, computing differently (its forward reads `layer_idx`): only the comparison of 3 layers
    repeated to 4 against 4 traced can see it, and then every layer is traced."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaDecoderLayer.forward

    def scaled(self, *args, **kwargs):
        return original(self, *args, **kwargs) * (1.0 + self.self_attn.layer_idx)

    monkeypatch.setattr(modeling_llama.LlamaDecoderLayer, "forward", scaled)
    lm = build_lm("llama", LAYERS)
    _, notes = _capture(lm, repeat=REPEAT)
    assert any("of all 6 layers (3 layers repeated to 4 differ from 4 traced" in n for n in notes), notes


def test_a_repeated_deep_model_generates_what_transformers_does():
    lm = build_lm("llama", LAYERS)
    generator = decoder.convert_causal_lm(lm, max_cache_len=48, max_batch=2, repeat_layers=REPEAT)
    ids = torch.tensor([[5, 17, 33, 9], [PAD, 8, 21, 64]])
    mask = (ids != PAD).long()
    ours = generator.generate(ids.numpy(), attention_mask=mask.numpy(), max_new_tokens=12, eos_token_id=None)
    theirs = hf_greedy(lm, ids, 12, mask)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def _meta() -> TensorMeta:
    return TensorMeta("float32", [4])


def test_a_layer_that_reads_two_layers_back_is_refused():
    """Layer 2 reads layer 0's value: not a stack where each layer reads the one before it."""
    inputs = [GraphInput("x", "user_input", _meta())]
    nodes = [Node("a0", "aten.neg.default", [{"ref": "x"}], {}, _meta()),
             Node("a1", "aten.neg.default", [{"ref": "a0"}], {}, _meta()),
             Node("a2", "aten.add.Tensor", [{"ref": "a1"}, {"ref": "a0"}], {}, _meta())]
    graph = Graph(inputs, nodes, [GraphOutput("user_output", {"ref": "a2"})])
    with pytest.raises(NotRepeatable, match="layer 2 reads a0 of layer 0"):
        repeat_layers(graph, {"a0": 0, "a1": 1, "a2": 2}, 5, lambda i, src, dst: i)


def test_a_chain_of_layers_repeats_with_each_copy_reading_the_one_before():
    inputs = [GraphInput("x", "user_input", _meta())]
    nodes = [Node(f"a{i}", "aten.neg.default", [{"ref": "x" if i == 0 else f"a{i - 1}"}], {}, _meta()) for i in range(3)]
    nodes.append(Node("tail", "aten.exp.default", [{"ref": "a2"}], {}, _meta()))
    graph = Graph(inputs, nodes, [GraphOutput("user_output", {"ref": "tail"})])
    five = repeat_layers(graph, {"a0": 0, "a1": 1, "a2": 2}, 5, lambda i, src, dst: i)
    reads = {n.name: n.args[0]["ref"] for n in five.nodes}
    assert [n.name for n in five.nodes] == ["a0", "a1", "a1_layer2", "a1_layer3", "a2", "tail"]
    assert reads == {"a0": "x", "a1": "a0", "a1_layer2": "a1", "a1_layer3": "a1_layer2", "a2": "a1_layer3", "tail": "a2"}
