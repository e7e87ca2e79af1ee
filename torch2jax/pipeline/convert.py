"""`convert_target`: any target to a verified artifact directory, the one call `torch2jax convert` wraps."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputSpecError
from ..hf.directory import is_hf_target
from ..hf.options import GenerationOptions
from ..hf.source import resolve_source
from ..hf.tasks import GENERATION_TASKS
from ..runtime.stablehlo import DEFAULT_PLATFORMS
from .conversion import BytesFn, Conversion, ProgressFn
from .forward import export_forward
from .generation import export_generator
from .targets import import_lowerings

# what `torch2jax convert` does by default: the weights streamed from the safetensors files
STREAMED = GenerationOptions(stream_weights=True)


def convert_target(
    target: str,
    out: str | os.PathLike,
    *,
    options: GenerationOptions = STREAMED,
    inputs: Sequence[str] = (),
    weights: str | None = None,
    task: str | None = None,
    platforms: Sequence[str] = DEFAULT_PLATFORMS,
    force: bool = False,
    verify: bool = True,
    train: bool = False,
    seed: int = 0,
    verify_tokens: int = 16,
    verify_layers: int = 2,
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
      options: how to convert (hf.options.GenerationOptions; default: the weights streamed, as the CLI does). Every
        conversion reads `dtype` (the model and its floating inputs converted to it first, e.g. "bfloat16"), `quantize` /
        `group_size` (the weights of the matrix products stored quantized, docs/api.md) and `stream_weights` (the
        weights read from safetensors files only while writing the artifact: hf: targets and model files with a
        .safetensors `weights`, instead of loading the whole model in torch first; encoder-decoders always load in
        memory); generators also their limits (`max_cache_len`, `max_batch`, `max_source_len`, see
        torch2jax.convert_hf) and `repeat_layers` (trace a stack of alike layers at 3 and 4 and repeat a middle one).
      inputs: example inputs as --input specs ("x=float32[batch,16]", "x=file.npy"); default: the model file's
        example_inputs(), or inputs made from an hf: model's config.
      weights: a state_dict to load (.safetensors, or .pt/.pth read with weights_only=True).
      task: hf: targets: "text-generation" / "text2text-generation" / "image-text-to-text" (a generator), or a
        forward-pass task such as "text-classification"; default: what config.json's architectures imply.
      platforms: jax.export platforms of the StableHLO.
      force: replace an existing `out`.
      verify: compare the saved artifact with torch (forward passes: the example inputs, random inputs and a second
        size of each symbolic dim) or with transformers' greedy generate (generators) before renaming it into place.
      train: export in training mode (default: eval).
      seed: seed for model construction and random example inputs.
      verify_tokens: generators: greedy tokens compared with transformers (bfloat16: the first 8 must be equal).
      verify_layers: streamed causal LMs deeper than this are verified on a slice of their first layers.
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
    saving = dict(platforms=tuple(platforms), force=force, verify=verify, seed=seed, progress=progress, on_bytes=on_bytes)
    source = None
    if is_hf_target(target):
        source = resolve_source(target, task)  # the directory and its config, read once for whichever path follows
        if source.task in GENERATION_TASKS:
            if specialize:
                raise InputSpecError(f"--specialize is for forward-pass conversions; {source.task} builds its own inputs")
            return export_generator(source, out, options=options, verify_tokens=verify_tokens, verify_layers=verify_layers, **saving)
    return export_forward(target, out, options=options, source=source, inputs=inputs, weights=weights, task=task, train=train,
                          report=report, repro_dir=repro_dir, specialize=list(specialize), **saving)
