"""Per-call cost of a converted model against a bare `jax.jit` call, torch eager and ONNX Runtime.

    python -m benchmarks.call_overhead                  # measure, print, and rewrite its section of docs/benchmarks.md
    python -m benchmarks.call_overhead --no-write       # measure and print only

Serving code calls a model at high rates with small batches, where the Python around a call (input
checks, flattening, unflattening) can cost more than the computation. Every runner is timed side by side
in one process pinned to one core, in interleaved rounds; the table gives the median microseconds per
call (each call waits for its result) and the ratio to `jax.jit(model.apply)(params, x)`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.report import write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- call-overhead:begin -->", "<!-- call-overhead:end -->"

# name -> (layer widths, batch): Linear/SiLU stacks from a few hundred params to ~8M
MODELS = {
    "small": ((16, 32, 4), 3),
    "medium": ((256, 1024, 1024, 256), 8),
    "large": ((1024, 2048, 2048, 1024), 8),
}


def build(widths: tuple[int, ...]):
    import torch

    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(torch.nn.SiLU())
    torch.manual_seed(0)
    return torch.nn.Sequential(*layers).eval()


def runners(name: str, work: Path) -> dict[str, Callable[[], object]]:
    """Each way of calling the same model on the same input, as a no-argument function that waits for the result."""
    import jax
    import numpy as np
    import torch

    import torch2jax

    widths, batch = MODELS[name]
    module = build(widths)
    x = torch.randn(batch, widths[0])
    jm = torch2jax.convert(module, (x,), dynamic_shapes={"input": {0: "batch"}})
    torch2jax.save(jm, work / name, force=True)
    loaded = torch2jax.load(work / name)
    xj = jax.device_put(x.numpy())
    apply = jax.jit(jm.apply)
    identity = jax.jit(lambda v: v)
    found = {
        "torch eager": lambda: _torch_call(module, x),
        "jax.jit(lambda x: x)": lambda: identity(xj).block_until_ready(),
        "jax.jit(apply)(params, x)": lambda: apply(jm.params, xj).block_until_ready(),
        "jm(x)": lambda: jm(xj).block_until_ready(),
        "torch2jax.load(dir)(x)": lambda: loaded(xj).block_until_ready(),
    }
    session = _onnx_session(module, x, work / f"{name}.onnx")
    if session is not None:
        feed = {session.get_inputs()[0].name: x.numpy()}
        found["onnxruntime"] = lambda: session.run(None, feed)
    want = module(x).detach().numpy()
    for label in ("jm(x)", "torch2jax.load(dir)(x)"):
        np.testing.assert_allclose(np.asarray(found[label]()), want, rtol=1e-4, atol=1e-5, err_msg=label)
    return found


def _torch_call(module, x):
    import torch

    with torch.inference_mode():
        return module(x)


def _onnx_session(module, x, path: Path):
    """An ONNX Runtime session on one thread, or None where onnxruntime or the exporter is not installed."""
    try:
        import onnxruntime
        import torch

        torch.onnx.export(module, (x,), str(path), dynamo=True, dynamic_shapes={"input": {0: "batch"}}, verbose=False)
    except Exception as err:  # noqa: BLE001 - the bench extra is optional; say why the column is empty
        print(f"  onnxruntime skipped: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", file=sys.stderr)
        return None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(calls: dict[str, Callable[[], object]], rounds: int, per_round: int, warmup: int = 200) -> dict[str, float]:
    """Median over rounds of the mean microseconds per call; runners interleaved within each round."""
    for call in calls.values():
        for _ in range(warmup):
            call()
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            start = time.perf_counter()
            for _ in range(per_round):
                call()
            samples[label].append((time.perf_counter() - start) / per_round * 1e6)
    return {label: statistics.median(values) for label, values in samples.items()}


def table(results: dict[str, dict[str, float]]) -> str:
    labels = list(next(iter(results.values())))
    head = ["model (widths, batch)", *labels, "jm(x) - jit(apply)", "loaded - jit(apply)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, us in results.items():
        widths, batch = MODELS[name]
        base = us["jax.jit(apply)(params, x)"]
        cells = [f"{name} ({'-'.join(map(str, widths))}, {batch})", *(f"{us[label]:.1f}" for label in labels)]
        cells += [f"{us['jm(x)'] - base:+.1f}", f"{us['torch2jax.load(dir)(x)'] - base:+.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(results: dict[str, dict[str, float]], rounds: int, per_round: int) -> str:
    return f"""{BEGIN}
## Call overhead

Microseconds per call (median of {rounds} interleaved rounds of {per_round} calls, one process pinned to one
core, each call waiting for its result; input already a device array for the JAX rows, a tensor for torch, numpy
for ONNX Runtime). `jm(x)` and a loaded artifact run their input checks while jax traces, once per input
signature, so a steady-state call is one `jax.jit` dispatch. Written by `python -m benchmarks.call_overhead`.

{table(results)}
{END}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print the table without touching --out")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import torch

    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for name in MODELS:
            calls = runners(name, Path(work))
            per_round = max(20, args.calls // (1 if name == "small" else 10))
            results[name] = measure(calls, args.rounds, per_round)
            print(f"  {name}: " + ", ".join(f"{k} {v:.1f} us" for k, v in results[name].items()), flush=True)
    text = section(results, args.rounds, args.calls)
    print(text)
    if not args.no_write:
        write_section(args.out, text, BEGIN, END)
        print(f"wrote the call-overhead section of {args.out}")


if __name__ == "__main__":
    main()
