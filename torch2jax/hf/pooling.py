"""What an encoder's artifact keeps for serving embeddings: the pooling and normalization its sentence-transformers
configuration declares (`modules.json`, the Pooling module's `config.json`, `sentence_bert_config.json`), read once at
conversion and written into the manifest's `embedding` section, so that the server needs neither torch nor the source
directory. Torch-free itself; it lives in hf/ because it knows the layout of a Hugging Face model directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputSpecError

# sentence-transformers' Pooling flags -> our mode names, in the order its Pooling module concatenates them
POOLING_FLAGS = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_max_tokens", "max"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
    ("pooling_mode_weightedmean_tokens", "weighted_mean"),
    ("pooling_mode_lasttoken", "last"),
)
ST_MODULE = "sentence_transformers.models."
# architectures whose position ids start after the padding index (transformers' create_position_ids_from_input_ids):
# max_position_embeddings counts pad_token_id + 1 slots that no token can use
OFFSET_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet", "data2vec-text", "xlm-roberta-xl")


def embedding_section(directory: Path | None, config: Any) -> dict:
    """The manifest's `embedding` section for a feature-extraction model: the longest input its positions allow
    (`max_positions`), `vocab_size`, `pad_token_id`, and, when the directory is a sentence-transformers model, its
    pooling modes, whether it normalizes, the module types of its pipeline and the files as they were read."""
    text = getattr(config, "text_config", None) or config
    section: dict[str, Any] = {
        "max_positions": max_positions(text),
        "vocab_size": getattr(text, "vocab_size", None),
        "pad_token_id": getattr(text, "pad_token_id", None),
        "hidden_size": getattr(text, "hidden_size", None),
        "pooling": None,  # None: no sentence-transformers config (the server's default or its --pooling applies)
        "normalize": None,
        "modules": None,
    }
    if directory is not None and (directory / "modules.json").is_file():
        section.update(sentence_transformers(directory))
    return section


def max_positions(config: Any) -> int | None:
    """The most tokens one input may have: max_position_embeddings, less the offset some architectures' positions
    start at (RoBERTa-like models count from pad_token_id + 1)."""
    limit = getattr(config, "max_position_embeddings", None)
    if not isinstance(limit, int):
        return None
    if getattr(config, "model_type", None) in OFFSET_POSITIONS:
        limit -= (getattr(config, "pad_token_id", None) or 0) + 1
    return limit


def sentence_transformers(directory: Path) -> dict:
    """The pooling, normalization and pipeline a sentence-transformers directory declares; InputSpecError for files
    that are not what sentence-transformers writes (naming the file)."""
    modules = _read(directory / "modules.json")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise InputSpecError(f"{directory / 'modules.json'} is not a list of modules as sentence-transformers writes it")
    types = [str(m.get("type", "")).removeprefix(ST_MODULE) for m in modules]
    found: dict[str, Any] = {"modules": types, "normalize": "Normalize" in types, "pooling": None, "files": {}}
    for module, kind in zip(modules, types):
        if kind == "Pooling":
            path = directory / str(module.get("path", "")) / "config.json"
            pooling = _read(path)
            if not isinstance(pooling, dict):
                raise InputSpecError(f"{path} is not a Pooling configuration (a JSON object of pooling_mode_* flags)")
            found["pooling"] = pooling_modes(pooling)
            found["files"]["pooling"] = pooling
    bert_config = directory / "sentence_bert_config.json"
    if bert_config.is_file():
        settings = _read(bert_config)
        found["files"]["sentence_bert_config"] = settings
        found["max_seq_length"] = settings.get("max_seq_length") if isinstance(settings, dict) else None
    found["files"]["modules"] = modules
    return found


def pooling_modes(pooling: dict) -> list[str]:
    """The modes a Pooling config turns on, in sentence-transformers' concatenation order (newer configs may name one
    `pooling_mode` as a string instead of the flags)."""
    named = pooling.get("pooling_mode")
    if isinstance(named, str):
        aliases = {"cls": "cls", "max": "max", "mean": "mean", "mean_sqrt_len_tokens": "mean_sqrt_len",
                   "weightedmean": "weighted_mean", "lasttoken": "last"}
        return [aliases.get(named, named)]
    return [mode for flag, mode in POOLING_FLAGS if pooling.get(flag)]


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise InputSpecError(f"{path} is missing: modules.json names it, so the sentence-transformers model is incomplete") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise InputSpecError(f"{path} is not valid JSON ({err})") from None
