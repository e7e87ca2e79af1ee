"""Quantized decoding: the generation benchmark's model as float32, bfloat16, int8 and int4 artifacts.

    python -m benchmarks.quantized                 # measure, print, rewrite its section of docs/benchmarks.md
    python -m benchmarks.quantized --no-write

One process pinned to one core, the same Llama-shaped model, prompt and lengths as benchmarks/generation.py.
Each artifact's memory bound is its own: the bytes one decode step reads (its weights as stored, but the input
embedding table, and the average filled cache) at this machine's measured read bandwidth.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.generation import NEW, PROMPT, ROOT, bandwidth_bytes_per_s, bytes_per_step, llama, time_ours, unread_embedding_bytes
from benchmarks.report import write_section

BEGIN, END = "<!-- quantized:begin -->", "<!-- quantized:end -->"
VARIANTS = {"float32": {}, "bfloat16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"},
            "int8-dynamic": {"quantize": "int8-dynamic"}, "int4 (group 64)": {"quantize": "int4", "group_size": 64}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--only", nargs="+", choices=[label.split()[0] for label in VARIANTS],
                        help="measure these (float32 always, as the baseline); implies --no-write")
    args = parser.parse_args()
    variants = {label: options for label, options in VARIANTS.items()
                if not args.only or label.split()[0] in {"float32", *args.only}}
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import torch

    import torch2jax

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        model = llama(Path(work) / "llama")
        bandwidth = bandwidth_bytes_per_s()
        for label, options in variants.items():
            start = time.perf_counter()
            g = torch2jax.convert_hf(Path(work) / "llama", max_cache_len=PROMPT + NEW, max_batch=8, stream_weights=True, **options)
            out = torch2jax.save(g, Path(work) / label.split()[0], platforms=["cpu"])
            convert_s = time.perf_counter() - start
            g = torch2jax.load(out)
            size = sum(p.stat().st_size for p in (out / "params").rglob("*") if p.is_file())
            for batch in (1, 8):
                ids = np.random.default_rng(0).integers(3, 32000, (batch, PROMPT))
                ttft, rate = time_ours(g, ids, args.rounds)
                bound = bandwidth / bytes_per_step(g, batch, unread_embedding_bytes(model))
                rows.append((label, batch, size, convert_s, ttft, rate, rate / bound))
                print(f"  {label} batch {batch}: {size / 1e6:.0f} MB, TTFT {ttft * 1e3:.1f} ms, decode {rate:.1f} tok/s, "
                      f"{rate / bound:.0%} of its bound", flush=True)
    base = {b: next(r[5] for r in rows if r[0] == "float32" and r[1] == b) for b in (1, 8)}
    lines = ["| weights | batch | params on disk (MB) | TTFT (ms) | decode tok/s per row | vs float32 | of its own memory bound |",
             "|---|---|---|---|---|---|---|"]
    for label, batch, size, _, ttft, rate, share in rows:
        lines.append(f"| {label} | {batch} | {size / 1e6:.0f} | {ttft * 1e3:.1f} | {rate:.1f} | {rate / base[batch]:.2f}x | {share:.0%} |")
    text = f"""{BEGIN}
## Quantized text generation

The text-generation model above (Llama-shaped, random weights; prompt {PROMPT}, {NEW} new tokens, one core and one thread,
medians of {args.rounds} runs after a warm-up), converted with `--dtype bfloat16`, `--quantize int8`, `int8-dynamic` and `int4`
(the projections and the LM head; embeddings and norms stay float32; int8-dynamic also rounds each Linear's input
rows to int8), streamed, saved and loaded. Each
memory bound counts the bytes that artifact's decode step reads, at {bandwidth / 1e9:.1f} GB/s. Written by
`python -m benchmarks.quantized`.

{chr(10).join(lines)}
{END}"""
    print(text)
    if not args.no_write and not args.only:
        write_section(args.out, text, BEGIN, END)
        print(f"wrote the quantized section of {args.out}")


if __name__ == "__main__":
    main()
