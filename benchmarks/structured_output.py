"""What structured output (`response_format` with a JSON schema) costs per output token: the server's batch loop
(serve/scheduler.py over serve/engine.py, in process: no HTTP, which both sides would pay alike) running the same
requests with and without a grammar, side by side in one run.

    python -m benchmarks.structured_output              # print, rewrite its section of docs/benchmarks.md
    python -m benchmarks.structured_output --no-write --requests 8 --rounds 1

The model is the serving benchmarks' 56M Llama-shaped config (float32, random weights) with a byte-level BPE tokenizer
of `--vocab` tokens trained here on JSON-like text (the word-level tokenizer of the other serving benchmarks cannot
spell JSON), converted with `--max-cache-len 512 --max-batch 8`. Each round runs `--requests` requests (prompts of 32-64
tokens, greedy), all submitted at once into 8 rows: once under the schema (a reply ends when its JSON is complete, or at
`--max-tokens`), then plain, each request taking as many tokens as its structured reply did (the same work but for the
grammar). The time per output token is the round's wall time over its tokens; the grammar's own host time (masks and
advancing, llguidance) is measured beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import write_section
from benchmarks.serve import CPU_NOTE, ROOT, ROWS

CACHE = 512
BEGIN, END = "<!-- structured-output:begin -->", "<!-- structured-output:end -->"
SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 32},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "rating": {"enum": ["low", "medium", "high"]},
        "notes": {"type": "string", "maxLength": 48},
    },
    "required": ["title", "year", "tags", "rating", "notes"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA, "strict": True}}


def corpus(rng: np.random.Generator, documents: int) -> list[str]:
    """JSON records and prose over made-up words (so BPE has many merges to learn)."""
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vor", "ei", "qu", "zan", "pe", "dro", "li", "ma", "no", "ster"]
    words = ["".join(rng.choice(syllables, int(rng.integers(1, 5)))) for _ in range(4000)]

    def text(n: int) -> str:
        return " ".join(rng.choice(words, n))

    out = []
    for _ in range(documents):
        record = {"title": text(3), "year": int(rng.integers(1900, 2100)), "tags": [str(w) for w in rng.choice(words, 3)],
                  "rating": str(rng.choice(["low", "medium", "high"])), "notes": text(12)}
        out += [json.dumps(record), text(40)]
    return out


def make_model(root: Path, vocab: int) -> tuple[Path, float]:
    """The artifact (56M Llama, a trained byte-level BPE tokenizer of `vocab` tokens) and its conversion seconds."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    import torch2jax
    from benchmarks.generation import llama

    source = root / "hf"
    source.mkdir()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(corpus(np.random.default_rng(0), 20000), trainer)
    tokenizer.save(str(source / "tokenizer.json"))
    (source / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}))
    llama(source, vocab_size=tokenizer.get_vocab_size(), bos_token_id=1, eos_token_id=2, pad_token_id=0)
    start = time.perf_counter()
    g = torch2jax.convert_hf(f"hf:{source}", max_cache_len=CACHE, max_batch=ROWS)
    seconds = time.perf_counter() - start
    return torch2jax.save(g, root / "llm"), seconds


class Timed:
    """A grammar constraint whose host time (mask and advance) is added to `clock`."""

    def __init__(self, constraint, clock: list[float]):
        self.constraint, self.clock = constraint, clock

    def fill(self, row: np.ndarray) -> None:
        start = time.perf_counter()
        self.constraint.fill(row)
        self.clock[0] += time.perf_counter() - start

    def advance(self, token: int) -> bool:
        start = time.perf_counter()
        done = self.constraint.advance(token)
        self.clock[0] += time.perf_counter() - start
        return done


