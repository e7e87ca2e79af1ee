"""A target string -> the module and example inputs it names: a model file, or an `hf:DIR` forward-pass task."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from ..capture.target import Target, resolve
from ..errors import InputSpecError, Torch2JaxError
from ..hf.directory import is_hf_target
from ..hf.source import HFSource, forward_target, resolve_source


def resolve_target(target: str, inputs: list[str] | tuple[str, ...] = (), weights: str | None = None, *,
                   task: str | None = None, train: bool = False, seed: int = 0, stream: bool = False,
                   source: HFSource | None = None) -> Target:
    """The module `target` names, in eval mode unless `train`, with example inputs (from `inputs` --input specs, the
    model file's example_inputs(), or an hf: model's config) and `weights` loaded (or streamed, with `stream`).
    `source`: an hf: target already resolved (hf.source.resolve_source, with `task`), so its config is not read again."""
    if is_hf_target(target):
        source = source or resolve_source(target, task)
        return forward_target(source, list(inputs), weights, train=train, seed=seed, stream=stream)
    if task:
        raise InputSpecError(f"--task applies to hf: targets; {target} is a model file target")
    return resolve(target, list(inputs), weights, train=train, seed=seed, stream=stream)


def import_lowerings(path: str | os.PathLike) -> None:
    """Run a Python file that registers lowerings for custom ops (torch2jax.register_lowering)."""
    spec = importlib.util.spec_from_file_location(f"torch2jax_lowerings_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise Torch2JaxError(f"importing lowerings from {path} failed: {type(err).__name__}: {err}") from None
