"""A fine-tuning run over a converted causal LM, torch-free: the steps, their losses, an Orbax checkpoint to resume
from, and what the run hands back, all written in a temporary sibling of the output directory and renamed into place
at the end, so the output directory is never half-written.

The output directory of a run (`torch2jax finetune ... --out OUT`):

    OUT/finetune.json     the run's settings and the steps taken (what --resume checks and continues)
    OUT/losses.jsonl      {"step": n, "loss": x} per step, n from 1, the batch's loss before that step's update
    OUT/checkpoint/       Orbax: the trained values and the optimizer state after the last step
    OUT/adapter/          LoRA: the adapter in PEFT's format (peft.PeftModel.from_pretrained loads it)
    OUT/adapter_init/     LoRA with save_init: the adapter before the first step, in PEFT's format
    OUT/merged/           the fine-tuned model as a Hugging Face directory (from_pretrained loads it)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ..errors import Torch2JaxError
from ..runtime.artifact import swap_into_place
from .data import batch_indices
from .full import model_parameters
from .hf_format import DTYPES, save_merged
from .lora import LoraConfig, init_lora, merge
from .peft_format import save_adapter
from .train import full_train_step, lora_train_step, make_batch, master_weights, optimizer

SETTINGS_FILE, LOSSES_FILE, CHECKPOINT_DIR = "finetune.json", "losses.jsonl", "checkpoint"
ADAPTER_DIR, ADAPTER_INIT_DIR, MERGED_DIR = "adapter", "adapter_init", "merged"
RUN_FORMAT = 1


class FinetuneError(Torch2JaxError):
    """A fine-tuning run that cannot start or go on; the message names the problem and the fix."""


@dataclass(frozen=True)
class RunSettings:
    """Everything that decides a run's trajectory: a resumed run must have the same, or it would not continue it."""

    model_dir: str  # the Hugging Face model directory, resolved
    data_sha256: str  # of the training data file
    method: str  # "lora" or "full"
    lora: LoraConfig | None
    optimizer: str  # "sgd" or "adamw" (train.optimizer)
    lr: float
    weight_decay: float  # resolved: torch's default for the optimizer where not given
    batch_size: int
    max_length: int
    seed: int
    shuffle: bool
    dtype: str = "float32"  # the forward's: "bfloat16" computes in bfloat16, the trained values kept in float32

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        data["lora"] = None if self.lora is None else {**dataclasses.asdict(self.lora), "targets": list(self.lora.targets)}
        return data

    @staticmethod
    def from_json(data: dict) -> RunSettings:
        lora = data.get("lora")
        return RunSettings(**{**data, "lora": None if lora is None else LoraConfig(**lora)})


@dataclass(frozen=True)
class StepReport:
    """What a step did, for progress output."""

    step: int  # 1-based, counted over resumed runs too
    last: int  # the step this run ends at
    loss: float
    tokens: int  # non-padding tokens in the batch
    seconds: float


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_output(out: str | os.PathLike, *, resume: bool, force: bool) -> int:
    """Check the output directory before any work: with `resume` it must hold a run (its step count is returned),
    else it must not exist unless `force` (0 is returned)."""
    out = Path(out)
    if resume:
        return _read_state(out)[1]
    if out.exists() and not force:
        raise FinetuneError(f"{out} already exists: pass --resume to continue the run it holds, --force to replace it, "
                            "or choose another --out")
    return 0


def _read_state(out: Path) -> tuple[RunSettings, int]:
    path = out / SETTINGS_FILE
    if not path.is_file() or not (out / CHECKPOINT_DIR).is_dir():
        raise FinetuneError(f"nothing to resume in {out}: it holds no {SETTINGS_FILE} and {CHECKPOINT_DIR}/ of an earlier "
                            "run; drop --resume to start one")
    try:
        state = json.loads(path.read_text())
        if state.get("format") != RUN_FORMAT:
            raise ValueError(f"format {state.get('format')!r}, expected {RUN_FORMAT}")
        return RunSettings.from_json(state["settings"]), int(state["step"])
    except (ValueError, KeyError, TypeError) as err:
        raise FinetuneError(f"{path} is damaged ({err}); start a new run with --force") from None


def _differences(now: RunSettings, before: RunSettings) -> list[str]:
    ours, theirs = now.to_json(), before.to_json()
    return [f"{name}: {ours[name]!r} now, {theirs[name]!r} in the run" for name in ours if ours[name] != theirs[name]]


