"""Fine-tuning a converted model in JAX, torch-free: LoRA adapters on its params (lora), the causal-LM loss (loss), the
training step and its batches (train), and the adapter handed back in PEFT's format (peft_format), so transformers + peft
load what JAX trained, or merged into a Hugging Face model directory (hf_format) that transformers loads alone."""

from __future__ import annotations

from .hf_format import save_merged
from .lora import LoraConfig, apply_fn, init_lora, merge, targeted_modules
from .loss import causal_lm_loss
from .peft_format import load_adapter, save_adapter
from .train import lora_train_step, make_batch, optimizer

__all__ = ["LoraConfig", "apply_fn", "causal_lm_loss", "init_lora", "load_adapter", "lora_train_step", "make_batch", "merge",
           "optimizer", "save_adapter", "save_merged", "targeted_modules"]
