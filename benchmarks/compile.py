"""`torch.compile(backend="torch2jax")` against inductor, torch eager and torch2jax's exported artifact.

    python -m benchmarks.compile              # measure, print, and rewrite its section of docs/benchmarks.md
    python -m benchmarks.compile --no-write   # measure and print only
    python -m benchmarks.compile --quick      # two inference models, fewer rounds

Three tables, all in one process pinned to one core, runners interleaved in rounds, medians:
  - inference latency of a few benchmarks/models.py models (eval, no_grad) under each runner;
  - per-call overhead on a tiny MLP: a compiled call against a bare `jax.jit` dispatch of the same
    function on JAX arrays, and the DLPack hand-off of the input (the issue's bound: at most 2x the
    dispatch plus the hand-off);
  - one training step of a small Llama (forward, loss.backward(), AdamW.step()) under torch eager,
    inductor and torch2jax.
"""

from __future__ import annotations

import argparse
import copy
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from . import call_overhead
from .report import write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- compile:begin -->", "<!-- compile:end -->"
INFERENCE = ["mlp", "bert", "llama", "resnet", "vit"]
QUICK = ["mlp", "llama"]


def measure(calls: dict[str, Callable[[], object]], rounds: int, per_round: int, warmup: int = 3) -> dict[str, float]:
    """Median over rounds of the mean milliseconds per call (call_overhead.measure, few warm-up calls)."""
    return {label: us / 1e3 for label, us in call_overhead.measure(calls, rounds, per_round, warmup).items()}


def _compiled(module, backend: str):
    import torch

    from torch2jax.eager.dynamo_backend import backend as torch2jax_backend

    return torch.compile(module, backend=torch2jax_backend if backend == "torch2jax" else backend)


def _dynamo_alone(gm, example_inputs):
    """A backend that computes nothing: each graph's outputs, computed once, handed back on every call. What a
    compiled call costs with it is dynamo's own part (guards, the frame around the graph), which no backend avoids."""
    outputs = gm(*example_inputs)
    return lambda *args: outputs


def inference_runners(name: str) -> dict[str, Callable[[], object]]:
    import jax
    import numpy as np
    import torch

    import torch2jax

    from .models import build

    case = build(name)
    module, inputs = case.module, case.inputs
    artifact = torch2jax.convert(module, (), inputs, dynamic_shapes=case.dynamic_shapes)
    device_inputs = {k: jax.device_put(v.numpy()) for k, v in inputs.items()}
    inductor, ours = _compiled(module, "inductor"), _compiled(module, "torch2jax")
    alone = torch.compile(copy.deepcopy(module), backend=_dynamo_alone)

    def torch_call(fn):
        def call():
            with torch.no_grad():
                return fn(**inputs)
        return call

    runners = {
        "torch eager": torch_call(module),
        "inductor": torch_call(inductor),
        "torch2jax backend": torch_call(ours),
        "exported (convert)": lambda: jax.block_until_ready(artifact(**device_inputs)),
    }
    alone_call = torch_call(alone)

    def exported_then_dynamo_alone():  # in the cache state a real call leaves: right after a forward pass
        runners["exported (convert)"]()
        return alone_call()

    runners["exported + dynamo alone"] = exported_then_dynamo_alone
    want = torch_call(module)()
    got = torch_call(ours)()
    first = lambda out: out if isinstance(out, torch.Tensor) else next(iter(out.values())) if isinstance(out, dict) else out[0]  # noqa: E731
    np.testing.assert_allclose(first(got).numpy(), first(want).numpy(), rtol=1e-3, atol=1e-4, err_msg=name)
    return runners


def overhead_runners() -> dict[str, Callable[[], object]]:
    """A 16-32-4 MLP on 3 rows: the call, not the arithmetic."""
    import jax
    import torch

    from torch2jax.capture.fx import capture_graph_module
    from torch2jax.lowering import interpreter

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(3, 16)
    ours = _compiled(module, "torch2jax")
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    from torch._dynamo.backends.common import aot_autograd

    from torch2jax.capture import decomposition
    from torch2jax.eager.handoff import shared

    with torch.no_grad():
        ours(x)
        torch.compile(module, backend=aot_autograd(fw_compiler=keep, decompositions=dict(decomposition.decompositions().items())))(x)
    run = interpreter.build(capture_graph_module(graphs[0]).graph)
    by_shape = {tuple(t.shape): shared(t.detach()) for t in [*module.parameters(), x]}  # all shapes differ here
    leaves = [by_shape[tuple(n.meta["val"].shape)] for n in graphs[0].graph.nodes if n.op == "placeholder"]
    bare = jax.jit(lambda *leaves: run({}, list(leaves))[0])

    def compiled_call():
        with torch.no_grad():
            return ours(x)

    return {
        "torch2jax backend call": compiled_call,
        "bare jax.jit dispatch": lambda: jax.block_until_ready(bare(*leaves)),
        "DLPack hand-off of x": lambda: jax.dlpack.from_dlpack(x),
    }


