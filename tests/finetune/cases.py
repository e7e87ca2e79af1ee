"""A tiny random Llama and GPT-2, converted with an attention mask, and labels with ignored positions."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
import peft
import torch

import torch2jax
from tests.generate.lms import build_lm
from torch2jax.finetune import LoraConfig, init_lora

# architecture -> (targets, fan_in_fan_out): GPT-2's c_attn and c_proj are Conv1D, weights stored [in, out] (attn.c_proj
# square, where only the flag tells the layout)
TARGETS = {"llama": (("q_proj", "v_proj"), False), "gpt2": (("c_attn", "c_proj"), True)}


def peft_model(base: torch.nn.Module, adapter, **kwargs) -> peft.PeftModel:
    """PEFT's loader on the CPU, where the base model is. Left to itself, peft loads onto torch's current
    accelerator, and once tests/eager has enabled the jax device in this worker that is `jax`, which
    safetensors cannot load to."""
    return peft.PeftModel.from_pretrained(base, adapter, torch_device="cpu", **kwargs)


@dataclass
class Case:
    name: str
    lm: torch.nn.Module
    model: torch2jax.Model
    config: LoraConfig
    lora: dict  # init_lora's, with B set to small random values so A's gradient is not zero
    ids: np.ndarray
    mask: np.ndarray
    labels: np.ndarray


def make_case(name: str) -> Case:
    lm = build_lm(name)
    lm.config.use_cache = False
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    labels = ids.clone()
    labels[mask == 0] = -100
    labels[0, :2] = -100  # a prompt not trained on
    model = torch2jax.convert(lm, (ids,), {"attention_mask": mask})
    targets, fan_in_fan_out = TARGETS[name]
    config = LoraConfig(rank=4, alpha=8.0, targets=targets, fan_in_fan_out=fan_in_fan_out)
    lora = init_lora(model.params, config, jax.random.key(0))
    rng = np.random.default_rng(2)
    lora = {k: (rng.standard_normal(v.shape).astype(np.float32) * 0.05 if k.endswith("lora_B") else np.asarray(v))
            for k, v in lora.items()}
    return Case(name, lm, model, config, lora, ids.numpy(), mask.numpy(), labels.numpy())


def peft_config(config: LoraConfig):
    import peft

    return peft.LoraConfig(r=config.rank, lora_alpha=config.alpha, target_modules=list(config.targets), lora_dropout=0.0,
                           fan_in_fan_out=config.fan_in_fan_out)


def lora_layers(peft_model) -> dict:
    """{module name as in the converted params: the PEFT LoRA layer} (the `base_model.model.` prefix dropped)."""
    from peft.tuners.lora import LoraLayer

    return {name.removeprefix("base_model.model."): module for name, module in peft_model.named_modules() if isinstance(module, LoraLayer)}
