"""LoRA gradients through a converted LM equal PEFT's through torch autograd, Conv1D (GPT-2) included."""

from __future__ import annotations

import jax
import numpy as np
import peft
import pytest
import torch

from tests.finetune.cases import lora_layers, peft_config
from torch2jax.finetune import apply_fn, causal_lm_loss, init_lora, merge, targeted_modules


def relative_error(ours, theirs) -> float:
    return float(np.linalg.norm(np.asarray(ours) - theirs) / np.linalg.norm(theirs))


def test_gradients_equal_peft_and_torch_autograd(case):
    fn = apply_fn(case.model, case.config)

    def loss(lora):
        return causal_lm_loss(fn(lora, case.model.params, case.ids, attention_mask=case.mask)["logits"], case.labels)

    ours_loss, ours = jax.value_and_grad(loss)(case.lora)

    pm = peft.get_peft_model(case.lm, peft_config(case.config))
    layers = lora_layers(pm)
    assert sorted(layers) == sorted(targeted_modules(case.model.params, case.config))
    with torch.no_grad():
        for module, layer in layers.items():
            layer.lora_A["default"].weight.copy_(torch.tensor(case.lora[module + ".lora_A"]))
            layer.lora_B["default"].weight.copy_(torch.tensor(case.lora[module + ".lora_B"]))
    out = pm(input_ids=torch.from_numpy(case.ids), attention_mask=torch.from_numpy(case.mask), labels=torch.from_numpy(case.labels))
    out.loss.backward()
    pm.unload()  # the module-scoped lm back to its own layers

    np.testing.assert_allclose(float(ours_loss), out.loss.item(), rtol=1e-5)
    assert set(ours) == {f"{m}.{half}" for m in layers for half in ("lora_A", "lora_B")}
    for module, layer in layers.items():
        for half in ("lora_A", "lora_B"):
            theirs = getattr(layer, half)["default"].weight.grad.numpy()
            assert np.abs(theirs).max() > 0, f"{module}.{half}: a zero gradient proves nothing"
            assert relative_error(ours[f"{module}.{half}"], theirs) < 1e-4, f"{module}.{half}"


def test_base_params_get_no_gradient_and_a_fresh_adapter_changes_nothing(case):
    """apply_fn differentiates the adapters alone; init_lora's B = 0 leaves the model as converted."""
    fresh = init_lora(case.model.params, case.config, jax.random.key(3))
    for module in targeted_modules(case.model.params, case.config):
        assert not np.any(np.asarray(fresh[module + ".lora_B"]))
    merged = merge(case.model.params, fresh, case.config)
    for name, value in case.model.params.items():
        np.testing.assert_array_equal(np.asarray(merged[name]), np.asarray(value), err_msg=name)
    grads = jax.grad(lambda lora, params: apply_fn(case.model, case.config)(lora, params, case.ids, attention_mask=case.mask)
                     ["logits"].sum(), argnums=0)(fresh, case.model.params)
    assert set(grads) == set(fresh)


@pytest.mark.parametrize("fan_in", [64, 128])
def test_init_is_torch_kaiming_uniform_with_a_sqrt5(fan_in):
    """PEFT's lora_A init: bound 1/sqrt(in), the same as torch's kaiming_uniform_(a=sqrt(5)) computes."""
    import math

    from torch2jax.finetune import LoraConfig

    params = {"layer.proj.weight": np.zeros((32, fan_in), np.float32)}
    lora = init_lora(params, LoraConfig(rank=8, alpha=16, targets=("proj",)), jax.random.key(0))
    a = np.asarray(lora["layer.proj.lora_A"])
    reference = torch.empty(8, fan_in)
    torch.nn.init.kaiming_uniform_(reference, a=math.sqrt(5))
    bound = 1 / math.sqrt(fan_in)
    assert a.shape == (8, fan_in) and lora["layer.proj.lora_B"].shape == (32, 8)
    assert np.abs(a).max() <= bound and np.abs(a).max() > 0.9 * bound
    assert np.abs(reference.numpy()).max() <= bound and abs(a.std() - reference.numpy().std()) < 0.1 * bound
