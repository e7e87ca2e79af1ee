"""`torch2jax.convert`: nn.Module + example inputs -> an in-memory `Model` (convert half)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch

from . import exporter, interpreter
from .capture import capture
from .model import Model
from .torch_arrays import to_jax

ProgressFn = Callable[[str, str], None]  # (stage, message)


class StageTimer:
    """Times the named stages of a conversion and reports each to an optional progress callback."""

    def __init__(self, progress: ProgressFn | None = None):
        self.progress = progress
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str, message: str):
        if self.progress:
            self.progress(name, message)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = time.perf_counter() - start


def convert(
    module: torch.nn.Module,
    args: tuple | list | Any = (),
    kwargs: dict | None = None,
    dynamic_shapes: Any = None,
    *,
    strict: bool = False,
    progress: ProgressFn | None = None,
    timer: StageTimer | None = None,
) -> Model:
    """Convert `module` to a JAX `Model`, tracing it on example `args`/`kwargs`.

    `dynamic_shapes` takes torch.export's form or a plain one such as `{"x": {0: "batch"}}`.
    The module is exported in the mode it is in: call `module.eval()` first for inference.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"convert() takes a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(args, (tuple, list)):
        args = (args,)
    timer = timer or StageTimer(progress)
    with timer.stage("export", "torch.export"):
        ep, names = exporter.export(module, tuple(args), kwargs, dynamic_shapes, strict=strict)
    with timer.stage("decompose", "decompose to core ATen"):
        ep = exporter.decompose(ep)
    with timer.stage("lower", "translate to JAX"):
        captured = capture(ep, names)
        interpreter.check_supported(captured.graph, captured.schemas)
        run = interpreter.build(captured.graph)
        params = {name: to_jax(t) for name, t in captured.tensors.items()}
    model = Model(run, params, captured.graph)
    model.timings = timer.timings
    return model