def run(model: Any, settings: RunSettings, rows: Sequence[tuple[list[int], list[int]]], out: str | os.PathLike, *,
        steps: int, pad_id: int, resume: bool = False, save_init: bool = False, force: bool = False,
        merged_names: Collection[str] | None = None, on_step: Callable[[StepReport], None] | None = None) -> Path:
    """Train `model` (a converted causal LM: `model.apply(params, ids, attention_mask=)["logits"]`) for `steps` more
    steps on `rows` (data.tokenize's), and write the output directory (see the module docstring). With `resume` the
    run in `out` goes on from its checkpoint, so 3 steps and then 3 resumed give what 6 steps give; its settings must
    equal `settings`. `merged_names`: the tensor names merged/ holds (hf_format.save_merged's `names`). Returns `out`."""
    out = Path(out)
    if not isinstance(steps, int) or steps < 1:
        raise FinetuneError(f"steps must be an integer >= 1, got {steps!r}")
    start = check_output(out, resume=resume, force=force)
    if resume:
        before, _ = _read_state(out)
        differ = _differences(settings, before)
        if differ:
            raise FinetuneError(f"--resume continues a run with the same settings, and these differ: {'; '.join(differ)}. "
                                "Pass the run's own settings (OUT/finetune.json), or start a new run in another --out")
    opt = optimizer(settings.optimizer, settings.lr, settings.weight_decay)
    if settings.method == "lora":
        trainable = init_lora(model.params, settings.lora, jax.random.key(settings.seed))
        step_fn = lora_train_step(model, settings.lora, opt)
    else:
        trainable = master_weights(model_parameters(model))
        step_fn = full_train_step(model, opt)
    opt_state = opt.init(trainable)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        if resume:
            trainable, opt_state = _restore(out / CHECKPOINT_DIR, trainable, opt_state)
            _carry_over(out, tmp, start)
        elif save_init and settings.method == "lora":
            save_adapter(trainable, settings.lora, tmp / ADAPTER_INIT_DIR, base_model_name_or_path=settings.model_dir)
        with open(tmp / LOSSES_FILE, "a", encoding="utf-8") as log:
            for step in range(start, start + steps):
                picked = batch_indices(len(rows), settings.batch_size, step, settings.seed, settings.shuffle)
                batch = make_batch([rows[i] for i in picked], settings.max_length, pad_id)
                began = time.perf_counter()
                trainable, opt_state, loss = step_fn(trainable, opt_state, batch)
                loss = float(loss)
                if not math.isfinite(loss):
                    raise FinetuneError(f"the loss is {loss} at step {step + 1}: training diverged; lower --lr (it is "
                                        f"{settings.lr}), and nothing was written to {out}")
                log.write(json.dumps({"step": step + 1, "loss": loss}) + "\n")
                log.flush()
                if on_step is not None:
                    on_step(StepReport(step + 1, start + steps, loss, int(batch["attention_mask"].sum()),
                                       time.perf_counter() - began))
        _save_checkpoint(tmp / CHECKPOINT_DIR, trainable, opt_state)
        state = {"format": RUN_FORMAT, "step": start + steps, "settings": settings.to_json()}
        (tmp / SETTINGS_FILE).write_text(json.dumps(state, indent=2) + "\n")
        if settings.method == "lora":
            save_adapter(trainable, settings.lora, tmp / ADAPTER_DIR, base_model_name_or_path=settings.model_dir)
            merged = merge(model.params, trainable, settings.lora)
        else:
            merged = {**model.params, **trainable}
        save_merged(merged, settings.model_dir, tmp / MERGED_DIR, dtype=checkpoint_dtype(settings.model_dir),
                    names=merged_names)
        swap_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def checkpoint_dtype(model_dir: str | os.PathLike) -> str | None:
    """The dtype config.json says the checkpoint is stored in (so the merged model is the size the source was), or
    None to keep the params' own."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    stored = config.get("dtype") or config.get("torch_dtype")
    return stored if stored in DTYPES else None


def _carry_over(out: Path, tmp: Path, start: int) -> None:
    """What a resumed run keeps from the one before: the initial adapter and the first `start` losses."""
    if (out / ADAPTER_INIT_DIR).is_dir():
        shutil.copytree(out / ADAPTER_INIT_DIR, tmp / ADAPTER_INIT_DIR)
    if (out / LOSSES_FILE).is_file():
        lines = (out / LOSSES_FILE).read_text(encoding="utf-8").splitlines()[:start]
        (tmp / LOSSES_FILE).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _save_checkpoint(path: Path, trainable: dict, opt_state: Any) -> None:
    from ..runtime.checkpoint import save_params

    path.mkdir()
    save_params(dict(trainable), path / "trainable")
    leaves = jax.tree.leaves(opt_state)
    if leaves:  # plain SGD keeps no state
        save_params({f"leaf_{i:05d}": leaf for i, leaf in enumerate(leaves)}, path / "optimizer")


def _restore(path: Path, trainable: dict, opt_state: Any) -> tuple[dict, Any]:
    """The checkpoint's values onto the structure a fresh run starts from (same settings, so the same structure)."""
    from ..runtime.checkpoint import restore_params

    def tree(values: dict) -> dict:
        return {name: (tuple(np.shape(v)), str(np.asarray(v).dtype) if not hasattr(v, "dtype") else str(v.dtype))
                for name, v in values.items()}

    try:
        restored = restore_params(path / "trainable", tree(trainable))
        leaves, treedef = jax.tree.flatten(opt_state)
        named = {f"leaf_{i:05d}": leaf for i, leaf in enumerate(leaves)}
        restored_leaves = restore_params(path / "optimizer", tree(named)) if named else {}
    except Torch2JaxError as err:
        raise FinetuneError(f"the checkpoint in {path} does not fit this run ({err}); start a new run with --force") from None
    return {name: restored[name] for name in trainable}, jax.tree.unflatten(treedef, [restored_leaves[n] for n in named])