def run_round(scheduler, grammars, prompts: list[list[int]], max_tokens: list[int], structured: bool) -> dict:
    """Every request submitted at once, the loop stepped until all have ended: wall seconds, output tokens, grammar
    seconds, and the requests."""
    from torch2jax.serve.scheduler import Request

    clock = [0.0]
    requests = []
    for prompt, limit in zip(prompts, max_tokens):
        request = Request(prompt, limit, lambda event: None, end_tokens=None if structured else ())
        if structured:
            request.constraint = Timed(grammars.constraints(RESPONSE_FORMAT)[0], clock)
        requests.append(request)
    start = time.perf_counter()
    for request in requests:
        scheduler.submit(request)
    while scheduler._busy():
        scheduler.step()
    wall = time.perf_counter() - start
    tokens = sum(len(r.tokens) for r in requests)
    return {"wall": wall, "tokens": tokens, "grammar": clock[0], "requests": requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32000, help="the BPE tokenizer's vocabulary (and the model's)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch2jax
    from torch2jax.serve.engine import BatchEngine
    from torch2jax.serve.scheduler import Scheduler
    from torch2jax.serve.structured import Grammars

    root = Path(tempfile.mkdtemp(prefix="bench-structured-"))
    try:
        artifact, convert_s = make_model(root, args.vocab)
        g = torch2jax.load(artifact)
        engine = BatchEngine(g, ROWS)
        started = time.perf_counter()
        engine.compile_steps()
        compile_s = time.perf_counter() - started
        tokenizer = g.tokenizer
        grammars = Grammars(tokenizer, g.spec.vocab_size, g.spec.eos_token_ids)
        rng = np.random.default_rng(1)
        words = corpus(np.random.default_rng(2), args.requests)[1::2]
        prompts = [tokenizer.encode(f"Write a record about {text}").ids[: int(rng.integers(32, 65))] for text in words]
        scheduler = Scheduler(engine, max_queue=args.requests)
        results: dict[bool, list[dict]] = {False: [], True: []}
        for turn in range(args.rounds + 1):  # round 0 warms up (first uses outside the compiled steps)
            lengths = [args.max_tokens] * len(prompts)
            for structured in (True, False):  # plain requests then take as many tokens as the structured replies did
                result = run_round(scheduler, grammars, prompts, lengths, structured)
                lengths = [max(1, len(r.tokens)) for r in result["requests"]]
                print(f"{'structured' if structured else 'plain'} {'round ' + str(turn) if turn else 'warm-up'}: "
                      f"{1000 * result['wall'] / result['tokens']:.2f} ms/token over {result['tokens']} tokens", flush=True)
                if turn:
                    results[structured].append(result)
        valid = sum(parses(r.tokens, tokenizer) for r in results[True][-1]["requests"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    text = report(results, args, convert_s, compile_s, valid)
    print(text)
    if not args.no_write:
        write_section(args.out, text, BEGIN, END)
        print(f"wrote {BEGIN} of {args.out}")


def parses(tokens: list[int], tokenizer) -> bool:
    try:
        json.loads(tokenizer.decode([t for t in tokens if t != 2]))
        return True
    except ValueError:
        return False


def report(results: dict[bool, list[dict]], args, convert_s: float, compile_s: float, valid: int) -> str:
    def per_token(runs: list[dict], key: str = "wall") -> float:
        return statistics.median(1000 * r[key] / r["tokens"] for r in runs)

    plain, structured = per_token(results[False]), per_token(results[True])
    grammar = per_token(results[True], "grammar")
    tokens = statistics.median(r["tokens"] for r in results[True])
    def rounds(runs: list[dict]) -> str:
        return ", ".join(f"{1000 * r['wall'] / r['tokens']:.2f}" for r in runs)

    rows = [f"| plain (as many tokens as the structured replies) | {plain:.2f} | — | — | {rounds(results[False])} |",
            f"| `response_format` JSON schema | {structured:.2f} | {structured / plain - 1:+.0%} | {grammar:.3f} | "
            f"{rounds(results[True])} |"]
    return f"""{BEGIN}
## Structured output: the cost per output token

The server's batch loop in process (no HTTP, which both sides pay alike): {args.requests} requests at once into {ROWS}
rows, prompts of 32-64 tokens, greedy: first under a JSON schema (5 properties: bounded strings, an integer range, an
array of strings, an enum), each reply ending when its JSON is complete or at {args.max_tokens} tokens (median
{tokens:.0f} tokens a round; {valid} of {args.requests} replies of the last round parse as JSON), then the same requests
plain, each taking as many tokens as its structured reply (`ignore_eos`): the same work but for the grammar.
The model is the serving benchmarks' 56M Llama-shaped config (float32, random weights) with a byte-level BPE tokenizer of
{args.vocab} tokens trained on JSON-like text, converted with `--max-cache-len {CACHE} --max-batch {ROWS}`
({convert_s:.0f} s; the steps compiled in {compile_s:.0f} s before timing). The time per output token is a round's wall
time over its tokens, median of {args.rounds} rounds after a warm-up, the two kinds taking turns; "grammar" is the host
time llguidance takes (masks and advancing) per output token, inside the structured time.
{CPU_NOTE.format(load=os.getloadavg()[1])}
Written by `python -m benchmarks.structured_output`.

| requests | ms per output token | vs plain | grammar ms per token | per round |
|---|---|---|---|---|
{chr(10).join(rows)}
{END}"""


if __name__ == "__main__":
    main()
