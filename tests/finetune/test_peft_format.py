"""An adapter trained in JAX, saved in PEFT's format, loads into transformers + peft and computes what the merged
converted model computes; load_adapter reads it back torch-free."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from tests.finetune.cases import lora_layers, peft_model
from tests.generate.lms import build_lm
from torch2jax.errors import Torch2JaxError
from torch2jax.finetune import load_adapter, merge, save_adapter
from torch2jax.finetune.lora import LoraError


def test_peft_loads_the_adapter_and_its_logits_equal_the_merged_model(case, tmp_path):
    out = save_adapter(case.lora, case.config, tmp_path / "adapter", base_model_name_or_path=f"tiny-{case.name}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]  # no temporary sibling left
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = peft_model(build_lm(case.name), out).eval()
    assert not [str(w.message) for w in caught if "key" in str(w.message).lower()]
    loaded = pm.peft_config["default"]
    assert (loaded.peft_type, loaded.task_type, loaded.r, loaded.lora_alpha) == ("LORA", "CAUSAL_LM", 4, 8.0)
    assert set(loaded.target_modules) == set(case.config.targets) and loaded.fan_in_fan_out == case.config.fan_in_fan_out
    assert loaded.base_model_name_or_path == f"tiny-{case.name}"
    layers = lora_layers(pm)
    assert {f"{m}.{half}" for m in layers for half in ("lora_A", "lora_B")} == set(case.lora)
    for module, layer in layers.items():
        np.testing.assert_array_equal(layer.lora_A["default"].weight.detach().numpy(), case.lora[module + ".lora_A"])
        np.testing.assert_array_equal(layer.lora_B["default"].weight.detach().numpy(), case.lora[module + ".lora_B"])

    with torch.no_grad():
        theirs = pm(input_ids=torch.from_numpy(case.ids), attention_mask=torch.from_numpy(case.mask)).logits.numpy()
    ours = np.asarray(case.model.apply(merge(case.model.params, case.lora, case.config), case.ids, attention_mask=case.mask)["logits"])
    kept = case.mask.astype(bool)  # padded positions' logits are not compared
    np.testing.assert_allclose(ours[kept], theirs[kept], rtol=1e-4, atol=1e-4)
    base = np.asarray(case.model(case.ids, attention_mask=case.mask)["logits"])
    assert np.abs(base[kept] - theirs[kept]).max() > 1e-3  # the adapter changes the logits: the comparison means something

    lora, config = load_adapter(out)
    assert config == case.config
    assert set(lora) == set(case.lora)
    for key, value in lora.items():
        np.testing.assert_array_equal(value, case.lora[key])


def test_save_never_clobbers_without_force(case, tmp_path):
    out = save_adapter(case.lora, case.config, tmp_path / "adapter")
    with pytest.raises(Torch2JaxError, match="already exists; pass force=True"):
        save_adapter(case.lora, case.config, out)
    doubled = {k: v * 2 for k, v in case.lora.items()}
    save_adapter(doubled, case.config, out, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter"]
    np.testing.assert_array_equal(load_adapter(out)[0][next(iter(doubled))], next(iter(doubled.values())))


def test_load_adapter_refuses_what_it_cannot_apply(case, tmp_path):
    with pytest.raises(LoraError, match="not a PEFT adapter directory"):
        load_adapter(tmp_path)
    out = save_adapter(case.lora, case.config, tmp_path / "adapter")
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(LoraError, match="use_dora"):
        load_adapter(out)
    (out / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ".*q_proj"}))
    with pytest.raises(LoraError, match="is a regular expression"):
        load_adapter(out)
