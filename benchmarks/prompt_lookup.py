"""Prompt-lookup decoding against plain greedy decoding, batch 1, on an input-copying workload.

    python -m benchmarks.prompt_lookup            # train (or reuse) the copying model, measure, rewrite the section
    python -m benchmarks.prompt_lookup --no-write # print only

Random weights do not copy their input, so the model is trained here, once: a 2-layer Llama config taught in torch on
the CPU to answer "48 random tokens, a separator" with the same tokens, ~5% of them changed in its training replies
(an edit of the prompt, as "edit this code" replies are); training stops early once it copies. It is saved as a transformers directory
under the cache path (TORCH2JAX_BENCH_CACHE, default ~/.cache/torch2jax-bench) and converted with convert_hf. Then, on
held-out prompts of the same task, the greedy generate call with and without prompt_lookup_num_tokens: new tokens per
second (each call's wall time, prefill included, median over rounds after a warm-up), the drafts' acceptance, and a
check that both give the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

VOCAB, PAD, BOS, EOS, SEP = 256, 0, 1, 2, 3
PROMPT_LEN, SEQ, HIDDEN, BATCH = 48, 100, 128, 16
STOP_LOSS = 0.6  # the edits alone cost ~0.3 (5% of tokens at ln 252 each)
BEGIN, END = "<!-- prompt-lookup:begin -->", "<!-- prompt-lookup:end -->"


def example(rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """(prompt: random tokens and the separator, reply: the same tokens with ~5% changed, then EOS)."""
    tokens = rng.integers(4, VOCAB, PROMPT_LEN).tolist()
    reply = [int(rng.integers(4, VOCAB)) if rng.random() < 0.05 else t for t in tokens]
    return [BOS, *tokens, SEP], reply + [EOS]


def train(out: Path, steps: int, seed: int = 0) -> Path:
    """Train the copying model in torch and save_pretrained it to `out` (skipped when `out` already holds it)."""
    if (out / "config.json").exists():
        return out
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=False)
    lm = transformers.LlamaForCausalLM(config)
    opt = torch.optim.AdamW(lm.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps, pct_start=0.05)
    rng = np.random.default_rng(seed)
    start, recent = time.perf_counter(), []
    for step in range(steps):
        ids = np.full((BATCH, SEQ), PAD, np.int64)
        labels = np.full((BATCH, SEQ), -100, np.int64)
        for r in range(BATCH):
            prompt, reply = example(rng)
            row = (prompt + reply)[:SEQ]
            ids[r, :len(row)] = row
            labels[r, len(prompt):len(row)] = row[len(prompt):]  # the loss on the reply alone
        loss = lm(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(labels)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        schedule.step()
        opt.zero_grad()
        recent.append(loss.item())
        if step % 25 == 0 or step == steps - 1:
            print(f"  step {step}: loss {loss.item():.3f} ({time.perf_counter() - start:.0f} s)", flush=True)
        if len(recent) >= 20 and statistics.mean(recent[-20:]) < STOP_LOSS:  # copies but for the unforeseeable edits
            print(f"  step {step}: loss {statistics.mean(recent[-20:]):.3f} over the last 20 steps, stopping", flush=True)
            break
    tmp = out.with_name(out.name + ".tmp")
    lm.eval().save_pretrained(tmp)
    record = {"steps": step + 1, "batch": BATCH, "seconds": round(time.perf_counter() - start), "loss": loss.item()}
    (tmp / "training.json").write_text(json.dumps(record))
    tmp.rename(out)
    return out


def timed(g: Any, ids: np.ndarray, **settings: Any) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    result = g.generate(ids, **settings)
    return time.perf_counter() - start, result


def measure(g: Any, prompts: list[list[int]], new: int, rounds: int, num_tokens: int, ngram: int) -> dict[str, Any]:
    """Per prompt and round: the prefill alone (max_new_tokens=1), plain greedy, prompt lookup. Tokens/s end to end
    (new tokens over the call's time) and of the decode alone (the tokens after the first over the time after the
    prefill's), the drafts' acceptance, and whether the tokens are identical."""
    lookup = dict(prompt_lookup_num_tokens=num_tokens, max_matching_ngram_size=ngram)
    rows, proposed, accepted, steps, same = [], 0, 0, 0, True
    for p in prompts:  # warm-up: every compiled step both loops use for these lengths
        ids = np.asarray([p])
        for settings in ({"max_new_tokens": 1}, {"max_new_tokens": new}, {"max_new_tokens": new, **lookup}):
            g.generate(ids, **settings)
    calls, firsts = [], {i: [] for i in range(len(prompts))}
    for _ in range(rounds):
        for i, p in enumerate(prompts):
            ids = np.asarray([p])
            t_first, _ = timed(g, ids, max_new_tokens=1)
            t_plain, want = timed(g, ids, max_new_tokens=new)
            t_lookup, got = timed(g, ids, max_new_tokens=new, **lookup)
            same &= want.shape == got.shape and bool((want == got).all())
            stats = g.prompt_lookup_stats
            proposed, accepted, steps = proposed + stats.proposed, accepted + stats.accepted, steps + stats.steps
            firsts[i].append(t_first)
            calls.append((i, want.shape[1] - ids.shape[1], t_plain, t_lookup))
    first = {i: statistics.median(t) for i, t in firsts.items()}  # the prompt's prefill: its median over the rounds
    for i, count, t_plain, t_lookup in calls:
        rows.append({"count": count, "plain": count / t_plain, "lookup": count / t_lookup,
                     "plain_decode": (count - 1) / max(t_plain - first[i], 1e-6),
                     "lookup_decode": (count - 1) / max(t_lookup - first[i], 1e-6)})

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    ratios = [r["lookup_decode"] / r["plain_decode"] for r in rows]
    return {"plain": median("plain"), "lookup": median("lookup"), "plain_decode": median("plain_decode"),
            "lookup_decode": median("lookup_decode"), "speedup": statistics.median(r["lookup"] / r["plain"] for r in rows),
            "decode_speedup": statistics.median(ratios), "decode_range": (min(ratios), max(ratios)),
            "acceptance": accepted / max(proposed, 1), "tokens_per_step": (sum(r["count"] for r in rows) - len(rows)) / max(steps, 1),
            "identical": same, "calls": len(rows), "new_tokens": statistics.mean(r["count"] for r in rows)}


def report(results: list[dict[str, Any]], args: argparse.Namespace, train_s: str) -> str:
    import jax

    rows = "\n".join(
        f"| {r['k']} | {r['n']} | {r['plain_decode']:.0f} | {r['lookup_decode']:.0f} | **{r['decode_speedup']:.2f}x** "
        f"({r['decode_range'][0]:.2f}-{r['decode_range'][1]:.2f}) | {r['plain']:.0f} / {r['lookup']:.0f} ({r['speedup']:.2f}x) | "
        f"{r['acceptance']:.0%} | {r['tokens_per_step']:.1f} | {'yes' if r['identical'] else '**no**'} |" for r in results)
    best = max(r["decode_speedup"] for r in results)
    return f"""{BEGIN}
## Prompt lookup (n-gram drafts, `prompt_lookup_num_tokens`)

`python -m benchmarks.prompt_lookup` (`make bench-prompt-lookup`): batch-1 greedy `generate` with and without
prompt lookup, side by side in one run, on {jax.devices()[0].platform.upper()} ({os.cpu_count()} cores, shared with other work). The
model is a 2-layer Llama (hidden {HIDDEN}, vocab {VOCAB}) trained in torch here ({train_s}) to copy: a prompt of
{PROMPT_LEN} random tokens and a separator, answered with the same tokens, ~5% of them changed in the training replies (an
"edit this code" reply; greedy decoding then copies); k: prompt_lookup_num_tokens, n: max_matching_ngram_size.
{results[0]['calls'] // args.rounds} held-out prompts, up to {args.new} new tokens each (mean
{results[0]['new_tokens']:.0f}: the model ends its reply), {args.rounds} timed rounds after a warm-up. Decode tok/s: the
tokens after the first over the call's time less its prefill's (median of max_new_tokens=1 calls of the same prompt), median over
calls; the speedup is the median of per-call ratios (range in brackets). End to end: all new tokens over the whole
call (plain / lookup). Acceptance: accepted draft tokens per proposed one; tokens / step: decode tokens per verify step (1 for plain
decoding).

| k | n | plain decode tok/s | lookup decode tok/s | decode speedup | end to end tok/s | acceptance | tokens/step | identical |
|---:|---:|---:|---:|---:|---:|---:|---:|---|
{rows}

Target: >= 1.5x batch-1 decode with identical greedy tokens: {'met' if best >= 1.5 else 'not met'} (best {best:.2f}x).
On a CPU the verify step's cost grows with its tokens (a step over 11 tokens took ~4.6x a one-token decode step
of this model, measured apart: the matrix products are compute-bound here, where a GPU's small-batch step is bound by
reading the weights), so ~10 tokens per step buy little more than 1.2-1.3x; the GPU's gain is not measured yet.
{END}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="training steps of the copying model (first run only)")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--drafts", type=int, nargs="+", default=[4, 10, 16], help="prompt_lookup_num_tokens values")
    parser.add_argument("--ngram", type=int, default=3, help="max_matching_ngram_size")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md")
    args = parser.parse_args()
    cache = Path(os.environ.get("TORCH2JAX_BENCH_CACHE", "~/.cache/torch2jax-bench")).expanduser()
    model_dir = cache / f"prompt-lookup-copy-llama-{args.steps}"
    train(model_dir, args.steps)
    record = model_dir / "training.json"
    if record.exists():
        done = json.loads(record.read_text())
        train_s = (f"{done['steps']} steps of {done['batch']} sequences, AdamW, {done['seconds']} s, final loss "
                   f"{done['loss']:.2f}")
    else:
        train_s = f"up to {args.steps} steps of {BATCH} sequences, AdamW, stopped once it copied"
    import torch2jax

    g = torch2jax.convert_hf(f"hf:{model_dir}", max_cache_len=256, max_batch=1)
    rng = np.random.default_rng(1234)  # held out: the training draws from seed 0
    prompts = [example(rng)[0] for _ in range(args.prompts)]
    results = []
    for k in args.drafts:
        r = measure(g, prompts, args.new, args.rounds, k, args.ngram)
        results.append({"k": k, "n": args.ngram, **r})
        print(f"k={k} n={args.ngram}: decode plain {r['plain_decode']:.0f} tok/s, prompt lookup {r['lookup_decode']:.0f} "
              f"tok/s, speedup {r['decode_speedup']:.2f}x (end to end {r['speedup']:.2f}x), acceptance {r['acceptance']:.0%}, "
              f"{r['tokens_per_step']:.1f} tokens/step, "
              f"identical {r['identical']}", flush=True)
    text = report(results, args, train_s)
    print(text)
    if not args.no_write:
        from benchmarks.report import write_section

        write_section(args.out, text, BEGIN, END)
        print(f"wrote the prompt-lookup section of {args.out}")


if __name__ == "__main__":
    main()
