"""Training data for `torch2jax finetune`: JSON-lines examples read and checked, tokenized, and a batch order that is
a pure function of (seed, step), so a resumed run takes exactly the batches an uninterrupted one would.

A line is `{"text": ...}` (every token trained on) or `{"prompt": ..., "completion": ...}` (only the completion's
tokens trained on). Torch-free: the tokenizer is the model directory's tokenizer.json, read with `tokenizers`.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputSpecError


class DataError(InputSpecError):
    """The training data cannot be used as given; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Example:
    """One line of the data: `prompt` is None for a text line (all of `text` is trained on)."""

    line: int
    text: str
    prompt: str | None = None


FORMATS = '{"text": ...} or {"prompt": ..., "completion": ...}'


def read_examples(path: str | os.PathLike) -> list[Example]:
    """Every example of a JSON-lines file, in file order (blank lines skipped). Each problem raises DataError naming
    the line: not JSON, not an object, neither format, a value that is not a string, or an empty text."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DataError(f"the training data {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read the training data {path}: {err}") from None
    examples = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{where} is not JSON ({err.msg} at column {err.colno}): each line holds one object, "
                            f"{FORMATS}") from None
        examples.append(_example(record, number, where))
    if not examples:
        raise DataError(f"the training data {path} holds no examples: write one JSON object per line, {FORMATS}")
    return examples


def _example(record: Any, number: int, where: str) -> Example:
    if not isinstance(record, dict):
        raise DataError(f"{where} is a JSON {type(record).__name__}, not an object: each line holds {FORMATS}")
    keys = set(record)
    if keys == {"text"}:
        fields = {"text": record["text"]}
    elif keys == {"prompt", "completion"}:
        fields = {"prompt": record["prompt"], "completion": record["completion"]}
    else:
        raise DataError(f"{where} has the keys {sorted(keys)}: each line holds {FORMATS}, and no other keys")
    for key, value in fields.items():
        if not isinstance(value, str):
            raise DataError(f"{where}: {key!r} must be a string, got {json.dumps(value)}")
    if "text" in fields:
        if not fields["text"]:
            raise DataError(f"{where}: 'text' is empty; remove the line or give it text")
        return Example(number, fields["text"])
    if not fields["completion"]:
        raise DataError(f"{where}: 'completion' is empty, so nothing on this line would be trained on")
    return Example(number, fields["completion"], fields["prompt"])


def tokenize(examples: Sequence[Example], tokenizer: Any, eos_id: int | None, max_length: int,
             source: str = "the data") -> list[tuple[list[int], list[int]]]:
    """(prompt ids, trained ids) per example: a text line is ([], encode(text)); a prompt/completion line is
    (encode(prompt), encode(completion) without special tokens), so the tokenizer's start token (e.g. BOS) opens the
    prompt and not the completion. The model's end token `eos_id` closes the trained part (the model learns to stop),
    where it has one. Each row is cut at max_length; a line whose trained tokens all fall beyond it is a DataError
    (nothing to learn from it), naming the line and the fix."""
    rows = []
    for example in examples:
        prompt = [] if example.prompt is None else tokenizer.encode(example.prompt).ids
        trained = tokenizer.encode(example.text, add_special_tokens=example.prompt is None).ids
        if eos_id is not None:
            trained = [*trained, eos_id]
        if example.prompt is not None and len(prompt) >= max_length:
            raise DataError(f"{source}, line {example.line}: the prompt is {len(prompt)} tokens, so no completion token "
                            f"fits in --max-length {max_length}; raise --max-length or shorten the prompt")
        if len(prompt) + len(trained) < 2:
            raise DataError(f"{source}, line {example.line} is a single token: a causal LM learns from each token's "
                            "successor, so a line needs at least two")
        rows.append((prompt, trained))
    return rows


def batch_indices(num_examples: int, batch_size: int, step: int, seed: int, shuffle: bool) -> list[int]:
    """The examples step `step` (0-based) trains on: the data taken in epochs, each a permutation drawn from
    (seed, epoch) (file order with shuffle=False), batch after batch across epoch boundaries. A pure function of its
    arguments, so `--resume` needs only the step count to go on with the same batches."""
    indices = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, num_examples)
        indices.append(int(_order(num_examples, seed, epoch, shuffle)[offset]))
    return indices


@functools.lru_cache(maxsize=4)
def _order(num_examples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(num_examples)
    return np.random.default_rng([seed, epoch]).permutation(num_examples)
