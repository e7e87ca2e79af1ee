"""Measure one model in one fresh process: conversion (time per stage, peak memory, artifact), then latency.

    python -m benchmarks.worker MODEL --artifact DIR --result FILE.json [--rounds N] [--threads N]

Run by benchmarks/run.py with the thread settings already in the environment (they must be set before torch
and jax are imported). Conversion comes first, so the process's peak RSS (ru_maxrss) right after `save`
is the conversion's peak. Latency then compares every runtime inside this one process, interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from benchmarks.models import BenchCase, build
from torch2jax.capture.converter import StageTimer, convert
from torch2jax.runtime import artifact, stablehlo
from torch2jax.runtime.model import Model

WARMUP_CALLS = 3
WARMUP_ROUNDS = 2
SAMPLE_SECONDS = 0.02  # each timed sample repeats a call until it lasts about this long


def rss_bytes() -> int:
    """The process's current resident set size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def max_rss() -> int:
    """The process's peak resident set size so far (ru_maxrss)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def weights_bytes(module: torch.nn.Module) -> int:
    """Bytes of the module's state_dict, each storage counted once (tied weights once)."""
    seen: dict[int, int] = {}
    for tensor in module.state_dict().values():
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def jax_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Torch inputs as numpy in the dtypes JAX carries them (int64 -> int32 unless x64 is on)."""
    return {name: np.asarray(jnp.asarray(t.numpy())) for name, t in inputs.items()}


@contextlib.contextmanager
def _gc_pauses(current_stage: Callable[[], str]):
    """Seconds of cyclic-GC pauses per stage. A full collection after torch.export walks everything it
    allocated (0.4 s on tiny_gpt) and lands in whichever stage next allocates: timed apart."""
    pauses: dict[str, float] = {}
    started: list[float] = []

    def callback(phase: str, _info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            stage = current_stage()
            pauses[stage] = pauses.get(stage, 0.0) + time.perf_counter() - started.pop()

    gc.callbacks.append(callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(callback)


def measure_conversion(case: BenchCase, out_dir: Path) -> tuple[Model, dict]:
    """Convert, jax.export and save the model, timing each stage; peak memory is ru_maxrss over the RSS before."""
    jax.devices()  # start the CPU client before the baseline: it is not part of conversion
    base = rss_bytes()
    marks: list[tuple[str, int]] = []  # (stage, high-water mark as it starts)
    timer = StageTimer(progress=lambda stage, _message: marks.append((stage, max_rss())))
    with _gc_pauses(lambda: marks[-1][0] if marks else "export") as gc_s:
        model = convert(case.module, (), case.inputs, case.dynamic_shapes, timer=timer)
        with timer.stage("jax.export", "stablehlo.export"):
            exported = stablehlo.export(model)
        with timer.stage("save", "artifact.save"):
            artifact.save(model, out_dir, force=True, exported=exported)
    peak = max_rss()
    marks.append(("end", peak))
    marks[0] = (marks[0][0], max(marks[0][1], base))
    rises = {stage: after - before for (stage, before), (_, after) in zip(marks, marks[1:])}
    files = {p.name: dir_bytes(p) if p.is_dir() else p.stat().st_size for p in out_dir.iterdir()}
    return model, {
        "stages_s": dict(timer.timings),
        "gc_pauses_s": dict(gc_s),  # Python's cyclic GC, by the stage it happened to interrupt
        "rss_before_bytes": base,
        "peak_bytes": peak,
        "peak_extra_bytes": peak - base,
        "peak_rise_by_stage": rises,  # how much each stage raised the high-water mark
        "artifact_bytes": dir_bytes(out_dir),
        "artifact_files": files,
    }


def first_tensor(out: Any, key: Any = None) -> Any:
    """The first output tensor of a module or converted model (dict outputs by torch's first key)."""
    if hasattr(out, "keys"):
        return out[key]
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def runtimes(case: BenchCase, model: Model, artifact_dir: Path, tmp: Path) -> tuple[dict[str, Callable[[], Any]], dict, dict]:
    """One zero-argument callable per runtime (each blocks until its result is ready), why others are missing,
    and how long the optional ones took to build and run once (torch.compile's compile, ONNX export)."""
    module, inputs = case.module, case.inputs
    fns: dict[str, Callable[[], Any]] = {"torch eager": lambda: module(**inputs)}
    failed: dict[str, str] = {}
    setup_s: dict[str, float] = {}

    jinputs = {name: jnp.asarray(a) for name, a in jax_inputs(inputs).items()}
    apply = jax.jit(model.apply)
    params = model.params
    fns["converted"] = lambda: jax.block_until_ready(apply(params, **jinputs))
    start = time.perf_counter()
    fns["converted"]()
    setup_s["converted"] = time.perf_counter() - start  # XLA compilation, mostly
    loaded = artifact.load(artifact_dir)
    fns["artifact"] = lambda: jax.block_until_ready(loaded(**jinputs))

    attempts: dict[str, Callable[[], Callable[[], Any]]] = {
        "torch.compile": lambda: _torch_compile(case),
        "onnxruntime": lambda: _onnxruntime(case, tmp),
        "torchax": lambda: _torchax(case),
    }
    for name, make in attempts.items():
        start = time.perf_counter()
        try:
            fn = make()
            fn()  # compile / first run inside the try: a failure here is recorded, not fatal
            fns[name] = fn
            setup_s[name] = time.perf_counter() - start
        except Exception as err:
            lines = str(err).strip().splitlines()
            failed[name] = f"{type(err).__name__}: {lines[0][:300] if lines else ''}"
    return fns, failed, setup_s


def _torch_compile(case: BenchCase) -> Callable[[], Any]:
    compiled = torch.compile(case.module)  # default: inductor
    return lambda: compiled(**case.inputs)


def _onnxruntime(case: BenchCase, tmp: Path) -> Callable[[], Any]:
    import onnxruntime as ort

    path = tmp / "model.onnx"
    torch.onnx.export(case.module, (), kwargs=case.inputs, f=str(path), dynamo=True, verbose=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    arrays = [t.numpy() for t in case.inputs.values()]
    feed = {}
    for i, spec in enumerate(session.get_inputs()):
        feed[spec.name] = case.inputs[spec.name].numpy() if spec.name in case.inputs else arrays[i]
    return lambda: session.run(None, feed)


def _torchax(case: BenchCase) -> Callable[[], Any]:
    import torchax  # 0.0.13, the newest on PyPI, fails to import with torch 2.13

    weights, fn = torchax.extract_jax(case.module)
    jitted = jax.jit(lambda w, kw: fn(w, (), kw))
    kwargs = {name: jnp.asarray(a) for name, a in jax_inputs(case.inputs).items()}
    return lambda: jax.block_until_ready(jitted(weights, kwargs))


def time_interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Round-robin timing: each round times one sample of every runtime, starting from a rotating position.

    Returns per runtime the per-call wall seconds and process-CPU seconds of each round.
    """
    names = list(fns)
    for fn in fns.values():
        for _ in range(WARMUP_CALLS):
            fn()
    number = {}
    for name, fn in fns.items():  # calls per sample, so that a sample lasts about SAMPLE_SECONDS
        start = time.perf_counter()
        fn()
        number[name] = max(1, round(SAMPLE_SECONDS / max(time.perf_counter() - start, 1e-6)))
    samples: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in names}
    for r in range(WARMUP_ROUNDS + rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn, n = fns[name], number[name]
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(n):
                fn()
            if r >= WARMUP_ROUNDS:
                samples[name]["wall"].append((time.perf_counter() - wall) / n)
                samples[name]["cpu"].append((time.process_time() - cpu) / n)
    return samples


def measure_latency(case: BenchCase, model: Model, artifact_dir: Path, rounds: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        fns, failed, setup_s = runtimes(case, model, artifact_dir, Path(tmp))
        out = case.module(**case.inputs)
        key = next(iter(out.keys())) if hasattr(out, "keys") else None
        expected, got = first_tensor(out, key).double().numpy(), np.asarray(first_tensor(fns["converted"](), key), np.float64)
        max_err = float(np.max(np.abs(got - expected)))
        samples = time_interleaved(fns, rounds)
    return {
        "samples": samples,
        "failed": failed,
        "setup_s": setup_s,
        "affinity": sorted(os.sched_getaffinity(0)),
        "max_abs_err": max_err,
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--artifact", type=Path, required=True, help="where to save the artifact")
    parser.add_argument("--result", type=Path, required=True, help="JSON file to write the measurements to")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)

    case = build(args.model)
    result: dict[str, Any] = {
        "model": args.model,
        "shape": case.shape,
        "params": sum(p.numel() for p in case.module.parameters()),
        "weights_bytes": weights_bytes(case.module),
        "pid": os.getpid(),
    }
    try:
        model, result["conversion"] = measure_conversion(case, args.artifact)
        np.savez(args.artifact.parent / f"{args.model}-inputs.npz", **jax_inputs(case.inputs))
        if case.latency:
            result["latency"] = measure_latency(case, model, args.artifact, args.rounds)
    except Exception as err:
        result["error"] = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    args.result.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
