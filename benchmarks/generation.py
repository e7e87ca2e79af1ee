"""Text generation speed: a converted Llama-shaped model's `generate` against transformers on CPU.

    python -m benchmarks.generation                 # measure, print, rewrite its section of docs/benchmarks.md
    python -m benchmarks.generation --no-write

One process pinned to one core (one intra-op thread everywhere), random weights from a config, float32,
prompt 32 tokens, 128 new tokens, batch 1 and 8, end token disabled so every run makes every token.
Time to first token (TTFT) is prefill + the first token; decode tokens/s counts the rest. The bound
is what reading the weights and the filled cache once per step costs at this machine's measured copy
bandwidth (a lower bound on a decode step's time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- generation:begin -->", "<!-- generation:end -->"
PROMPT, NEW = 32, 128


def llama(directory: Path, max_positions: int = 1024, **config: int):
    """The 56M Llama-shaped benchmark model (random weights, seeded), saved to `directory`; `config` overrides fields
    (a vocabulary size, special token ids)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**dict(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                                                num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
                                                max_position_embeddings=max_positions), **config})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    return model


def matmul_flops_per_s(m: int, k: int, n: int) -> float:
    """Float32 GEMM throughput at [m, k] x [k, n]: the best of jax's and torch's, medians of 5 (a bound's compute side)."""
    import jax
    import jax.numpy as jnp
    import torch

    a, b = jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)
    mm = jax.jit(jnp.matmul)
    ta, tb = torch.ones(m, k), torch.ones(k, n)
    best = 0.0
    for run in (lambda: mm(a, b).block_until_ready(), lambda: ta @ tb):
        run()
        times = []
        for _ in range(5):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        best = max(best, 2 * m * k * n / statistics.median(times))
    return best


def bandwidth_bytes_per_s() -> float:
    """Read bandwidth: the median time of a jitted sum over a 512 MiB array (far beyond every cache)."""
    import jax
    import jax.numpy as jnp

    data = jnp.ones(128 << 20, jnp.float32)
    total = jax.jit(jnp.sum)
    total(data).block_until_ready()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        total(data).block_until_ready()
        times.append(time.perf_counter() - start)
    return data.nbytes / statistics.median(times)


def unread_embedding_bytes(model) -> int:
    """The input embedding table's bytes, which a decode step does not read (a gather reads B rows); 0 when the LM
    head shares it."""
    embedding = model.get_input_embeddings().weight
    return 0 if embedding is model.get_output_embeddings().weight else embedding.numel() * embedding.element_size()


