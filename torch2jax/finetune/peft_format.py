"""LoRA adapters in PEFT's directory format, so what JAX trained loads with `peft.PeftModel.from_pretrained(base, dir)`.

PEFT's file (peft/utils/save_and_load.py, get_peft_model_state_dict) names each tensor
`base_model.model.{module}.lora_A.weight` [r, in] and `.lora_B.weight` [out, r]: the PeftModel and LoraModel
prefixes, then the module's own name, without the adapter name ("default"). Torch-free: safetensors' numpy API.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

from ..errors import Torch2JaxError
from ..runtime.artifact import swap_into_place
from .lora import LoraConfig, LoraError, modules_of

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
HALVES = ("lora_A", "lora_B")


def adapter_config(config: LoraConfig, base_model_name_or_path: str | None = None) -> dict:
    """The adapter_config.json PEFT writes for this LoRA on a causal LM."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": sorted(config.targets),
        "fan_in_fan_out": config.fan_in_fan_out,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "base_model_name_or_path": base_model_name_or_path,
    }


def save_adapter(lora: dict, config: LoraConfig, out_dir: str | os.PathLike, base_model_name_or_path: str | None = None,
                 *, force: bool = False) -> Path:
    """Write `lora` (init_lora's dict, trained) as a PEFT adapter directory: adapter_config.json and
    adapter_model.safetensors (float32). Written in a temporary sibling and renamed into place; an existing
    `out_dir` is replaced only with force=True."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    if out.exists() and not force:
        raise Torch2JaxError(f"{out} already exists; pass force=True to replace it")
    tensors = {f"{PREFIX}{module}.{half}.weight": np.ascontiguousarray(np.asarray(lora[f"{module}.{half}"], np.float32))
               for module in modules_of(lora) for half in HALVES}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(adapter_config(config, base_model_name_or_path), indent=2))
        swap_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_adapter(adapter_dir: str | os.PathLike) -> tuple[dict[str, np.ndarray], LoraConfig]:
    """A PEFT LoRA adapter directory -> (the adapter dict init_lora makes, its LoraConfig). Refuses what this
    slice cannot apply: another peft_type, biases, DoRA, rsLoRA, per-module ranks, dropout."""
    from safetensors.numpy import load_file

    root = Path(adapter_dir)
    if not (root / CONFIG_FILE).is_file() or not (root / WEIGHTS_FILE).is_file():
        raise LoraError(f"{root} is not a PEFT adapter directory: it needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    raw = json.loads((root / CONFIG_FILE).read_text())
    unsupported = {key: raw.get(key) for key, ok in (("peft_type", "LORA"), ("bias", "none"), ("use_dora", False),
                                                      ("use_rslora", False), ("rank_pattern", {}), ("alpha_pattern", {}))
                   if raw.get(key, ok) not in (ok, None)}
    if unsupported:
        raise LoraError(f"{root}: this adapter uses {unsupported}, which torch2jax.finetune does not apply yet")
    targets = raw["target_modules"]
    if isinstance(targets, str):  # PEFT reads a string as one regular expression over the whole name, not a suffix
        raise LoraError(f"{root}: target_modules {targets!r} is a regular expression, which torch2jax.finetune does not apply yet")
    config = LoraConfig(rank=int(raw["r"]), alpha=raw["lora_alpha"], targets=tuple(targets),
                        fan_in_fan_out=bool(raw.get("fan_in_fan_out", False)), dropout=float(raw.get("lora_dropout") or 0.0))
    lora = {}
    for key, value in load_file(str(root / WEIGHTS_FILE)).items():
        name = key.removeprefix(PREFIX)
        if not key.startswith(PREFIX) or not name.endswith((".lora_A.weight", ".lora_B.weight")):
            raise LoraError(f"{root / WEIGHTS_FILE}: unexpected tensor {key!r} (expected {PREFIX}<module>.lora_A/B.weight)")
        lora[name.removesuffix(".weight")] = value
    modules_of(lora)  # both halves of every pair
    return lora, config
