"""Serving workloads that need more than batching: a shared prefix (automatic prefix caching) and long prompts
arriving while others decode (the per-step prefill budget); `torch2jax serve` against itself with the feature off,
on one artifact, side by side on loopback.

    python -m benchmarks.serve_workloads            # both, print, rewrite their sections of docs/benchmarks.md
    python -m benchmarks.serve_workloads --workload prefix --no-write --requests 16 --rounds 1 --prefix 256

Shared prefix: `--requests` streamed /v1/completions requests from `--concurrency` clients in a closed loop, every prompt a
common `--prefix`-token prefix (a system prompt or few-shot examples) and a suffix of 16-64 tokens of its own, 16-32
output tokens. Mixed: 6 chat clients (prompts of 16-64 tokens, 96-160 output tokens) and 2 document clients (prompts of
1024-1536 tokens, 16 output tokens), closed loops; the inter-token latency of every request. Greedy, `ignore_eos`,
seeded draws. The model is benchmarks/serve.py's (the 56M Llama-shaped config, float32, random weights, word-level
tokenizer), converted with a cache of 2048 slots. Each server gets the load once untimed (compilation; the caching server
also keeps the prefix's blocks then, as a server running for a while has), then `--rounds` timed rounds, taking turns.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import write_section
from benchmarks.serve import CPU_NOTE, ROOT, ROWS, VOCAB, Contender, Process, free_port, load, make_model, measure, table

CACHE = 2048
PREFIX_BEGIN, PREFIX_END = "<!-- serve-prefix:begin -->", "<!-- serve-prefix:end -->"
MIXED_BEGIN, MIXED_END = "<!-- serve-mixed:begin -->", "<!-- serve-mixed:end -->"
CACHED, UNCACHED = "torch2jax serve (prefix caching)", "torch2jax serve --no-prefix-caching"
DEFAULT_BUDGET = 256  # --max-prefill-tokens' default: --chunk


def budget_name(budget: int) -> str:
    return f"torch2jax serve --max-prefill-tokens {budget}" + (" (the default)" if budget == DEFAULT_BUDGET else "")
CHAT_CLIENTS, DOCUMENT_CLIENTS = 6, 2


def words(rng: np.random.Generator, count: int) -> str:
    return " ".join(f"w{t}" for t in rng.integers(3, VOCAB, count))


def prefix_workload(requests: int, prefix: int, seed: int) -> list[tuple[str, int]]:
    """(prompt text, max_tokens) per request: one shared prefix, then 16-64 words and 16-32 output tokens each."""
    rng = np.random.default_rng(seed)
    shared = words(rng, prefix)
    return [(shared + " " + words(rng, int(n)), int(m)) for n, m in zip(rng.integers(16, 65, requests),
                                                                        rng.integers(16, 33, requests))]


def mixed_workload(requests: int, seed: int) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(chat requests: 16-64 words, 96-160 output tokens; documents: 1024-1536 words, 16 output tokens), three chats for
    each document."""
    rng = np.random.default_rng(seed)
    documents = max(1, requests // 4)
    chats = [(words(rng, int(rng.integers(16, 65))), int(rng.integers(96, 161))) for _ in range(requests - documents)]
    return chats, [(words(rng, int(rng.integers(1024, 1537))), 16) for _ in range(documents)]


async def mixed_load(url: str, model: str, work: tuple[list, list], concurrency: int, extra: dict) -> dict:
    """The chat and document clients at once (`concurrency` is unused: the split is CHAT_CLIENTS + DOCUMENT_CLIENTS)."""
    start = time.perf_counter()
    chats, documents = await asyncio.gather(load(url, model, work[0], CHAT_CLIENTS, extra),
                                            load(url, model, work[1], DOCUMENT_CLIENTS, extra))
    return {**{key: chats[key] + documents[key] for key in ("ttft", "itl", "itl_spread", "tokens")},
            "wall": time.perf_counter() - start}


def serve(artifact: Path, root: Path, requests: int, pairs: list[tuple[str, list[str]]]) -> list[Contender]:
    contenders = []
    for name, flags in pairs:
        port = free_port()
        command = [sys.executable, "-c", "from torch2jax.cli.main import main; main()", "serve", str(artifact),
                   "--port", str(port), "--max-batch", str(ROWS), "--max-queue", str(requests), *flags]
        contenders.append(Contender(name, Process(command, port, root / f"{port}.log"), "llm", {"ignore_eos": True}))
    return contenders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["prefix", "mixed", "all"], default="all")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budgets", type=lambda text: [int(b) for b in text.split(",")], default=[DEFAULT_BUDGET, 2048, 64],
                        help="the mixed load's servers: one per --max-prefill-tokens value (comma-separated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-serve-workloads-"))
    sections = []
    try:
        _, artifact, convert_s = make_model(root, CACHE)
        if args.workload in ("prefix", "all"):
            contenders = serve(artifact, root, args.requests, [(CACHED, []), (UNCACHED, ["--no-prefix-caching"])])
            try:
                measure(contenders, prefix_workload(args.requests, args.prefix, args.seed), args.concurrency, args.rounds)
            finally:
                for c in contenders:
                    c.server.stop()
            sections.append((prefix_report(contenders, args, convert_s), PREFIX_BEGIN, PREFIX_END))
        if args.workload in ("mixed", "all"):
            contenders = serve(artifact, root, args.requests,
                               [(budget_name(b), ["--max-prefill-tokens", str(b)]) for b in args.budgets])
            try:
                measure(contenders, mixed_workload(args.requests, args.seed), args.concurrency, args.rounds, run=mixed_load)
            finally:
                for c in contenders:
                    c.server.stop()
            sections.append((mixed_report(contenders, args, convert_s), MIXED_BEGIN, MIXED_END))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for text, begin, end in sections:
        print(text)
        if not args.no_write:
            write_section(args.out, text, begin, end)
            print(f"wrote {begin} of {args.out}")


