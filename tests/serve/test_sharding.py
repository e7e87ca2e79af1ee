"""Serving on a mesh: artifacts loaded with `mesh=` on 8 simulated CPU devices (in a subprocess, so the rest
of the suite keeps one device) give the unsharded outputs, with the big matrices really split."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torch2jax
from tests.helpers import cli
from tests.serve.conftest import SHARDED_ARCHITECTURES

PROBE = Path(__file__).with_name("sharded_probe.py")
ARCHITECTURES = SHARDED_ARCHITECTURES


@pytest.fixture(scope="module")
def probe(sharded_lms, tmp_path_factory) -> dict:
    forwards, gens = sharded_lms
    target = tmp_path_factory.mktemp("probe") / "probe.json"
    result = subprocess.run([sys.executable, str(PROBE), str(target), *forwards, "--", *gens],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(target.read_text())


def test_the_probe_ran_on_eight_devices(probe):
    assert probe["devices"] == 8


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_sharded_call_equals_the_unsharded_one(probe, name):
    out = probe["forward"][f"{name}_forward"]
    assert out["exported"] < 1e-5 and out["graph"] < 1e-5  # the deserialized StableHLO and the rebuilt graph
    assert out["output_spec"] == "P('data',)"  # the batch went over the data axis


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_large_matrices_are_split_across_the_model_axis(probe, name):
    out = probe["forward"][f"{name}_forward"]
    assert not out["q_replicated"]
    assert out["q_shard_bytes"] * 4 == out["q_bytes"]  # model axis of 4: a quarter per device
    assert out["per_device"] < 0.5 * out["total"]  # embeddings and norms stay whole, the blocks are split


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_sharded_generate_equals_the_unsharded_one(probe, name):
    out = probe["generate"][f"{name}_generate"]
    assert out["equal"] and not out["q_replicated"]
    assert out["cache_spec"].startswith("P('data'")  # cache rows follow the batch
    assert out["decode_collectives"]["all-reduce"] > 0  # the report compiles a decode step: row-parallel sums


def test_sharded_int4_generate_equals_the_unsharded_one(probe):
    out = probe["generate"]["llama_int4_generate"]
    assert out["equal"] and not out["q_replicated"]


def test_collective_counts_of_the_compiled_step_are_pinned(probe):
    """A 2-layer Llama (4 heads, 2 kv heads) on (data=2, model=4), jax 0.10's XLA: a sharding change that adds
    communication shows up here. Sharding the embedding on its hidden dim costs more collectives."""
    auto = probe["forward"]["llama_forward"]["collectives"]
    assert auto == {"all-reduce": 10, "all-gather": 6, "reduce-scatter": 0, "all-to-all": 8, "collective-permute": 4}
    hidden = probe["errors"]["override_collectives"]
    assert sum(hidden.values()) > sum(auto.values())


def test_report_lists_specs_bytes_and_collectives(probe):
    text = probe["forward"]["llama_forward"]["report"]
    assert "mesh (data=2, model=4), 8 devices" in text
    assert "model.layers.0.self_attn.q_proj.weight" in text and "P('model', None)" in text
    assert "per device" in text and "collectives in the compiled step: all-reduce 10" in text


def test_user_rules_override_the_auto_ones(probe):
    override = probe["errors"]["override"]
    assert override["model.layers.0.self_attn.q_proj.weight"] == "P(None, 'model')"
    assert override["model.embed_tokens.weight"] == "P(None, 'model')"
    assert override["model.layers.0.self_attn.k_proj.weight"] == "P('model', None)"  # no user rule: auto
    assert probe["errors"]["replicated"]


@pytest.mark.parametrize("case, message", [
    ("not_divisible", "rule '*.q_proj.weight' does not fit param 'model.layers.0.self_attn.q_proj.weight' [64, 64]: "
                      "dim 0 (64) is not divisible by mesh axis model (3 devices)"),
    ("rank", "rule '*.norm.weight' does not fit param 'model.norm.weight' [64]: the spec P('model', None) has 2 dims"),
    ("axis", "rule '*.q_proj.weight' uses mesh axis 'tensor', but the mesh has axes ('data', 'model')"),
    ("not_a_rule", "give a PartitionSpec"),
])
def test_a_rule_that_cannot_apply_fails_naming_param_and_axis(probe, case, message):
    assert message in probe["errors"][case]


def test_an_auto_rule_that_does_not_divide_keeps_the_param_whole_and_says_why(probe):
    auto = probe["errors"]["auto_on_three"]
    assert auto["q_replicated"]
    assert "replicated: dim 0 (64) is not divisible by mesh axis model (3 devices)" in auto["report"]


def test_sharding_without_a_mesh_is_refused(tmp_path):
    with pytest.raises(torch2jax.ShardingError, match="sharding= needs mesh="):
        torch2jax.load(tmp_path, sharding={"*": None})


def test_cli_inspect_reports_the_plan_on_a_simulated_mesh(sharded_lms, tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_text('{"*.q_proj.weight": [null, "model"]}')
    result = cli("inspect", sharded_lms[0][0], "--mesh", "data=2,model=4", "--sharding", str(rules))
    assert result.returncode == 0, result.stderr
    assert "mesh (data=2, model=4), 8 devices" in result.stdout
    assert re.search(r"model.layers.0.self_attn.q_proj.weight +\[64, 64\] +P\(None, 'model'\)", result.stdout)
    assert "collectives in the compiled step: all-reduce" in result.stdout


@pytest.mark.parametrize("mesh, message", [("model=x", "give the mesh as AXIS=N pairs"),
                                           ("data=0,model=4", "give the mesh as AXIS=N pairs")])
def test_cli_inspect_rejects_a_bad_mesh(sharded_lms, mesh, message):
    result = cli("inspect", sharded_lms[0][0], "--mesh", mesh)
    assert result.returncode != 0 and message in result.stderr
    assert "Traceback" not in result.stderr
