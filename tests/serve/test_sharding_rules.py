"""How a sharding plan picks each param's spec: the user's rules, then the model's own tensor-parallel plan
(saved in the manifest at conversion), then the built-in rules. Specs only: a one-device mesh suffices."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
from jax.sharding import PartitionSpec as P

import torch2jax
from torch2jax.runtime.artifact import param_tree, read_manifest
from torch2jax.runtime.sharding import plan

TREE = {
    "model.layers.0.self_attn.q_proj.weight": ((64, 64), "float32"),
    "model.layers.0.self_attn.q_proj.bias": ((64,), "float32"),
    "model.layers.0.self_attn.o_proj.weight": ((64, 64), "float32"),
    "model.layers.0.self_attn.o_proj.bias": ((64,), "float32"),
    "model.layers.0.mlp.experts.gate_up_proj": ((4, 256, 64), "float32"),
    "model.layers.0.mlp.experts.down_proj": ((4, 64, 128), "float32"),
    "model.layers.0.custom_in.weight": ((64, 64), "float32"),
    "model.embed_tokens.weight": ((128, 64), "float32"),
}
HINTS = {
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.experts.gate_up_proj": "packed_colwise",
    "model.layers.*.mlp.experts.down_proj": "rowwise",
    "model.layers.*.custom_in": "colwise",  # a name the built-in rules do not know
    "model.layers.*.mlp.experts": "moe_tp_experts",  # a style without a spec: ignored
}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((1, 1), ("data", "model"))


def specs(sharding_plan) -> dict[str, P]:
    return {name: p.spec for name, p in sharding_plan.placements.items()}


def test_the_models_tp_plan_gives_column_and_row_parallel_specs(mesh):
    got = specs(plan(TREE, mesh, "auto", HINTS))
    assert got["model.layers.0.self_attn.q_proj.weight"] == P("model", None)
    assert got["model.layers.0.self_attn.q_proj.bias"] == P("model")
    assert got["model.layers.0.self_attn.o_proj.weight"] == P(None, "model")
    assert got["model.layers.0.self_attn.o_proj.bias"] == P(None)  # a row-parallel bias is added once, whole
    assert got["model.layers.0.mlp.experts.gate_up_proj"] == P(None, "model", None)
    assert got["model.layers.0.mlp.experts.down_proj"] == P(None, None, "model")
    assert got["model.layers.0.custom_in.weight"] == P("model", None)
    assert got["model.embed_tokens.weight"] == P()


def test_without_hints_unknown_names_stay_whole(mesh):
    got = specs(plan(TREE, mesh, "auto"))
    assert got["model.layers.0.custom_in.weight"] == P()
    assert got["model.layers.0.self_attn.q_proj.weight"] == P("model", None)  # the built-in rules know this one


def test_the_plan_overrides_the_built_in_rules_and_the_user_overrides_both(mesh):
    swapped = {"model.layers.*.self_attn.q_proj": "rowwise"}
    assert specs(plan(TREE, mesh, "auto", swapped))["model.layers.0.self_attn.q_proj.weight"] == P(None, "model")
    user = {"*.q_proj.weight": P()}
    assert specs(plan(TREE, mesh, user, swapped))["model.layers.0.self_attn.q_proj.weight"] == P()


def test_the_report_says_which_rule_chose_a_spec(mesh):
    text = str(plan(TREE, mesh, "auto", HINTS).report())
    assert "(model.layers.*.self_attn.q_proj.weight (the model's tp plan: colwise))" in text


def test_conversion_saves_the_models_tp_plan_in_the_manifest(sharded_lms, mesh):
    for path in (sharded_lms[0][0], sharded_lms[1][0]):  # the Llama forward pass and its generator
        manifest = read_manifest(Path(path))
        hints = manifest["params"]["sharding_hints"]
        assert hints["model.layers.*.self_attn.q_proj"] == "colwise"
        assert hints["model.layers.*.mlp.down_proj"] == "rowwise"
        placed = plan(param_tree(manifest), mesh, "auto", hints).placements["model.layers.1.mlp.down_proj.weight"]
        assert placed.spec == P(None, "model") and "the model's tp plan" in placed.rule


def test_a_model_without_a_plan_saves_none(tmp_path):
    import torch

    jm = torch2jax.convert(torch.nn.Linear(4, 2), (torch.ones(1, 4),))
    torch2jax.save(jm, tmp_path / "linear")
    assert "sharding_hints" not in read_manifest(tmp_path / "linear")["params"]
