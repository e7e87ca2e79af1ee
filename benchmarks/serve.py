"""Serving under load: `torch2jax serve` (continuous batching) against static batches of the same artifact and
against `transformers serve --continuous-batching`, on loopback.

    python -m benchmarks.serve                 # measure, print, rewrite its section of docs/benchmarks.md
    python -m benchmarks.serve --no-write --requests 16 --rounds 1

The model is benchmarks/generation.py's Llama-shaped 56M-parameter config (random weights, float32) with a
word-level tokenizer over its 32000 ids. The load is a closed loop of `--concurrency` clients sending
`--requests` streamed /v1/completions requests whose prompt (16-256 tokens) and output (16-128 tokens)
lengths come from a seeded uniform draw; greedy, every request runs to its max_tokens (ignore_eos; the
random model's end token is one id in 32000 anyway). The servers run side by side; each gets the whole
load once untimed (compilation, caches), then `--rounds` timed rounds, taking turns. Output tok/s is every
completion token over the timed wall time; TTFT is submission to the first streamed token; ITL the gaps
between a request's tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from benchmarks.report import write_section

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- serve:begin -->", "<!-- serve:end -->"
VOCAB, CACHE, ROWS = 32000, 512, 8
START_S = 600
OURS, STATIC = "torch2jax serve (continuous batching)", "same artifact, static batches of 8 (generate)"
TRANSFORMERS = "transformers serve --continuous-batching"
CPU_NOTE = """2 CPU cores shared with other work (5-minute load average {load:.1f} at the end), so
absolute numbers are low and noisy; the ratios compare servers measured in turn."""


# -- the load -------------------------------------------------------------------------------------
def workload(requests: int, seed: int) -> list[tuple[str, int]]:
    """(prompt text, max_tokens) per request: prompts of 16-256 words w3..w31999, outputs of 16-128 tokens."""
    rng = np.random.default_rng(seed)
    return [(" ".join(f"w{t}" for t in rng.integers(3, VOCAB, int(n))), int(m))
            for n, m in zip(rng.integers(16, 257, requests), rng.integers(16, 129, requests))]


async def one(client, url: str, model: str, prompt: str, max_tokens: int, stats: dict, extra: dict) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}
    start = time.perf_counter()
    stamps = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as answer:
        if answer.status_code != 200:
            raise RuntimeError(f"HTTP {answer.status_code}: {(await answer.aread())[:300]!r}")
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            text = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
            if text:  # one chunk per token here (word-level tokens, no stop strings)
                stamps.append(time.perf_counter())
    stats["ttft"].append(stamps[0] - start)
    stats["itl"] += [b - a for a, b in zip(stamps, stamps[1:])]
    stats["itl_spread"] += spread_gaps(stamps)
    stats["tokens"] += len(stamps)


def spread_gaps(stamps: list[float], together: float = 1e-3) -> list[float]:
    """Per-token gaps where tokens arriving within `together` s of each other (a decode block's, sent at once) form one
    burst whose gap from the previous burst is shared by its tokens: what a reader waits per token, which raw gaps
    (near 0 inside a burst, a whole block between bursts) do not show."""
    bursts = []  # (arrival of the burst's first token, tokens in it)
    for stamp in stamps:
        if bursts and stamp - bursts[-1][2] < together:
            bursts[-1][1] += 1
            bursts[-1][2] = stamp
        else:
            bursts.append([stamp, 1, stamp])
    return [(b[0] - a[0]) / b[1] for a, b in zip(bursts, bursts[1:]) for _ in range(b[1])]


async def load(url: str, model: str, work: list[tuple[str, int]], concurrency: int, extra: dict) -> dict:
    """Run the load with `concurrency` clients, each taking the next request when its last one ended."""
    import httpx

    queue, stats = deque(work), {"ttft": [], "itl": [], "itl_spread": [], "tokens": 0}

    async def client_loop(client) -> None:
        while queue:
            prompt, max_tokens = queue.popleft()
            await one(client, url, model, prompt, max_tokens, stats, extra)

    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    stats["wall"] = time.perf_counter() - start
    return stats


def summary(rounds: list[dict]) -> dict:
    """Throughput over the timed rounds together; latency percentiles over every request and gap of them."""
    ttft = [t for r in rounds for t in r["ttft"]]
    itl = [t for r in rounds for t in r["itl"]]
    spread = [t for r in rounds for t in r["itl_spread"]]
    tokens, wall = sum(r["tokens"] for r in rounds), sum(r["wall"] for r in rounds)

    def pct(values: list[float], q: float) -> float:
        return 1e3 * float(np.percentile(values, q))

    return {"tok_s": tokens / wall, "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "itl_p50": pct(itl, 50),
            "itl_p99": pct(itl, 99),
            "itl_spread_p50": pct(spread, 50), "itl_spread_p99": pct(spread, 99), "wall": wall, "tokens": tokens,
            "rounds": [round(r["tokens"] / r["wall"], 1) for r in rounds]}


# -- the servers ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A server subprocess on a free loopback port; ready once /health answers (or it exits: then `error`)."""

    def __init__(self, command: list[str], port: int, log: Path, health: str = "/health"):
        import httpx

        self.url, self.log = f"http://127.0.0.1:{port}", log
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the repository, then the caller's
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                        env=dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
        self.error = None
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.error = f"exited with status {self.process.returncode}: {log.read_text()[-600:]}"
                return
            try:
                if httpx.get(self.url + health, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.5)
        self.error = f"no answer on {health} within {START_S}s"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()


class StaticBatcher:
    """The naive server's loop, behind the same HTTP layer as ours: up to 8 queued requests at a time go through one
    `generate(stream=True)` call (a Generator's or a Seq2SeqGenerator's), which runs until its longest request is done;
    nothing joins meanwhile."""

    def __init__(self, g, rows: int, max_queue: int = 64):
        self.g, self.rows, self.waiting, self.max_queue = g, rows, deque(), max_queue
        # what the HTTP layer reads of a scheduler's engine (the cache length, rows for `n`, no images)
        self.engine = SimpleNamespace(max_len=g.spec.max_cache_len, rows=rows, g=g, vision=None)
        self._cond, self._stop = threading.Condition(), False
        self.batches = 0

    def submit(self, request) -> None:
        """A request, or the list of a client request's choices (the HTTP layer's call, as to the scheduler)."""
        with self._cond:
            self.waiting.extend(request if isinstance(request, list) else [request])
            self._cond.notify()

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def stats(self) -> dict:
        return {"batches": self.batches, "queue_depth": len(self.waiting)}

    def _run(self) -> None:
        from torch2jax.generate.generator import left_pad
        from torch2jax.generate.seq2seq import Seq2SeqGenerator, right_pad
        from torch2jax.serve.scheduler import Event

        pad = right_pad if isinstance(self.g, Seq2SeqGenerator) else left_pad  # an encoder's sources, a decoder's prompts

        while True:
            with self._cond:
                while not self.waiting and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                batch = [self.waiting.popleft() for _ in range(min(self.rows, len(self.waiting)))]
            self.batches += 1
            ids, mask = pad([r.prompt for r in batch], self.g.spec.pad_token_id)
            steps = self.g.generate(ids, attention_mask=mask, max_new_tokens=max(r.max_tokens for r in batch), eos_token_id=[],
                                    stream=True)
            for tokens in steps:
                for r, request in enumerate(batch):
                    if len(request.tokens) < request.max_tokens:
                        request.tokens.append(int(tokens[r]))
                        text, _ = request.text.push(int(tokens[r]))
                        ended = len(request.tokens) == request.max_tokens
                        request.on_event(Event([int(tokens[r])], text, "length" if ended else None, len(request.prompt),
                                               len(request.tokens)))


def naive_server(artifact: str, port: int) -> None:
    """Serve `artifact` with StaticBatcher through torch2jax's own HTTP layer (run as a subprocess)."""
    import uvicorn

    import torch2jax
    from torch2jax.serve.api import Service, create_app
    from torch2jax.serve.metrics import Metrics

    g = torch2jax.load(artifact)
    service = Service(Path(artifact).name, StaticBatcher(g, ROWS), g.tokenizer, None, Metrics(ROWS))
    uvicorn.run(create_app(service), host="127.0.0.1", port=port, log_level="warning")


def workload_bound(source: Path, work: list[tuple[str, int]], rows: int = ROWS) -> dict:
    """The fastest any server could run `work` on this machine, a roofline: every prompt token's matrix products at the
    GEMM rate of a 256-token chunk (the LM head once per prompt), every output token's at the rate of a `rows`-row
    decode step, and each decode step (`rows` tokens at best) reading every weight once at the measured bandwidth;
    attention, sampling and the host counted as free. Output tokens per second at that bound, and its parts."""
    from benchmarks.generation import bandwidth_bytes_per_s, matmul_flops_per_s
    from torch2jax.capture.checkpoint_files import read_header

    config = json.loads((source / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    count = {name: int(np.prod(entry.shape)) for weights in source.glob("*.safetensors")
             for name, entry in read_header(weights).items()}
    head = count.get("lm_head.weight", count["model.embed_tokens.weight"])
    body = sum(n for k, n in count.items() if k not in ("lm_head.weight", "model.embed_tokens.weight"))
    prompt_tokens, output_tokens = sum(len(p.split()) for p, _ in work), sum(m for _, m in work)
    chunk_rate, step_rate = matmul_flops_per_s(256, hidden, inner), matmul_flops_per_s(rows, hidden, inner)
    bandwidth = bandwidth_bytes_per_s()
    prefill_s = (2 * body * prompt_tokens + 2 * head * len(work)) / chunk_rate
    decode_s = max(2 * (body + head) * output_tokens / step_rate, output_tokens / rows * 4 * (body + head) / bandwidth)
    return {"tok_s": output_tokens / (prefill_s + decode_s), "prefill_s": prefill_s, "decode_s": decode_s,
            "chunk_gflops": chunk_rate / 1e9, "step_gflops": step_rate / 1e9, "bandwidth_gbs": bandwidth / 1e9,
            "prompt_tokens": prompt_tokens, "output_tokens": output_tokens}


def make_model(root: Path, cache: int = CACHE) -> tuple[Path, Path, float]:
    """The HF directory (weights, word-level tokenizer) and its artifact converted for `cache` slots; conversion
    seconds."""
    import torch2jax
    from benchmarks.generation import llama

    source = root / "hf"
    llama(source, max(cache, 1024))
    write_word_tokenizer(source, cache)
    start = time.perf_counter()
    g = torch2jax.convert_hf(f"hf:{source}", max_cache_len=cache, max_batch=ROWS)
    seconds = time.perf_counter() - start
    return source, torch2jax.save(g, root / "llm"), seconds


def write_word_tokenizer(source: Path, cache: int) -> None:
    """A word-level tokenizer over the VOCAB ids (w3 .. w31999; <unk> 0, <s> 1, </s> 2) into the model's directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(str(source / "tokenizer.json"))
    (source / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": cache, "chat_template": "{% for m in messages %}{{ m['content'] }} {% endfor %}"}))


@dataclass
class Contender:
    name: str
    server: Process
    model: str
    extra: dict  # request fields only this server takes
    rounds: list = field(default_factory=list)
    error: str | None = None


def measure(contenders: list[Contender], work, concurrency: int, rounds: int, run=None) -> None:
    """Warm every server with the whole load, then time `rounds` rounds, the servers taking turns in each (so a
    change in the machine's other load hits them alike). `run`: the load's coroutine (default: `load`)."""
    for turn in range(rounds + 1):
        for c in contenders:
            if c.error is None and c.server.error:
                c.error = c.server.error
            if c.error:
                continue
            try:
                stats = asyncio.run((run or load)(c.server.url, c.model, work, concurrency, c.extra))
            except Exception as err:  # a server that fails under load is reported, not fatal
                c.error = f"{type(err).__name__}: {err}"[:300]
                continue
            if turn:
                c.rounds.append(stats)
            print(f"{c.name} {'round ' + str(turn) if turn else 'warm-up'}: {stats['tokens'] / stats['wall']:.1f} tok/s", flush=True)


def load_options(doc: str) -> argparse.ArgumentParser:
    """The options every serving benchmark takes: the load (requests, clients, rounds, seed) and where it writes."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    return parser


def main() -> None:
    parser = load_options(__doc__)
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--naive-server", nargs=2, metavar=("ARTIFACT", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive_server:
        naive_server(args.naive_server[0], int(args.naive_server[1]))
        return
    root = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    try:
        source, artifact, convert_s = make_model(root)
        contenders = serve_and_measure(artifact, source, root, args, device="cpu")
        bound = workload_bound(source, workload(args.requests, args.seed))  # the servers have stopped: a quiet machine
        text = report(contenders, args, convert_s, machine=CPU_NOTE.format(load=os.getloadavg()[1]), bound=bound)
        print(text)
        if not args.no_write:
            write_section(args.out, text, BEGIN, END)
            print(f"wrote the serve section of {args.out}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def serve_and_measure(artifact: Path, source: Path, root: Path, args, device: str) -> list[Contender]:
    """Start the three servers on `artifact` (ours, the static baseline) and `source` (transformers serve on `device`),
    run the load on each in turn, stop them; their logs go to `root`."""
    work = workload(args.requests, args.seed)
    contenders: list[Contender] = []
    try:
        port = free_port()
        ours = [sys.executable, "-c", "from torch2jax.cli.main import main; main()", "serve", str(artifact), "--port", str(port),
                "--max-batch", str(ROWS), "--max-queue", str(args.requests)]
        contenders.append(Contender(OURS, Process(ours, port, root / "ours.log"), "llm", {"ignore_eos": True}))
        port = free_port()
        naive = [sys.executable, "-m", "benchmarks.serve", "--naive-server", str(artifact), str(port)]
        contenders.append(Contender(STATIC, Process(naive, port, root / "naive.log", "/v1/models"), "llm", {"ignore_eos": True}))
        if not args.skip_transformers:  # it takes no ignore_eos; the random model's end token is 1 id in 32000
            port = free_port()
            hf = [shutil.which("transformers") or str(Path(sys.executable).parent / "transformers"), "serve", str(source),
                  "--continuous-batching", "--device", device, "--dtype", "float32", "--port", str(port), "--host", "127.0.0.1"]
            contenders.append(Contender(TRANSFORMERS, Process(hf, port, root / "transformers.log"), str(source), {}))
        measure(contenders, work, args.concurrency, args.rounds)
    finally:
        for c in contenders:
            c.server.stop()
    return contenders


def table(contenders: list[Contender], base_name: str, columns: list[tuple[str, callable]]) -> tuple[list[str], str]:
    """Markdown rows of each contender's summary (`columns`: header, cell of (summary, the baseline's summary)), and the
    footnotes of those that did not run."""
    results = {c.name: {"error": c.error} if c.error or not c.rounds else summary(c.rounds) for c in contenders}
    base = results.get(base_name, {})
    lines = ["| server | " + " | ".join(h for h, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    notes = []
    for name, r in results.items():
        if "error" in r:
            notes.append(f"{name} did not run: {r['error']}")
            lines.append(f"| {name} | did not run [{len(notes)}] |" + " |" * (len(columns) - 1))
            continue
        lines.append(f"| {name} | " + " | ".join(cell(r, base) for _, cell in columns) + " |")
    return lines, "\n".join(f"[{i}] {n}".replace("\n", " ") for i, n in enumerate(notes, 1))


def report(contenders: list[Contender], args, convert_s: float, machine: str, bound: dict | None = None) -> str:
    lines, footnotes = table(contenders, STATIC, [
        ("output tok/s", lambda r, b: f"{r['tok_s']:.1f}"),
        ("vs static", lambda r, b: f"{r['tok_s'] / b['tok_s']:.2f}x" if "tok_s" in b else "—"),
        ("of the bound", lambda r, b: f"{r['tok_s'] / bound['tok_s']:.0%}" if bound else "—"),
        ("TTFT p50 (ms)", lambda r, b: f"{r['ttft_p50']:.0f}"), ("TTFT p99 (ms)", lambda r, b: f"{r['ttft_p99']:.0f}"),
        ("ITL p50 (ms)", lambda r, b: f"{r['itl_p50']:.1f}"), ("ITL p99 (ms)", lambda r, b: f"{r['itl_p99']:.1f}"),
        ("tok/s per round", lambda r, b: ", ".join(map(str, r["rounds"])))])
    return f"""{BEGIN}
## Serving (`torch2jax serve`)

{args.requests} streamed /v1/completions requests, {args.concurrency} clients in a closed loop on loopback, prompts of
16-256 tokens and outputs of 16-128 tokens (seed {args.seed}), greedy. The model is the Llama-shaped
56M-parameter config of the text-generation section (float32, random weights, a word-level tokenizer over its
32000 ids), converted with `--max-cache-len {CACHE} --max-batch {ROWS}` ({convert_s:.0f} s). All servers run at
once; each gets the load once untimed (compilation), then {args.rounds} timed rounds, the servers taking turns.
Ours and the static baseline run every request to its max_tokens (`ignore_eos`); transformers serve does not
take that field (its requests may end at the end token, one id in 32000). TTFT is from sending a request to its
first streamed token, ITL the gaps between a request's tokens. The static baseline is the same artifact behind
the same HTTP layer, serving up to 8 queued requests per `Generator.generate(stream=True)` call, which runs until
its longest request ends. {machine}
{bound_text(bound, contenders) if bound else ""}
Written by `make bench-serve` (`python -m benchmarks.serve`).

{chr(10).join(lines)}

{footnotes}
{END}"""


def bound_text(bound: dict, contenders: list[Contender]) -> str:
    """What the workload's roofline (workload_bound) is made of, and where 3x transformers serve would sit against it."""
    text = (f"The workload's bound is {bound['tok_s']:.0f} output tok/s on this machine: {bound['prompt_tokens']} prompt "
            f"tokens at {bound['chunk_gflops']:.0f} GFLOP/s (float32 GEMM at a 256-token chunk's shape) take "
            f"{bound['prefill_s']:.2f} s, {bound['output_tokens']} output tokens in steps of {ROWS} rows "
            f"{bound['decode_s']:.2f} s (each step's products at {bound['step_gflops']:.0f} GFLOP/s or one read of the weights "
            f"at {bound['bandwidth_gbs']:.1f} GB/s, whichever is slower); attention, sampling and the host count as free.")
    rates = {c.name: summary(c.rounds)["tok_s"] for c in contenders if c.rounds and not c.error}
    if TRANSFORMERS in rates:
        triple = 3 * rates[TRANSFORMERS]
        text += (f" Three times transformers serve's throughput would be {triple:.0f} tok/s, "
                 f"{triple / bound['tok_s']:.0%} of that bound.")
    return text


if __name__ == "__main__":
    main()
