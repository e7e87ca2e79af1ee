"""LoRA as a side path of the converted graph: the same function of the adapters as merging them, an error for a
target no supported product reads, and per-row adapters over a generator's prefill and decode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch2jax
from tests.finetune.cases import Case, peft_model
from tests.generate.lms import load_lm, write_lm
from torch2jax.finetune import LoraConfig, apply_fn, causal_lm_loss, load_adapter, lora_apply, merge, row_adapters, save_adapter
from torch2jax.finetune.lora import LoraError
from torch2jax.generate.loop import call_entry
from torch2jax.ir import dtypes
from torch2jax.lowering import interpreter, passes
from torch2jax.lowering.lora_paths import LORA, LoraPathError, LoraTarget, with_lora_paths

ID = dtypes.jax_dtype("int64")  # int32 unless jax runs with x64, as the generator passes ids
EMBEDDING = {"llama": "model.embed_tokens", "gpt2": "transformer.wte"}
ADAPTED = {"llama": "model.layers.0.self_attn.q_proj", "gpt2": "transformer.h.0.attn.c_attn"}


def relative_error(ours, theirs) -> float:
    return float(np.linalg.norm(np.asarray(ours) - np.asarray(theirs)) / np.linalg.norm(np.asarray(theirs)))


def test_side_path_equals_the_merge_in_logits_and_gradients(case: Case):
    merged, side = apply_fn(case.model, case.config), lora_apply(case.model, case.config)

    def loss(fn):
        return lambda lora: causal_lm_loss(fn(lora, case.model.params, case.ids, attention_mask=case.mask)["logits"],
                                           case.labels)

    want_loss, want = jax.value_and_grad(loss(merged))(case.lora)
    ours_loss, ours = jax.value_and_grad(loss(side))(case.lora)
    logits = side(case.lora, case.model.params, case.ids, attention_mask=case.mask)["logits"]
    reference = merged(case.lora, case.model.params, case.ids, attention_mask=case.mask)["logits"]
    base = case.model.apply(case.model.params, case.ids, attention_mask=case.mask)["logits"]
    assert np.abs(np.asarray(reference) - base).max() > 1e-2, "the adapter must change the logits, or this proves nothing"
    np.testing.assert_allclose(np.asarray(logits), np.asarray(reference), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(ours_loss), float(want_loss), rtol=1e-5)
    assert set(ours) == set(want) == set(case.lora)
    for name in want:
        assert np.abs(np.asarray(want[name])).max() > 0, name
        assert relative_error(ours[name], want[name]) < 1e-5, name


def test_the_graph_gets_one_side_path_per_product_of_a_target(case: Case):
    graph = passes.optimize(case.model.graph)
    module = ADAPTED[case.name]
    target = LoraTarget(4, 2.0, case.config.fan_in_fan_out)
    new = with_lora_paths(graph, {module: target})
    paths = [node for node in new.nodes if node.op == LORA]
    assert len(paths) == 1 and paths[0].args[4] == 2.0
    assert {i.target for i in new.inputs} - {i.target for i in graph.inputs} == {f"{module}.lora_A", f"{module}.lora_B"}
    stacked = with_lora_paths(graph, {module: target}, per_row=3)
    shapes = {i.target: i.meta.shape for i in stacked.inputs if i.target and "lora" in i.target}
    assert [len(shape) for shape in shapes.values()] == [3, 3] and all(shape[0] == 3 for shape in shapes.values())
    assert stacked.user_inputs[-1].name == "adapter_ids" and stacked.user_inputs[-1].meta.dtype == "int32"
    assert stacked.in_spec["children"][1]["keys"][-1] == "adapter_ids"


def test_a_target_read_by_another_op_is_an_error_naming_the_weight_and_the_op(case: Case):
    graph = passes.optimize(case.model.graph)
    embedding = EMBEDDING[case.name]
    with pytest.raises(LoraPathError, match=rf"{embedding}\.weight is read by aten\.embedding\.default"):
        with_lora_paths(graph, {embedding: LoraTarget(4, 1.0, case.config.fan_in_fan_out)})
    with pytest.raises(LoraPathError, match=r"\['model\.nowhere'\] have no `\.weight`"):
        with_lora_paths(graph, {"model.nowhere": LoraTarget(4, 1.0)})
    # the adapter's layout flag must say what the graph does with the weight (a Conv1D reads it as stored)
    flipped = not case.config.fan_in_fan_out
    with pytest.raises(LoraPathError, match=rf"set fan_in_fan_out={case.config.fan_in_fan_out}"):
        with_lora_paths(graph, {ADAPTED[case.name]: LoraTarget(4, 1.0, flipped)})


def test_per_row_adapters_on_the_training_graph(case: Case):
    """Rows of one batch with different adapters: row b gives what the model merged with its adapter gives."""
    other = {k: np.asarray(v) * (-1.5 if k.endswith("lora_B") else 0.5) for k, v in case.lora.items()}
    rows = row_adapters({"forward": case.model}, [(case.lora, case.config), (other, case.config)])
    assert rows.count == 2
    for ids in ([1, -1], [0, 1]):
        out = rows.steps["forward"](case.model.params, rows.lora, case.ids, attention_mask=case.mask,
                                    adapter_ids=np.array(ids, np.int32))["logits"]
        for row, chosen in enumerate(ids):
            params = case.model.params if chosen < 0 else merge(case.model.params, [case.lora, other][chosen], case.config)
            want = case.model.apply(params, case.ids, attention_mask=case.mask)["logits"][row]
            np.testing.assert_allclose(np.asarray(out[row]), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def generator(tmp_path_factory):
    """A tiny Llama converted for generation, saved, and loaded back (its entries run from the StableHLO), and two
    PEFT adapter directories: different ranks, alphas and target modules."""
    root = tmp_path_factory.mktemp("side_path")
    source = write_lm("llama", root)
    g = torch2jax.load(torch2jax.save(torch2jax.convert_hf(source, max_cache_len=32, max_batch=4), root / "artifact"))
    configs = [LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")),
               LoraConfig(rank=2, alpha=6.0, targets=("q_proj", "o_proj", "down_proj"))]
    rng = np.random.default_rng(5)
    dirs = []
    for i, config in enumerate(configs):
        lora = {}
        for name, value in g.params.items():
            module = name.removesuffix(".weight")
            if name.endswith(".weight") and value.ndim == 2 and module.rpartition(".")[2] in config.targets:
                out, inp = value.shape
                lora[f"{module}.lora_A"] = rng.standard_normal((config.rank, inp)).astype(np.float32) * 0.2
                lora[f"{module}.lora_B"] = rng.standard_normal((out, config.rank)).astype(np.float32) * 0.2
        dirs.append(save_adapter(lora, config, root / f"adapter{i}"))
    return source, g, dirs


def _prefill_inputs(g, ids: np.ndarray) -> tuple:
    batch, length = ids.shape
    positions = np.broadcast_to(np.arange(length), (batch, length))
    return (jnp.asarray(ids, ID), jnp.asarray(positions, ID), jnp.asarray(positions, ID),  # each row's own slots
            jnp.ones((batch, length), bool), g.new_cache(batch))


def _decode_inputs(g, token: np.ndarray, length: int, cache) -> tuple:
    batch = token.shape[0]
    return (jnp.asarray(token[:, None], ID), jnp.full((batch, 1), length, ID),
            jnp.full((batch, 1), length, ID), jnp.ones((batch, length + 1), bool), cache)


def test_per_row_adapters_on_prefill_and_decode_give_each_row_its_merged_model(generator):
    source, g, dirs = generator
    adapters = [load_adapter(d) for d in dirs]
    rows = row_adapters(g.entries(), adapters)
    assert set(rows.steps) == {"prefill", "decode"} and rows.count == 2
    choice = [0, 1, -1]
    ids = np.random.default_rng(0).integers(3, 128, (3, 7))
    prefill = jax.jit(rows.steps["prefill"])
    logits, cache = prefill(g.params, rows.lora, *_prefill_inputs(g, ids), adapter_ids=np.array(choice, np.int32))
    assert logits.shape == (3, 128)  # the last position's
    token = np.asarray(jnp.argmax(logits, axis=-1))
    decoded, _ = rows.steps["decode"](g.params, rows.lora, *_decode_inputs(g, token, ids.shape[1], cache),
                                      adapter_ids=np.array(choice, np.int32))

    outputs = {}
    for chosen in (0, 1, -1):  # the reference: the whole batch through the artifact's own entries, merged params
        params = g.params if chosen < 0 else merge(g.params, *adapters[chosen])
        want, want_cache = call_entry(g.prefill_model, params, *_prefill_inputs(g, ids))
        want_decoded, _ = call_entry(g.decode_model, params, *_decode_inputs(g, token, ids.shape[1], want_cache))
        outputs[chosen] = (np.asarray(want), np.asarray(want_decoded))
    assert np.abs(outputs[0][0] - outputs[-1][0]).max() > 1e-2 and np.abs(outputs[1][0] - outputs[-1][0]).max() > 1e-2
    for row, chosen in enumerate(choice):
        np.testing.assert_allclose(np.asarray(logits[row]), outputs[chosen][0][row], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(decoded[row]), outputs[chosen][1][row], rtol=1e-5, atol=1e-5)

    # and transformers + peft on the adapter directory, for the rows with an adapter
    for row, chosen in enumerate(choice[:2]):
        pm = peft_model(load_lm(source), str(dirs[chosen])).eval()
        with torch.no_grad():
            theirs = pm(input_ids=torch.from_numpy(ids[row:row + 1])).logits[0, -1].numpy()
        np.testing.assert_allclose(np.asarray(logits[row]), theirs, rtol=1e-4, atol=1e-4)


def test_row_adapters_refuse_an_adapter_that_does_not_fit(generator):
    _, g, dirs = generator
    lora, config = load_adapter(dirs[0])
    bad = {k: (v[:, :-1] if k.endswith("lora_A") else v) for k, v in lora.items()}
    with pytest.raises(LoraError, match=r"adapter 1: .*lora_A \(4, 63\)"):
        row_adapters(g.entries(), [(lora, config), (bad, config)])
    rows = row_adapters(g.entries(), [(lora, config)])
    ids = np.random.default_rng(0).integers(3, 128, (3, 7))
    with pytest.raises(LoraError, match=r"one adapter index per row, int32 \[3\] .*got shape \[2\]"):
        rows.steps["prefill"](g.params, rows.lora, *_prefill_inputs(g, ids), adapter_ids=np.array([0, -1], np.int32))
    with pytest.raises(LoraError, match=r"adapter_ids \[0, 1, -1\]: each must be an adapter's index, 0 to 0, or -1"):
        rows.steps["prefill"](g.params, rows.lora, *_prefill_inputs(g, ids), adapter_ids=np.array([0, 1, -1], np.int32))
    with pytest.raises(LoraError, match="at least one adapter"):
        row_adapters(g.entries(), [])


def test_the_raw_graph_forms_get_the_same_side_paths(case: Case):
    """The graph as converted, before passes.optimize (what a user's own lowering of mm / addmm leaves): a Linear's
    mm(x, permute(W)), a Conv1D's addmm(b, x, W), the same values as the optimized graph's side paths."""
    targets = {module: LoraTarget(case.config.rank, case.config.scaling, case.config.fan_in_fan_out)
               for module in sorted({k.rpartition(".")[0] for k in case.lora})}
    raw = with_lora_paths(case.model.graph, targets)
    assert sum(node.op == LORA for node in raw.nodes) == len(targets)
    run = interpreter.build(raw)
    leaves = [case.ids, case.mask]
    ours = run({**case.model.params, **case.lora}, leaves)[0][0]
    want = lora_apply(case.model, case.config)(case.lora, case.model.params, case.ids, attention_mask=case.mask)["logits"]
    np.testing.assert_allclose(np.asarray(ours), np.asarray(want), rtol=1e-5, atol=1e-5)
