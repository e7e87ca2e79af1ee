"""What fine-tuning a Hugging Face causal LM needs from transformers: the training forward converted (logits for a
batch of token ids and an attention mask, the KV cache off), the LoRA targets and their layout read from the model's
layers, the end and padding tokens, and the arguments checked. pipeline/finetune.py runs it all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputSpecError
from ..finetune.lora import LoraConfig, LoraError
from .directory import load_model, prepare_for_export, transformers
from .tasks import IMAGE_TEXT_TO_TEXT, TEXT_GENERATION, auto_class, default_task

# module-name suffixes tried in order when no LoRA targets are given: the attention's query and value projections,
# as PEFT's defaults for the common architectures
DEFAULT_TARGETS = (("q_proj", "v_proj"), ("c_attn",), ("query_key_value",), ("qkv_proj",), ("Wqkv",), ("query", "value"))
DEFAULT_LORA_RANK, DEFAULT_LORA_ALPHA = 8, 8.0  # PEFT's LoraConfig defaults


@dataclass(frozen=True)
class Method:
    """LoRA (rank, alpha, targets; None where not given: the defaults) or full fine-tuning."""

    full: bool = False
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_targets: Sequence[str] | None = None

    def check(self) -> None:
        given = [flag for flag, value in (("--lora-rank", self.lora_rank), ("--lora-alpha", self.lora_alpha),
                                          ("--lora-targets", self.lora_targets)) if value is not None]
        if self.full and given:
            raise InputSpecError(f"--full trains every weight, so {', '.join(given)} do not apply: drop them, or drop --full "
                                 "to train a LoRA adapter")
        if self.lora_rank is not None and self.lora_rank < 1:
            raise InputSpecError(f"--lora-rank must be an integer >= 1, got {self.lora_rank}")
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            raise InputSpecError(f"--lora-alpha must be > 0, got {self.lora_alpha}")
        if self.lora_targets is not None and not [t for t in self.lora_targets if t]:
            raise InputSpecError("--lora-targets names no module: give comma-separated module-name suffixes, e.g. q_proj,v_proj")


TRAINING_DTYPES = ("float32", "bfloat16")
LORA_DEFAULTS = Method()  # LoRA with the default rank, alpha and targets


def load_for_training(directory: Path, config: Any) -> Any:
    """The directory's model as transformers loads it (every weight from the checkpoint), its progress bar off: a
    causal LM, or an image-text-to-text model whose language part is trained on text (its vision tower unused)."""
    task = default_task(config)
    if task not in (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT):
        raise InputSpecError(f"{directory} holds a {task} model (config.json's architectures): finetune trains causal "
                             "LMs and the language part of image-text-to-text models")
    logging = transformers().utils.logging
    bar = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # its bar would break into our progress line
    try:
        return load_model(auto_class(task, config), directory)
    finally:
        if bar:
            logging.enable_progress_bar()


def text_layers(module: Any) -> set[str]:
    """The names of the linear layers (Linear, Conv1D) a text-only forward runs: a vision-language model's language
    part, all of a causal LM's."""
    import torch

    conv1d = transformers().pytorch_utils.Conv1D
    called: set[str] = set()
    hooks = [m.register_forward_hook(lambda m, i, o, name=name: called.add(name))
             for name, m in module.named_modules() if isinstance(m, (torch.nn.Linear, conv1d))]
    try:
        with torch.no_grad():
            module(input_ids=torch.full((1, 4), 3, dtype=torch.long), attention_mask=torch.ones(1, 4, dtype=torch.long))
    finally:
        for hook in hooks:
            hook.remove()
    return called


