"""The eager jax device: microseconds per op on small tensors, and a small Llama forward.

Each row times one op on the `jax` device (torch2jax.eager) against the same op in torch on the CPU,
median of interleaved rounds, each round waiting for its last result. A Llama forward (random
weights, eager attention) and its training step run op by op on the device, as one program
(`te.jit`, `te.jit_train_step`), and in torch eager. torchax is not installed in this environment,
so it has no column. Rewrites its section of docs/benchmarks.md: `python -m benchmarks.eager`
(make bench-eager).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import torch

import torch2jax.eager as te
from benchmarks.report import write_section

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- eager:begin -->", "<!-- eager:end -->"


def ops(x, w, big):
    """name -> a zero-argument call on the given tensors (a 4x8 input, an 8x8 weight)."""
    return {
        "x + x": lambda: x + x,
        "x * 2": lambda: x * 2,
        "x @ w": lambda: x @ w,
        "relu": lambda: x.relu(),
        "sum(dim=1)": lambda: x.sum(1),
        "softmax(-1)": lambda: x.softmax(-1),
        "x.t() (view)": lambda: x.t(),
        "x[:, 1:] (view)": lambda: x[:, 1:],
        "big.add_(1) (in place)": lambda: big.add_(1),
        "linear(x, w, b)": lambda: torch.nn.functional.linear(x, w, w[0]),
    }


def _sync(value) -> None:
    if isinstance(value, torch.Tensor) and value.device.type == "jax":
        te.jax_view(value).block_until_ready()


def time_call(fn, calls: int) -> float:
    """Microseconds per call over `calls` calls, waiting for the last result."""
    start = time.perf_counter()
    for _ in range(calls):
        out = fn()
    _sync(out)
    return (time.perf_counter() - start) / calls * 1e6


def per_op(rounds: int, calls: int) -> list[tuple[str, float, float]]:
    torch.manual_seed(0)
    x, w, big = torch.randn(4, 8), torch.randn(8, 8), torch.randn(4, 8)
    on_cpu = ops(x, w, big)
    on_jax = ops(x.to("jax"), w.to("jax"), big.to("jax"))
    rows = []
    for name in on_cpu:
        for fn in (on_cpu[name], on_jax[name]):
            time_call(fn, 50)  # warm-up: jax compiles each op once per shape
        cpu, jax_ = [], []
        for _ in range(rounds):
            cpu.append(time_call(on_cpu[name], calls))
            jax_.append(time_call(on_jax[name], calls))
        rows.append((name, statistics.median(cpu), statistics.median(jax_)))
    return rows


def _llama(train: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    model = LlamaForCausalLM(config).train(train)
    on_jax = LlamaForCausalLM(config).train(train)
    on_jax.load_state_dict(model.state_dict())
    return model, on_jax.to("jax"), torch.randint(0, 256, (1, 16))


def llama_forward(rounds: int) -> tuple[dict, int]:
    model, on_jax, ids = _llama(train=False)
    jitted = te.jit(on_jax)
    jax_ids = ids.to("jax")
    calls = {
        "torch eager (CPU)": lambda: model(ids).logits,
        "jax device, op by op": lambda: on_jax(jax_ids).logits,
        "jax device, te.jit": lambda: jitted(jax_ids).logits,
    }
    with torch.no_grad():
        # use_cache=False: torch.tensor(device="jax"), which the cache calls, fails under a dispatch mode
        ops_per_forward = _count_ops(lambda: on_jax(jax_ids, use_cache=False))
        return median_ms(calls, rounds, 5), ops_per_forward


def llama_train_step(rounds: int) -> dict:
    """Forward, backward and an AdamW step: torch eager, the jax device op by op, te.jit_train_step."""
    model, on_jax, ids = _llama(train=True)
    jitted_model = copy.deepcopy(on_jax)

    def loss_fn(m, x):  # an explicit mask: transformers' packed-sequence check reads values (.all())
        return m(x, attention_mask=torch.ones_like(x), use_cache=False).logits.square().mean()

    def eager_step(m, opt, x):
        def step():
            opt.zero_grad()
            loss = loss_fn(m, x)
            loss.backward()
            opt.step()
            return loss
        return step

    jitted = te.jit_train_step(jitted_model, torch.optim.AdamW(jitted_model.parameters(), capturable=True), loss_fn)
    jax_ids = ids.to("jax")
    calls = {
        "torch eager (CPU)": eager_step(model, torch.optim.AdamW(model.parameters()), ids),
        "jax device, op by op": eager_step(on_jax, torch.optim.AdamW(on_jax.parameters()), jax_ids),
        "jax device, te.jit_train_step": lambda: jitted(jax_ids),
    }
    return median_ms(calls, rounds, 3)


def median_ms(calls: dict, rounds: int, per_round: int) -> dict:
    """name -> median milliseconds per call, the calls interleaved round by round after a warm-up."""
    for fn in calls.values():
        time_call(fn, 3)
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(time_call(fn, per_round) / 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def _count_ops(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return Count.n


def section(rows, llama, ops_per_forward, train) -> str:
    lines = [BEGIN, "## Eager jax device", "",
             "Microseconds per op on a 4x8 float32 tensor (8x8 weight), one process on one core, median of "
             "interleaved rounds, each waiting for its last result. Written by `python -m benchmarks.eager`.", "",
             "| op | torch CPU (us) | jax device (us) | ratio |", "|---|---|---|---|"]
    lines += [f"| {name} | {cpu:.1f} | {jx:.1f} | {jx / cpu:.1f}x |" for name, cpu, jx in rows]
    lines += ["", f"Mean over these ops: {statistics.mean(r[2] for r in rows):.1f} us on the jax device "
              f"(target: at most 50), {statistics.mean(r[1] for r in rows):.1f} us in torch on the CPU.", "",
              f"A Llama forward (hidden 64, 2 layers, 16 tokens, random weights, eager attention; "
              f"{ops_per_forward} ATen ops):", "", "| runtime | ms per forward |", "|---|---|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in llama.items()]
    lines += ["", "A training step of the same Llama (forward, backward, AdamW):", "",
              "| runtime | ms per step |", "|---|---|"]
    lines += [f"| {name} | {ms:.2f} |" for name, ms in train.items()]
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    torch.set_num_threads(1)
    te.enable()
    rows = per_op(args.rounds, args.calls)
    llama, ops_per_forward = llama_forward(args.rounds)
    train = llama_train_step(args.rounds)
    text = section(rows, llama, ops_per_forward, train)
    print(text)
    if not args.no_write:
        write_section(args.out, text, BEGIN, END)


if __name__ == "__main__":
    main()