def bytes_per_step(g, batch: int, unread: int) -> float:
    """What one decode step must read: every weight but `unread` bytes (the input embedding table), the average
    filled cache."""
    weights = sum(p.size * p.dtype.itemsize for p in g.params.values()) - unread
    cache_values = batch * sum(int(np.prod(s)) for s in g.spec.cache_shapes) * (PROMPT + NEW // 2) / (PROMPT + NEW)
    return weights + cache_values * 4


def time_ours(g, ids: np.ndarray, rounds: int, new: int = NEW, **inputs) -> tuple[float, float]:
    """(TTFT s, decode tokens/s per row) medians over rounds, after a warm-up that compiles; `inputs` go to generate
    (a vision-language model's pixel values)."""
    list(g.generate(ids, max_new_tokens=new, eos_token_id=[], stream=True, **inputs))
    ttft, rate = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        steps = g.generate(ids, max_new_tokens=new, eos_token_id=[], stream=True, **inputs)
        next(steps)
        first = time.perf_counter()
        for _ in steps:
            pass
        end = time.perf_counter()
        ttft.append(first - start)
        rate.append((new - 1) / (end - first))
    return statistics.median(ttft), statistics.median(rate)


def time_transformers(model, ids: np.ndarray, rounds: int, new: int = NEW, **options) -> tuple[float, float]:
    """(TTFT s, decode tokens/s) of transformers' eager generate; `options` go to generate (tensors, e.g. pixel_values)."""
    import torch

    ids_t = torch.from_numpy(ids).to(model.device)

    def run(count: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids_t, max_new_tokens=count, min_new_tokens=count, do_sample=False, pad_token_id=0, **options).cpu()
        return time.perf_counter() - start

    run(new)
    ttft = statistics.median(run(1) for _ in range(rounds))
    total = statistics.median(run(new) for _ in range(rounds))
    return ttft, (new - 1) / max(total - ttft, 1e-9)


def time_compiled(model, ids: np.ndarray, rounds: int) -> tuple[float, float]:
    """transformers' static-cache generate with the model's forward compiled by torch.compile (inductor)."""
    import torch

    eager_forward = model.forward
    model.forward = torch.compile(eager_forward, fullgraph=True)
    try:
        return time_transformers(model, ids, rounds, cache_implementation="static")
    finally:
        model.forward = eager_forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--compile", action="store_true", help="also torch.compile transformers' static-cache decode (minutes)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import torch

    import torch2jax

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        model = llama(Path(work) / "llama")
        params = sum(p.numel() for p in model.parameters())
        start = time.perf_counter()
        g = torch2jax.convert_hf(Path(work) / "llama", max_cache_len=PROMPT + NEW, max_batch=8)
        convert_s = time.perf_counter() - start
        bandwidth = bandwidth_bytes_per_s()
        step_bytes = {}
        for batch in (1, 8):
            ids = np.random.default_rng(0).integers(3, 32000, (batch, PROMPT))
            step_bytes[batch] = bytes_per_step(g, batch, unread_embedding_bytes(model))
            bound = bandwidth / step_bytes[batch]  # steps per second when only memory traffic counted
            results = {"torch2jax generate": time_ours(g, ids, args.rounds),
                       "transformers eager (dynamic cache)": time_transformers(model, ids, args.rounds),
                       "transformers eager (static cache)": time_transformers(model, ids, args.rounds, cache_implementation="static")}
            if args.compile:
                results["transformers torch.compile (static cache)"] = time_compiled(model, ids, args.rounds)
            for label, (ttft, rate) in results.items():
                rows.append((batch, label, ttft, rate, rate / bound))
                print(f"  batch {batch} {label}: TTFT {ttft * 1e3:.1f} ms, decode {rate:.1f} tok/s per row", flush=True)
    base = {b: next(r[3] for r in rows if r[0] == b and r[1].startswith("transformers eager (dynamic")) for b in (1, 8)}
    lines = ["| batch | runtime | TTFT (ms) | decode tok/s per row | vs transformers eager | of the memory bound |",
             "|---|---|---|---|---|---|"]
    for batch, label, ttft, rate, share in rows:
        lines.append(f"| {batch} | {label} | {ttft * 1e3:.1f} | {rate:.1f} | {rate / base[batch]:.2f}x | {share:.0%} |")
    text = f"""{BEGIN}
## Text generation

Llama-shaped, {params / 1e6:.0f}M params, float32, random weights; prompt {PROMPT}, {NEW} new tokens, one core and one
thread, medians of {args.rounds} runs after a warm-up. Conversion (`convert_hf`, both entry points) took {convert_s:.1f} s.
The memory bound is one step reading {step_bytes[1] / 1e6:.0f} MB (batch 1; {step_bytes[8] / 1e6:.0f} MB at batch 8: the weights
but the input embedding table, and the average filled cache) at {bandwidth / 1e9:.1f} GB/s (read bandwidth measured here);
at batch 8 a step is bound by the matmuls' arithmetic rather than by memory. Written by `python -m benchmarks.generation`.

{chr(10).join(lines)}
{END}"""
    print(text)
    if not args.no_write:
        write_section(args.out, text, BEGIN, END)
        print(f"wrote the generation section of {args.out}")


if __name__ == "__main__":
    main()
