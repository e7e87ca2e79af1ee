"""A LoRA configuration that cannot apply fails at once, naming the problem."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from torch2jax.finetune import LoraConfig, init_lora, merge
from torch2jax.finetune.lora import LoraError

PARAMS = {"model.layers.0.self_attn.q_proj.weight": np.zeros((8, 4), np.float32),
          "model.layers.0.self_attn.q_proj.bias": np.zeros((8,), np.float32),
          "model.norm.weight": np.ones((4,), np.float32)}


@pytest.mark.parametrize("kwargs, message", [
    (dict(rank=4, alpha=8, targets=("q_proj",), dropout=0.1), r"dropout=0.1 is not supported yet"),
    (dict(rank=0, alpha=8, targets=("q_proj",)), r"rank must be an integer >= 1, got 0"),
    (dict(rank=2.5, alpha=8, targets=("q_proj",)), r"rank must be an integer >= 1, got 2.5"),
    (dict(rank=4, alpha=8, targets=()), r"targets must name at least one module suffix"),
])
def test_a_bad_config_is_refused(kwargs, message):
    with pytest.raises(LoraError, match=message):
        LoraConfig(**kwargs)


def test_a_target_matching_nothing_is_named():
    with pytest.raises(LoraError, match=r"\['v_proj'\] match no 2-D `.weight`.*\['q_proj'\]"):
        init_lora(PARAMS, LoraConfig(rank=2, alpha=4, targets=("q_proj", "v_proj")), jax.random.key(0))
    with pytest.raises(LoraError, match=r"\['norm'\] match no 2-D"):  # a 1-D weight is no target
        init_lora(PARAMS, LoraConfig(rank=2, alpha=4, targets=("norm",)), jax.random.key(0))


def test_targets_match_whole_name_parts_as_peft_does():
    lora = init_lora(PARAMS, LoraConfig(rank=2, alpha=4, targets="self_attn.q_proj"), jax.random.key(0))
    assert sorted(lora) == ["model.layers.0.self_attn.q_proj.lora_A", "model.layers.0.self_attn.q_proj.lora_B"]
    with pytest.raises(LoraError, match="match no"):
        init_lora(PARAMS, LoraConfig(rank=2, alpha=4, targets=("proj",)), jax.random.key(0))  # `proj` is no whole part


def test_an_adapter_that_does_not_fit_the_weight_is_refused():
    config = LoraConfig(rank=2, alpha=4, targets=("q_proj",))
    lora = init_lora(PARAMS, config, jax.random.key(0))
    with pytest.raises(LoraError, match=r"do not fit the weight \(8, 4\) at rank 2.*fan_in_fan_out"):
        merge(PARAMS, lora, LoraConfig(rank=2, alpha=4, targets=("q_proj",), fan_in_fan_out=True))
    with pytest.raises(LoraError, match="lack a half"):
        merge(PARAMS, {"model.layers.0.self_attn.q_proj.lora_A": lora["model.layers.0.self_attn.q_proj.lora_A"]}, config)
