"""The gated delta rule (Qwen3-Next and its kin) traced with its triangular solver rather than transformers' export
fallback, a Python loop over the chunk's rows (torch2jax/hf/stand_ins/delta_rule.py)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import torch2jax
from benchmarks.hf_sweep import run
from torch2jax.hf.stand_ins import delta_rule


def test_qwen3_next_traces_one_triangular_solve_and_matches_torch():
    entry = run.load_configs()["qwen3_next"]
    module = run.build(entry, "Qwen3NextModel")
    inputs = run._accepted(module, run.make_inputs(entry["inputs"]))
    model = torch2jax.convert(module, (), inputs)
    ops = model.graph.ops()
    assert "aten.linalg_solve_triangular.default" in ops
    assert sum(node.op == "aten.slice_scatter.default" for node in model.graph.nodes) < 8, "no row-by-row inverse"
    with torch.no_grad():
        want = module(**inputs).last_hidden_state.numpy()
    got = model(**{k: v.numpy() for k, v in inputs.items()})
    np.testing.assert_allclose(np.asarray(got["last_hidden_state"]), want, rtol=1e-4, atol=1e-4)
    scope = sys.modules["transformers.models.qwen3_next.modeling_qwen3_next"].__dict__
    assert scope["is_torchdynamo_exporting"].__module__.startswith("transformers"), "the module's check is restored"


def test_every_listed_model_has_the_function_and_the_check_it_patches():
    """A transformers release that renames either would silently bring the loop back: fail here instead."""
    import importlib

    for name in delta_rule.MODELS:
        module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        assert callable(getattr(module, "torch_chunk_gated_delta_rule", None)), name
        assert callable(getattr(module, "is_torchdynamo_exporting", None)), name


def test_generation_of_a_model_with_recurrent_state_is_refused_by_name(tmp_path):
    """Bailing-hybrid's linear-attention layers keep a recurrent state of a mixer the generation artifact has no
    stand-in for (hf/stand_ins/mixers.py); Qwen3.5's, which it has, generate (tests/hf/test_gated_delta_generation.py).
    """
    import transformers

    config = transformers.BailingHybridConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, num_experts=4, num_experts_per_token=2, num_expert_group=1, topk_group=1,
        linear_num_heads=2, linear_head_dim=8, layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "dense"], pad_token_id=0, eos_token_id=1, bos_token_id=2)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    with pytest.raises(torch2jax.ExportError, match=r"recurrent state in its cache \(LinearAttentionLayer.*forward converts"):
        torch2jax.convert_hf(str(tmp_path), task="text-generation", max_cache_len=16, max_batch=1)