def training_runners() -> dict[str, Callable[[], object]]:
    import torch

    from .models import build

    case = build("llama")
    base, inputs = case.module.train(), case.inputs
    labels = inputs["input_ids"]

    def step_of(module, call):
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4)

        def step():
            optimizer.zero_grad()
            logits = call(**inputs).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
            optimizer.step()
            return loss
        return step

    runners = {}
    for label, backend in (("torch eager", None), ("inductor", "inductor"), ("torch2jax backend", "torch2jax")):
        module = copy.deepcopy(base)
        runners[label] = step_of(module, module if backend is None else _compiled(module, backend))
    return runners


def _table(results: dict[str, dict[str, float]], first: str, ratio_to: str | None = None) -> str:
    labels = list(next(iter(results.values())))
    head = [first, *[f"{label} (ms)" for label in labels]] + ([f"backend / {ratio_to}"] if ratio_to else [])
    if ratio_to and "exported + dynamo alone" in labels:
        head.append("backend / (exported + dynamo alone)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, ms in results.items():
        cells = [name, *(f"{ms[label]:.3f}" for label in labels)]
        if ratio_to:
            cells.append(f"{ms['torch2jax backend'] / ms[ratio_to]:.2f}")
            if "exported + dynamo alone" in ms:
                cells.append(f"{ms['torch2jax backend'] / ms['exported + dynamo alone']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(inference: dict, overhead: dict, training: dict, rounds: int) -> str:
    us = {k: v * 1e3 for k, v in overhead.items()}
    call, dispatch, handoff = us["torch2jax backend call"], us["bare jax.jit dispatch"], us["DLPack hand-off of x"]
    bound = 2 * dispatch + handoff
    return f"""{BEGIN}
## torch.compile(backend="torch2jax")

Milliseconds per call (median of {rounds} interleaved rounds, one process pinned to one core, torch on one
thread). Inference: eval mode under `torch.no_grad()`, tensors in and out for the torch rows; the exported
artifact (`torch2jax.convert`) takes JAX arrays. "exported + dynamo alone" calls the artifact, then the same model
compiled with a backend that computes nothing (each graph's outputs computed once and handed back): the artifact's
time plus dynamo's own cost per call (guards, the Python frame around the graph), which every backend pays, measured
in the cache state a real forward pass leaves. The last column is the backend against that floor. Written by
`python -m benchmarks.compile` (`make bench-compile`).

{_table(inference, "model", ratio_to="exported (convert)")}

Per-call overhead, 16-32-4 MLP on 3 rows, microseconds: a compiled call (dynamo's guards and aot_autograd's
wrapper included) {call:.1f}; a bare `jax.jit` dispatch of the same graph on JAX arrays {dispatch:.1f}; the DLPack
hand-off of the input {handoff:.1f}. Bound (2 x dispatch + hand-off) {bound:.1f}: the call is {call / bound:.2f}x the bound.

Training step of the benchmark Llama (forward, cross-entropy, `loss.backward()`, `AdamW.step()` outside the
compiled region):

{_table(training, "model", ratio_to="inductor")}
{END}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="two inference models, three rounds")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print the section without touching --out")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    rounds = 3 if args.quick else args.rounds
    inference = {}
    for name in QUICK if args.quick else INFERENCE:
        inference[name] = measure(inference_runners(name), rounds, per_round=10)
        print(f"  {name}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in inference[name].items()), flush=True)
    overhead = measure(overhead_runners(), rounds, per_round=2000, warmup=200)
    print("  overhead: " + ", ".join(f"{k} {v * 1e3:.1f} us" for k, v in overhead.items()), flush=True)
    training = {"llama": measure(training_runners(), rounds, per_round=3)}
    print("  training: " + ", ".join(f"{k} {v:.3f} ms" for k, v in training["llama"].items()), flush=True)
    text = section(inference, overhead, training, rounds)
    print(text)
    if not args.no_write:
        write_section(args.out, text, BEGIN, END)
        print(f"wrote the compile section of {args.out}")


if __name__ == "__main__":
    main()
