"""`convert_target`: any target to a verified artifact directory, the one call `torch2jax convert` wraps."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputSpecError
from ..hf.directory import is_hf_target
from ..hf.tasks import GENERATION_TASKS, IMAGE_TEXT_TO_TEXT, TEXT_GENERATION, task_of
from ..runtime.stablehlo import DEFAULT_PLATFORMS
from .conversion import BytesFn, Conversion, ProgressFn
from .forward import export_forward
from .generation import export_generator
from .targets import import_lowerings

STREAMED_TASKS = (TEXT_GENERATION, IMAGE_TEXT_TO_TEXT)  # generators whose weights stream (encoder-decoders load in memory)


def convert_target(
    target: str,
    out: str | os.PathLike,
    *,
    inputs: Sequence[str] = (),
    weights: str | None = None,
    task: str | None = None,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    force: bool = False,
    verify: bool = True,
    train: bool = False,
    dtype: str | None = None,
    seed: int = 0,
    stream: bool = True,
    max_cache_len: int = 512,
    max_batch: int = 8,
    max_source_len: int = 512,
    verify_tokens: int = 16,
    verify_layers: int = 2,
    repeat_layers: bool = True,
    quantize: str | None = None,
    group_size: int = 64,
    specialize: Sequence[str] = (),
    lowerings: Sequence[str | os.PathLike] = (),
    report: str | os.PathLike | None = None,
    repro_dir: str | os.PathLike | None = None,
    progress: ProgressFn | None = None,
    on_bytes: BytesFn | None = None,
) -> Conversion:
    """Convert `target` and write it to `out` as an artifact, checked before it is renamed into place: a mismatch
    raises VerificationError and leaves no directory.

    Args:
      target: "model.py:Model", "model.py:make_model", "package.module:Model", or "hf:DIR" (a local model directory).
      out: the artifact directory to write (atomically; an existing one only with `force`).
      inputs: example inputs as --input specs ("x=float32[batch,16]", "x=file.npy"); default: the model file's
        example_inputs(), or inputs made from an hf: model's config.
      weights: a state_dict to load (.safetensors, or .pt/.pth read with weights_only=True).
      task: hf: targets: "text-generation" / "text2text-generation" (a generator), or a forward-pass task such as
        "text-classification"; default: what config.json's architectures imply.
      platforms: jax.export platforms of the StableHLO.
      force: replace an existing `out`.
      verify: compare the saved artifact with torch (forward passes: the example inputs, random inputs and a second
        size of each symbolic dim) or with transformers' greedy generate (generators) before renaming it into place.
      train: export in training mode (default: eval).
      dtype: convert the model and its floating inputs to this dtype first, e.g. "bfloat16".
      seed: seed for model construction and random example inputs.
      stream: read the weights from safetensors files only while writing the artifact (hf: targets and model files
        with a .safetensors `weights`), instead of loading the whole model in torch first.
      max_cache_len, max_batch, max_source_len: generators' limits (see torch2jax.convert_hf).
      verify_tokens: generators: greedy tokens compared with transformers (bfloat16: the first 8 must be equal).
      verify_layers: streamed causal LMs deeper than this are verified on a slice of their first layers.
      repeat_layers: causal LMs: trace a stack of alike layers at 3 and 4 layers and repeat a middle one.
      quantize: "int8", "int4" or "int8-dynamic": the weights of the matrix products stored quantized (docs/api.md).
      group_size: int4's group of input columns sharing one scale.
      specialize: forward passes: integer inputs fixed to their example values (torch2jax.convert's `specialize`).
      lowerings: Python files that register lowerings for custom ops (torch2jax.register_lowering), imported first.
      report: also write a markdown report (stages, timings, op counts, per-output errors) here, pass or fail.
      repro_dir: where a standalone reproduction of a failing op is written (default: $TMPDIR/torch2jax-repro).
      progress: called with (stage, message) as each stage starts.
      on_bytes: called with (written, total) bytes while streamed weights are written.
    """
    out = Path(out)
    for path in lowerings:
        import_lowerings(path)
    if out.exists() and not force:
        raise InputSpecError(f"{out} already exists; pass --force (force=True) to replace it")
    options = dict(platforms=tuple(platforms), force=force, verify=verify, dtype=dtype, seed=seed, progress=progress,
                   on_bytes=on_bytes, quantize=quantize, group_size=group_size)
    if is_hf_target(target):
        kind = task_of(target, task)
        if kind in GENERATION_TASKS:
            if specialize:
                raise InputSpecError(f"--specialize is for forward-pass conversions; {kind} builds its own inputs")
            return export_generator(target, out, task=kind, stream=stream and kind in STREAMED_TASKS,
                                    max_cache_len=max_cache_len, max_batch=max_batch, max_source_len=max_source_len,
                                    verify_tokens=verify_tokens, verify_layers=verify_layers, repeat_layers=repeat_layers,
                                    **options)
    return export_forward(target, out, inputs=inputs, weights=weights, task=task, train=train, stream=stream,
                          report=report, repro_dir=repro_dir, specialize=list(specialize), **options)
