"""A forward-pass target (a model file, or an hf: model for a forward task) to an artifact checked against torch."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch.utils._pytree as pytree

from ..capture.converter import StageTimer, cast, convert, quantize_like
from ..capture.target import Target
from ..diagnose import repro
from ..diagnose.report import ReportData, reporting
from ..diagnose.verify import check
from ..diagnose.verify import verify as compare_with_torch
from ..errors import LoweringError, UnsupportedOpsError
from ..hf.options import GenerationOptions
from ..hf.source import HFSource
from ..ir.graph import Graph
from ..runtime import artifact, stablehlo
from .conversion import BytesFn, Conversion, ProgressFn
from .targets import resolve_target


def export_forward(target: str, out: Path, *, options: GenerationOptions, source: HFSource | None, inputs: Sequence[str],
                   weights: str | None, task: str | None, platforms: Sequence[str], force: bool, verify: bool, train: bool,
                   seed: int, report: str | os.PathLike | None, repro_dir: str | os.PathLike | None,
                   progress: ProgressFn | None, on_bytes: BytesFn | None, specialize: list[str] | None = None) -> Conversion:
    """See pipeline.convert_target (`source`: an hf: target as it resolved there); verification runs inside the save,
    before the rename. Of `options`, a forward pass reads dtype, stream_weights, quantize and group_size."""
    timer = StageTimer(progress)
    data = ReportData(title="torch2jax conversion report", target=target, artifact=str(out), timings=timer.timings)
    with reporting(data, report, lambda line: None):
        with timer.stage("build model", f"build {target}"):
            resolved = resolve_target(target, inputs, weights, task=task, train=train, seed=seed,
                                      stream=options.stream_weights, source=source)
            if options.dtype:
                resolved.module, resolved.args, resolved.kwargs = cast(resolved.module, resolved.args, resolved.kwargs,
                                                                       options.dtype, resolved.weights)
        model = None
        from ..hf import stand_ins  # noqa: F401 - the trace-time stand-ins for transformers code, wherever it sits
        try:
            model = convert(resolved.module, resolved.args, resolved.kwargs, resolved.dynamic_shapes, timer=timer,
                            weights=resolved.weights, quantize=options.quantize, group_size=options.group_size,
                            specialize=specialize)
            data.graph = model.graph
            with timer.stage("jax.export", "jax.export to StableHLO"):
                exported = stablehlo.export(model, list(platforms))
        except (UnsupportedOpsError, LoweringError) as err:
            _add_repro(err, model.graph if model is not None else None, resolved, repro_dir)
            raise

        def check_artifact(tmp: Path) -> None:
            if not verify:
                return
            with timer.stage("verify", "compare the saved artifact with PyTorch"):
                loaded = artifact.load(tmp)
                module = resolved.module if resolved.weights is None else resolved.weights.materialize(resolved.module)
                quantize_like(module, model.quantization)  # torch computes with the weights the artifact holds
                data.verification = compare_with_torch(module, loaded, resolved.args, resolved.kwargs, seed)
            check(data.verification)

        if progress:
            progress("save", f"write {out}")
        start = time.perf_counter()
        try:
            artifact.save(model, out, force=force, source=target, exported=exported, check=check_artifact, on_bytes=on_bytes,
                          **_encoder_files(source))
        finally:
            # verification runs inside the save (before the rename); count it once, under its own name
            timer.timings["save"] = time.perf_counter() - start - timer.timings.get("verify", 0.0)
    streamed = resolved.weights is not None
    checks = []
    if data.verification is not None:
        how = " (the whole model, its weights memory-mapped from the safetensors files)" if streamed else ""
        quantized = f" with the {model.quantization['scheme']} weights dequantized" if model.quantization else ""
        checks.append(f"verified against PyTorch{how}{quantized}:\n{data.verification.summary()}")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return Conversion(out, size, str(model.signature), streamed, checks)


def _encoder_files(source: HFSource | None) -> dict:
    """What a feature-extraction model's artifact keeps besides its function, so that `torch2jax serve` can embed text
    without torch or the source directory: its tokenizer files, `task`, and the `embedding` section (its
    sentence-transformers pooling and normalization, its position limit: hf/pooling.py)."""
    if source is None or source.task != "feature-extraction":
        return {}
    from ..hf.pooling import embedding_section

    extra = {"task": source.task, "embedding": embedding_section(source.directory, source.config)}
    return {"tokenizer_files": dict(source.tokenizer_files), "extra": extra}


def _add_repro(err: Exception, graph: Graph | None, resolved: Target, repro_dir: str | os.PathLike | None) -> None:
    """Write a standalone script reproducing the one failing op, and name it in the error."""
    graph = getattr(err, "graph", None) or graph
    ops = getattr(err, "ops", None) or ([err.node.op] if getattr(err, "node", None) is not None else [])
    node = repro.failing_node(graph, ops) if graph is not None else None
    if node is None:
        return
    shapes = [tuple(x.shape) for x in pytree.tree_flatten((resolved.args, resolved.kwargs))[0] if hasattr(x, "shape")]
    model_file = getattr(resolved.file_module, "__file__", None)
    reason = f"no JAX lowering for {node.op}" if isinstance(err, UnsupportedOpsError) else str(err)
    path = repro.write_repro(graph, node, repro.symbol_sizes(graph, shapes), reason, repro_dir, model_file)
    err.args = (f"{err}\nA standalone reproduction of this op: {path} (run it with python after adding or fixing the lowering).",)