def prefix_report(contenders: list[Contender], args, convert_s: float) -> str:
    lines, footnotes = table(contenders, UNCACHED, [
        ("output tok/s", lambda r, b: f"{r['tok_s']:.1f}"),
        ("vs without", lambda r, b: f"{r['tok_s'] / b['tok_s']:.2f}x" if "tok_s" in b else "—"),
        ("TTFT p50 (ms)", lambda r, b: f"{r['ttft_p50']:.0f}"),
        ("TTFT p50 vs without", lambda r, b: f"{b['ttft_p50'] / r['ttft_p50']:.2f}x lower" if "ttft_p50" in b else "—"),
        ("TTFT p99 (ms)", lambda r, b: f"{r['ttft_p99']:.0f}"),
        ("tok/s per round", lambda r, b: ", ".join(map(str, r["rounds"])))])
    return f"""{PREFIX_BEGIN}
## Serving a shared prefix (automatic prefix caching)

{args.requests} streamed /v1/completions requests, {args.concurrency} clients in a closed loop on loopback; every prompt
is one {args.prefix}-token prefix and 16-64 tokens of its own, with 16-32 output tokens (seed {args.seed}), greedy,
`ignore_eos`. The model is the serving section's 56M Llama-shaped config (float32, random weights), converted with
`--max-cache-len {CACHE} --max-batch {ROWS}` ({convert_s:.0f} s); both servers serve that artifact with the default
chunk and prefill budget, one with prefix caching (the default), one with `--no-prefix-caching`. Each gets the load once
untimed (compilation, and the prefix's blocks cached), then {args.rounds} timed rounds, taking turns.
{CPU_NOTE.format(load=os.getloadavg()[1])}
Written by `make bench-serve` (`python -m benchmarks.serve_workloads`).

{chr(10).join(lines)}

{footnotes}
{PREFIX_END}"""


def mixed_report(contenders: list[Contender], args, convert_s: float) -> str:
    lines, footnotes = table(contenders, "", [
        ("output tok/s", lambda r, b: f"{r['tok_s']:.1f}"),
        ("ITL p50 (ms)", lambda r, b: f"{r['itl_spread_p50']:.1f}"),
        ("ITL p99 (ms)", lambda r, b: f"{r['itl_spread_p99']:.1f}"),
        ("ITL p99 / p50", lambda r, b: f"{r['itl_spread_p99'] / r['itl_spread_p50']:.1f}"),
        ("raw gap p99 (ms)", lambda r, b: f"{r['itl_p99']:.1f}"),
        ("TTFT p50 (ms)", lambda r, b: f"{r['ttft_p50']:.0f}"),
        ("TTFT p99 (ms)", lambda r, b: f"{r['ttft_p99']:.0f}"),
        ("tok/s per round", lambda r, b: ", ".join(map(str, r["rounds"])))])
    return f"""{MIXED_BEGIN}
## Serving long prompts among decoding requests (the prefill budget)

{CHAT_CLIENTS} chat clients (prompts of 16-64 tokens, 96-160 output tokens) and {DOCUMENT_CLIENTS} document clients
(prompts of 1024-1536 tokens, 16 output tokens) in closed loops on loopback, {args.requests} streamed /v1/completions
requests in all, three chats for each document (seed {args.seed}), greedy, `ignore_eos`; the inter-token latency (ITL) is
the wait per token between consecutive streamed tokens of one request, over all requests, where tokens that arrive
together (a decode block of up to 16, sent at once) share the gap before them (`benchmarks/serve.py` spread_gaps; the
raw gaps are near 0 inside a block); "raw gap p99" is the largest such wait unshared. The model and artifact are the shared
prefix section's. The servers differ in `--max-prefill-tokens`, the prompt tokens prefilled per step over a group's rows
({", ".join(map(str, args.budgets))}; each row's chunk is 256 tokens, halved until the group fits, 16 at least: 2048
is the behaviour before the budget existed, 256 the default). Each gets the load once untimed, then {args.rounds} timed
rounds, taking turns. {CPU_NOTE.format(load=os.getloadavg()[1])}
Written by `make bench-serve` (`python -m benchmarks.serve_workloads`).

{chr(10).join(lines)}

{footnotes}
{MIXED_END}"""


if __name__ == "__main__":
    main()