def training_forward(module: Any, batch_size: int, max_length: int, seed: int = 0, dtype: str = "float32") -> Any:
    """The causal LM's forward as a torch2jax Model: `apply(params, ids, attention_mask=)["logits"]` for int
    [batch_size, max_length] inputs, the KV cache off, dropout off; weights and compute in `dtype` ("float32" or
    "bfloat16": the trainer keeps float32 copies of what it trains)."""
    if dtype not in TRAINING_DTYPES:
        raise InputSpecError(f"--dtype {dtype!r} is not one of {list(TRAINING_DTYPES)}")
    import torch

    import torch2jax

    prepare_for_export(module)
    module = module.float().eval()
    for config in (module.config, getattr(module.config, "text_config", None)):
        if config is not None:
            config.use_cache = False
    generator = torch.Generator().manual_seed(seed)
    vocab = module.get_input_embeddings().num_embeddings
    ids = torch.randint(0, vocab, (batch_size, max_length), generator=generator)
    mask = torch.ones(batch_size, max_length, dtype=torch.long)
    mask[-1, max_length // 2:] = 0  # right padding in the example, as the batches have: the mask is not specialized away
    return torch2jax.convert(module, (ids,), {"attention_mask": mask}, dtype=None if dtype == "float32" else dtype)


def lora_config(module: Any, method: Method) -> LoraConfig:
    """The LoRA config for this model: targets as given or the first of DEFAULT_TARGETS it has, fan_in_fan_out where
    the targeted layers are transformers' Conv1D (weights stored [in, out], GPT-2's), as PEFT sets it."""
    conv1d = transformers().pytorch_utils.Conv1D
    import torch

    used = text_layers(module)
    layers = {name: type(m) for name, m in module.named_modules() if name in used}

    def matching(target: str) -> list[str]:
        return [name for name in layers if name == target or name.endswith("." + target)]

    if method.lora_targets is None:
        targets = next((ts for ts in DEFAULT_TARGETS if all(matching(t) for t in ts)), None)
        if targets is None:
            leaves = sorted({name.rpartition(".")[2] for name in layers})
            raise InputSpecError(f"no default LoRA targets for {type(module).__name__}: name them with --lora-targets, "
                                 f"from the linear layers' names: {leaves}")
    else:
        targets = tuple(t for t in method.lora_targets if t)
        missing = [t for t in targets if not matching(t)]
        if missing:
            leaves = sorted({name.rpartition(".")[2] for name in layers})
            raise InputSpecError(f"--lora-targets {missing} match no linear layer of {type(module).__name__}; its linear "
                                 f"layers' names end in {leaves}")
    everywhere = [name for name, m in module.named_modules() if isinstance(m, (torch.nn.Linear, conv1d))
                  and any(name == t or name.endswith("." + t) for t in targets)]
    if any(name not in used for name in everywhere):
        # a vision tower has layers of the same names: the adapter names the language part's layers one by one
        targets = tuple(sorted(name for t in targets for name in matching(t)))
    kinds = {layers[name] is conv1d for t in targets for name in matching(t)}
    if len(kinds) > 1:
        raise InputSpecError(f"--lora-targets {list(targets)} mix Conv1D layers (weights stored [in, out]) and Linear ones; "
                             "adapt one kind per run")
    try:
        return LoraConfig(rank=method.lora_rank or DEFAULT_LORA_RANK,
                          alpha=DEFAULT_LORA_ALPHA if method.lora_alpha is None else float(method.lora_alpha),
                          targets=targets, fan_in_fan_out=kinds == {True})
    except LoraError as err:
        raise InputSpecError(str(err)) from None


def special_ids(directory: Path, config: Any) -> tuple[int | None, int]:
    """(the end token that closes each trained text, the padding id): the generation config's end token (the first
    of a list), else the config's; padding the config's pad token, else the end token, else 0 (masked out anyway)."""
    generation = directory / "generation_config.json"
    eos = None
    if generation.is_file():
        import json

        eos = json.loads(generation.read_text()).get("eos_token_id")
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    return eos, pad if pad is not None else (eos if eos is not None else 0)


def check_numbers(*, steps: int, lr: float, batch_size: int, max_length: int, weight_decay: float | None) -> None:
    problems = []
    if steps < 1:
        problems.append(f"--steps must be >= 1 (got {steps})")
    if not lr > 0:
        problems.append(f"--lr must be > 0 (got {lr})")
    if batch_size < 1:
        problems.append(f"--batch-size must be >= 1 (got {batch_size})")
    if max_length < 2:
        problems.append(f"--max-length must be >= 2 (got {max_length}): a causal LM learns each token from the ones before")
    if weight_decay is not None and weight_decay < 0:
        problems.append(f"--weight-decay must be >= 0 (got {weight_decay})")
    if problems:
        raise InputSpecError("; ".join(problems))


__all__ = ["LORA_DEFAULTS", "TRAINING_DTYPES", "Method", "check_numbers", "load_for_training", "lora_config", "special_ids",
           "text_layers", "training_forward"]
