"""Serving an encoder-decoder: `torch2jax serve` (continuous batching: each row decodes at its own slot, requests join
at any step) against static batches of the same artifact, on loopback.

    python -m benchmarks.serve_seq2seq            # measure, print, rewrite its section of docs/benchmarks.md
    python -m benchmarks.serve_seq2seq --no-write --requests 16 --rounds 1

The model is T5-shaped (d_model 512, 6 encoder and 6 decoder layers, 8 heads, d_ff 2048, 32000 ids: t5-small's sizes,
random weights, float32) with benchmarks/serve.py's word-level tokenizer. The load: `--concurrency` clients in a closed
loop sending `--requests` streamed /v1/completions requests, sources of 16-128 words, replies of 16 tokens (three in
four: a label, a short answer) or 128 (a summary), every request run to its max_tokens (`ignore_eos`), greedy. Where
replies differ this much, a static batch holds its short requests until its long one ends; continuous batching frees
their rows at once. Each server gets the load once untimed (compilation), then `--rounds` timed rounds, taking turns.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import write_section
from benchmarks.serve import CPU_NOTE, ROWS, VOCAB, Contender, Process, free_port, load_options, measure, table, write_word_tokenizer

BEGIN, END = "<!-- serve-seq2seq:begin -->", "<!-- serve-seq2seq:end -->"
OURS, STATIC = "torch2jax serve (continuous batching)", "static batches (same artifact)"
SOURCE, CACHE = 128, 128


def workload(requests: int, seed: int) -> list[tuple[str, int]]:
    """(source text, max_tokens) per request: 16-128 words, then 16 tokens or (one request in four) 128."""
    rng = np.random.default_rng(seed)
    return [(" ".join(f"w{t}" for t in rng.integers(3, VOCAB, int(n))), 128 if long else 16)
            for n, long in zip(rng.integers(16, SOURCE + 1, requests), rng.random(requests) < 0.25)]


def make_t5(root: Path) -> tuple[Path, float]:
    """The T5-shaped model's artifact (sources up to SOURCE tokens, replies up to CACHE) and its conversion seconds."""
    import torch
    import transformers

    import torch2jax

    source = root / "hf"
    config = transformers.T5Config(vocab_size=VOCAB, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6,
                                   num_heads=8, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0)
    torch.manual_seed(0)
    transformers.T5ForConditionalGeneration(config).eval().save_pretrained(source)
    write_word_tokenizer(source, SOURCE)
    start = time.perf_counter()
    g = torch2jax.convert_hf(f"hf:{source}", task="text2text-generation", max_source_len=SOURCE, max_cache_len=CACHE,
                             max_batch=ROWS)
    seconds = time.perf_counter() - start
    return torch2jax.save(g, root / "t5"), seconds


def main() -> None:
    args = load_options(__doc__).parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-serve-seq2seq-"))
    contenders: list[Contender] = []
    try:
        artifact, convert_s = make_t5(root)
        port = free_port()
        ours = [sys.executable, "-c", "from torch2jax.cli.main import main; main()", "serve", str(artifact), "--port",
                str(port), "--max-batch", str(ROWS), "--max-queue", str(args.requests)]
        contenders.append(Contender(OURS, Process(ours, port, root / "ours.log"), "t5", {"ignore_eos": True}))
        port = free_port()
        naive = [sys.executable, "-m", "benchmarks.serve", "--naive-server", str(artifact), str(port)]
        contenders.append(Contender(STATIC, Process(naive, port, root / "naive.log", "/v1/models"), "t5",
                                    {"ignore_eos": True}))
        measure(contenders, workload(args.requests, args.seed), args.concurrency, args.rounds)
    finally:
        for c in contenders:
            c.server.stop()
    try:
        text = report(contenders, args, convert_s, CPU_NOTE.format(load=os.getloadavg()[1]))
        print(text)
        if not args.no_write:
            write_section(args.out, text, BEGIN, END)
            print(f"wrote the serve-seq2seq section of {args.out}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def report(contenders: list[Contender], args, convert_s: float, machine: str) -> str:
    lines, footnotes = table(contenders, STATIC, [
        ("output tok/s", lambda r, b: f"{r['tok_s']:.1f}"),
        ("vs static", lambda r, b: f"{r['tok_s'] / b['tok_s']:.2f}x" if "tok_s" in b else "—"),
        ("TTFT p50 (ms)", lambda r, b: f"{r['ttft_p50']:.0f}"), ("TTFT p99 (ms)", lambda r, b: f"{r['ttft_p99']:.0f}"),
        ("ITL p50 (ms)", lambda r, b: f"{r['itl_p50']:.1f}"), ("ITL p99 (ms)", lambda r, b: f"{r['itl_p99']:.1f}"),
        ("tok/s per round", lambda r, b: ", ".join(map(str, r["rounds"])))])
    return f"""{BEGIN}
## Serving an encoder-decoder (`torch2jax serve`, text2text-generation)

{args.requests} streamed /v1/completions requests, {args.concurrency} clients in a closed loop on loopback: sources of
16-{SOURCE} words, replies of 16 tokens (three in four) or 128 (seed {args.seed}), greedy, each run to its max_tokens. The
model is T5-shaped at t5-small's sizes (d_model 512, 6 + 6 layers, 32000 ids; float32, random weights), converted with
`--max-source-len {SOURCE} --max-cache-len {CACHE} --max-batch {ROWS}` ({convert_s:.0f} s). Both servers run at once; each
gets the load once untimed (compilation), then {args.rounds} timed rounds, taking turns. The static baseline is the same
artifact behind the same HTTP layer, serving up to {ROWS} queued requests per `Seq2SeqGenerator.generate(stream=True)`
call, which runs until its longest request ends. {machine}
Written by `make bench-serve` (`python -m benchmarks.serve_seq2seq`).

{chr(10).join(lines)}

{footnotes}
{END}"""


if __name__ == "__main__":
    main()
