"""Fine-tuning a converted model in JAX, torch-free: LoRA adapters on its params (lora), the causal-LM loss (loss), the
training step and its batches (train), and the adapter handed back in PEFT's format (peft_format), so transformers + peft
load what JAX trained, or merged into a Hugging Face model directory (hf_format) that transformers loads alone."""

from __future__ import annotations

from .full import model_parameters, parameter_names
from .hf_format import save_merged
from .lora import LoraConfig, apply_fn, check_targets, init_lora, lora_apply, merge, targeted_modules
from .loss import causal_lm_loss
from .peft_format import load_adapter, save_adapter
from .side_path import RowAdapters, init_adapter, lora_sizes, row_adapters
from .train import full_train_step, lora_train_step, make_batch, master_weights, optimizer

__all__ = ["LoraConfig", "RowAdapters", "apply_fn", "causal_lm_loss", "check_targets", "full_train_step", "init_adapter",
           "init_lora", "load_adapter", "lora_apply", "lora_sizes", "lora_train_step", "make_batch", "master_weights",
           "merge", "model_parameters", "optimizer", "parameter_names", "row_adapters", "save_adapter", "save_merged",
           "targeted_modules"]
