"""A converted model's params (e.g. `merge(params, lora, config)`) handed back as a Hugging Face model directory, so
`transformers.AutoModelForCausalLM.from_pretrained(dir)` loads the fine-tuned model without peft or torch2jax.

The source model directory's config.json (and generation config, tokenizer files) is copied; the params are written as
model.safetensors under their state_dict names. Tied weights appear once in a converted model's params (e.g. no
`lm_head.weight` beside `model.embed_tokens.weight`), as save_pretrained writes them: transformers re-ties on load.
Torch-free: numpy and safetensors' numpy API (bfloat16 as ml_dtypes' bfloat16, which safetensors stores as BF16).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Collection
from pathlib import Path

import numpy as np

from ..errors import Torch2JaxError
from ..runtime.artifact import swap_into_place

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "vocab.json", "merges.txt", "tokenizer.model", "processor_config.json", "preprocessor_config.json",
          "chat_template.jinja", "chat_template.json")
DTYPES = ("float32", "float16", "bfloat16")


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _checkpoint_names(source: Path) -> set[str] | None:
    """The tensor names the source directory's safetensors checkpoint holds (headers only), or None without one."""
    if (source / INDEX_FILE).is_file():
        return set(json.loads((source / INDEX_FILE).read_text())["weight_map"])
    if (source / WEIGHTS_FILE).is_file():
        from safetensors import safe_open

        with safe_open(str(source / WEIGHTS_FILE), framework="numpy") as f:
            return set(f.keys())
    return None


def save_merged(params: dict, source_dir: str | os.PathLike, out_dir: str | os.PathLike, *, force: bool = False,
                dtype: str | None = None, names: Collection[str] | None = None) -> Path:
    """Write `params` (a converted model's, keyed by state_dict names) as a Hugging Face model directory beside the
    source model's config.json, generation_config.json and tokenizer files: model.safetensors, metadata
    {"format": "pt"}. Where the source holds a safetensors checkpoint, only its tensor names are written (buffers the
    converter kept but save_pretrained does not, such as rotary `inv_freq`, are left out) and a name it holds that
    the params lack is an error. `dtype` ("float32", "float16", "bfloat16") casts the floating params and sets
    config.json's dtype. Written in a temporary sibling and renamed into place; an existing `out_dir` is replaced
    only with force=True.

    `names` (the torch module's state_dict names, where the caller has them) are written instead of the checkpoint's:
    for a checkpoint stored under older names that transformers maps on load (LLaVA's `language_model.model.*`); a
    name the params lack is a tied weight's second name, which transformers re-ties."""
    from safetensors.numpy import save_file

    source, out = Path(source_dir), Path(out_dir)
    if not (source / CONFIG_FILE).is_file():
        raise Torch2JaxError(f"{source} is not a Hugging Face model directory: it has no {CONFIG_FILE} to copy")
    if dtype is not None and dtype not in DTYPES:
        raise Torch2JaxError(f"dtype={dtype!r}: expected one of {DTYPES} or None (keep the params' dtypes)")
    if out.exists() and not force:
        raise Torch2JaxError(f"{out} already exists; pass force=True to replace it")
    if names is not None:
        names = {name for name in names if name in params}
    else:
        names = _checkpoint_names(source)
    if names is not None:
        lacking = sorted(names - set(params))
        if lacking:
            raise Torch2JaxError(f"the params lack {lacking}, which the checkpoint in {source} holds")
    tensors = {}
    for name, value in params.items():
        if names is not None and name not in names:
            continue
        array = np.asarray(value)
        if dtype is not None and (np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16"):
            array = array.astype(_np_dtype(dtype))
        tensors[name] = np.ascontiguousarray(array)
    config = json.loads((source / CONFIG_FILE).read_text())
    if dtype is not None:
        # transformers 5 writes "dtype", 4 wrote "torch_dtype": set those the source has, "dtype" where neither
        for key in [k for k in ("torch_dtype", "dtype") if k in config] or ["dtype"]:
            config[key] = dtype
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for file in COPIED:
            if (source / file).is_file():
                shutil.copy2(source / file, tmp / file)
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        swap_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
