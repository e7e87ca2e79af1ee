"""`torch2jax finetune hf:DIR`: a Hugging Face causal LM fine-tuned from its directory and a JSON-lines file, handed
back as a PEFT adapter, a merged Hugging Face directory and, on request, a verified artifact.

Everything that can be wrong with the arguments, the data or the output directory is found before the model is
loaded and converted, the slow part; the run itself (finetune/run.py) needs no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..errors import InputSpecError
from ..finetune import data as finetune_data
from ..finetune.run import MERGED_DIR, RunSettings, StepReport, check_output, file_sha256, run
from ..finetune.train import OPTIMIZERS, TORCH_WEIGHT_DECAY
from ..hf.directory import open_directory
from ..hf.training import (
    LORA_DEFAULTS,
    TRAINING_DTYPES,
    Method,
    check_numbers,
    load_for_training,
    lora_config,
    special_ids,
    training_forward,
)
from .conversion import ProgressFn
from .convert import convert_target

ARTIFACT_DIR = "artifact"  # with artifact=True: out/merged converted for torch2jax.load


def finetune(model_dir: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike, *, steps: int, lr: float,
             method: Method = LORA_DEFAULTS, optimizer: str = "adamw", weight_decay: float | None = None, batch_size: int = 8,
             max_length: int = 512, seed: int = 0, shuffle: bool = True, save_init: bool = False, resume: bool = False,
             force: bool = False, artifact: bool = False, dtype: str = "float32", progress: ProgressFn | None = None,
             on_step: Callable[[StepReport], None] | None = None) -> Path:
    """Fine-tune the causal LM in `model_dir` on the JSON-lines `data` and write `out` (torch2jax.finetune.run's
    layout: adapter/, merged/, losses.jsonl, checkpoint/ ...). Returns `out`. Needs torch (the conversion) and the
    directory's tokenizer.json.

    `dtype` "bfloat16" converts and runs the forward in bfloat16, the trained values (LoRA adapters, full
    fine-tuning's master weights) in float32.

    A vision-language model's language part is trained on the text (its vision tower as it was); the merged
    directory is the whole model.

    With `artifact`, out/merged is then converted to a generation artifact in out/artifact (verified against
    transformers, as `torch2jax convert hf:OUT/merged` does); if that fails the run's output stays as written."""
    say = progress or (lambda stage, message: None)
    check_numbers(steps=steps, lr=lr, batch_size=batch_size, max_length=max_length, weight_decay=weight_decay)
    method.check()
    if dtype not in TRAINING_DTYPES:
        raise InputSpecError(f"--dtype {dtype!r} is not one of {list(TRAINING_DTYPES)}")
    if optimizer not in OPTIMIZERS:
        raise InputSpecError(f"--optimizer {optimizer!r} is not one of {list(OPTIMIZERS)}")
    directory, config, tokenizer_files, _ = open_directory(model_dir)
    if "tokenizer.json" not in tokenizer_files:
        raise InputSpecError(f"{directory} has no tokenizer.json, which finetune reads the training text with: save the "
                             "model's tokenizer into it (tokenizer.save_pretrained(DIR))")
    check_output(out, resume=resume, force=force)

    say("data", f"reading {data}")
    from tokenizers import Tokenizer

    examples = finetune_data.read_examples(data)
    eos_id, pad_id = special_ids(directory, config)
    rows = finetune_data.tokenize(examples, Tokenizer.from_file(str(tokenizer_files["tokenizer.json"])), eos_id,
                                  max_length, source=str(data))
    trained = sum(len(t) for _, t in rows)
    say("data", f"{len(rows)} examples, {trained} trained tokens")

    say("load", f"loading {directory}")
    module = load_for_training(directory, config)
    lora = None if method.full else lora_config(module, method)
    settings = RunSettings(str(directory.resolve()), file_sha256(data), "full" if method.full else "lora", lora, optimizer,
                           float(lr), TORCH_WEIGHT_DECAY[optimizer] if weight_decay is None else float(weight_decay),
                           batch_size, max_length, seed, shuffle, dtype)
    say("convert", f"converting the training forward ({batch_size} x {max_length} tokens)")
    model = training_forward(module, batch_size, max_length, seed, dtype)
    written = run(model, settings, rows, out, steps=steps, pad_id=pad_id, resume=resume, save_init=save_init,
                  force=force, merged_names=list(module.state_dict()), on_step=on_step)
    if artifact:
        convert_target(f"hf:{written / MERGED_DIR}", written / ARTIFACT_DIR, progress=progress)
    return written
