"""Recurrent and hybrid causal LMs' generation speed: a converted model's decode against transformers' own `generate`.

    python -m benchmarks.recurrent                  # every family, print, rewrite its section of docs/benchmarks.md
    python -m benchmarks.recurrent --only mamba2 jamba --no-write

One process per family pinned to one core (one intra-op thread everywhere, as benchmarks/generation.py runs), random
weights from a config at a moderate size (hidden 512, 4-6 layers, vocab 32000, each family's state sizes scaled down),
float32, batch 1, a 32-token prompt and 64 new tokens, end token disabled so every run makes every token. Decode
ms/token leaves out prefill and compilation: ours is the time from the first token (the prefill's) to the last over
the tokens after the first, read from `generate(stream=True)` after a warm-up that compiles every step; transformers'
is generate of 64 tokens minus generate of 1 (greedy, use_cache=True, its default attention). The two are timed in
turns, round by round, so that a ratio pairs samples taken under the same load; the table gives the median ratio.

Context flatness: a pure state-space model's decode step does not read the context, so a step at 1,024 tokens of
context should cost what one at 64 does; Mamba2 shows it, a hybrid with attention layers (Bamba) shows the contrast.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- recurrent:begin -->", "<!-- recurrent:end -->"
PROMPT, NEW = 32, 64
SHORT, LONG = 64, 1024  # the flatness check's contexts
FLAT_KINDS = ("mamba2", "bamba")  # a pure state-space model, and a hybrid for contrast
KINDS = ("mamba", "mamba2", "bamba", "falcon_mamba", "jamba", "zamba2", "granitemoehybrid", "nemotron_h", "falcon_h1",
         "recurrent_gemma", "qwen3_5", "qwen3_next", "lfm2")
MOE_KINDS = ("jamba", "granitemoehybrid", "qwen3_next")  # a mixture of experts beside the recurrent layers
FLATNESS_TOLERANCE = 0.10  # the target: a step at LONG within 10% of one at SHORT
SPEEDUP_TARGET = 2.0  # the target: decode at batch 1 at least this many times transformers eager's speed


@dataclass(frozen=True)
class Size:
    """The dimensions every family's config is built from: `moderate` for the benchmark, `tiny` for the smoke test."""

    hidden: int
    layers: int
    heads: int
    head_dim: int
    state: int  # a Mamba2-style SSM's state size (Mamba's is a quarter, its own default's share)
    vocab: int

    @property
    def ffn(self) -> int:
        return self.hidden * 11 // 4


MODERATE = Size(hidden=512, layers=4, heads=8, head_dim=64, state=64, vocab=32000)
TINY = Size(hidden=32, layers=2, heads=4, head_dim=8, state=8, vocab=96)


@dataclass(frozen=True)
class Setting:
    """What one run measures: the models' size, the prompt, the new tokens, the flatness check's two contexts."""

    size: Size = MODERATE
    prompt: int = PROMPT
    new: int = NEW
    contexts: tuple[int, int] = (SHORT, LONG)


SETTINGS = {"full": Setting(), "smoke": Setting(TINY, prompt=4, new=2, contexts=(4, 8))}  # smoke: the test's


def config(kind: str, size: Size = MODERATE) -> Any:
    """`kind`'s transformers config at `size`: the family's own layer pattern at `size.layers` layers (hybrids keep at
    least one state layer and one attention layer), float32."""
    import transformers

    h, n, d, s, layers = size.hidden, size.heads, size.head_dim, size.state, size.layers
    special = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2, vocab_size=size.vocab, tie_word_embeddings=False)
    ssm_heads = 2 * h // d  # expand 2: the mixer's inner width 2h in heads of head_dim
    attention = dict(num_attention_heads=n, num_key_value_heads=n // 2, intermediate_size=size.ffn)
    mamba2 = dict(mamba_n_heads=ssm_heads, mamba_d_head=d, mamba_n_groups=1, mamba_d_state=s, mamba_d_conv=4,
                  mamba_chunk_size=64)
    mixed = ["linear_attention"] * layers
    mixed[layers // 2] = "full_attention"  # one attention layer in the middle, as the hybrids' configs place them
    if kind in ("mamba", "falcon_mamba"):
        cls = transformers.MambaConfig if kind == "mamba" else transformers.FalconMambaConfig
        return cls(hidden_size=h, state_size=max(s // 4, 4), num_hidden_layers=layers, expand=2, conv_kernel=4,
                   time_step_rank=max(h // 16, 1), **special)
    if kind == "mamba2":
        return transformers.Mamba2Config(hidden_size=h, state_size=s, num_hidden_layers=layers, expand=2, conv_kernel=4,
                                         num_heads=ssm_heads, head_dim=d, n_groups=1, chunk_size=64, **special)
    if kind == "bamba":
        return transformers.BambaConfig(hidden_size=h, num_hidden_layers=layers, mamba_expand=2,
                                        attn_layer_indices=[layers // 2], **attention, **mamba2, **special)
    if kind == "jamba":  # attention every 4th layer from 2, a mixture of experts every 2nd from 1 (Jamba's pattern)
        return transformers.JambaConfig(hidden_size=h, num_hidden_layers=layers, num_experts=4, num_experts_per_tok=2,
                                        expert_layer_period=2, expert_layer_offset=1, attn_layer_period=4,
                                        attn_layer_offset=layers // 2, mamba_d_state=max(s // 4, 4), mamba_d_conv=4,
                                        mamba_expand=2, mamba_dt_rank=max(h // 16, 1),
                                        **attention, **special)
    if kind == "zamba2":  # the shared attention block before every other layer
        blocks = ["mamba", "hybrid"] * (layers // 2) + ["mamba"] * (layers % 2)
        return transformers.Zamba2Config(hidden_size=h, attention_head_dim=2 * d, n_mamba_heads=ssm_heads,
                                         mamba_headdim=d, mamba_ngroups=1, mamba_d_state=s, mamba_d_conv=4,
                                         mamba_expand=2, chunk_size=64, num_hidden_layers=layers,
                                         layers_block_type=blocks, num_mem_blocks=1, use_mem_rope=True,
                                         num_attention_heads=n, num_key_value_heads=n, intermediate_size=size.ffn,
                                         **special)
    if kind == "granitemoehybrid":
        return transformers.GraniteMoeHybridConfig(hidden_size=h, num_hidden_layers=layers, num_local_experts=4,
                                                   num_experts_per_tok=2, shared_intermediate_size=size.ffn,
                                                   layer_types=mixed, mamba_expand=2, **attention, **mamba2, **special)
    if kind == "nemotron_h":  # Mamba2 and MLP layers in turn, one attention layer
        pattern = ["linear_attention", "mlp"] * (layers // 2) + ["linear_attention"] * (layers % 2)
        pattern[layers // 2] = "full_attention"
        return transformers.NemotronHConfig(hidden_size=h, layers_block_type=pattern, num_attention_heads=n,
                                            num_key_value_heads=n // 2, head_dim=d, intermediate_size=size.ffn,
                                            ssm_state_size=s, mamba_num_heads=ssm_heads, mamba_head_dim=d, n_groups=1,
                                            conv_kernel=4, chunk_size=64, **special)
    if kind == "falcon_h1":  # every layer a Mamba2 mixer with attention in parallel
        return transformers.FalconH1Config(hidden_size=h, num_hidden_layers=layers, mamba_d_ssm=2 * h,
                                           mamba_rms_norm=True, **attention, **mamba2, **special)
    if kind == "recurrent_gemma":  # two recurrent blocks, then attention (its default pattern); one key/value head
        blocks = ["recurrent", "recurrent", "attention"] if layers > 2 else ["recurrent", "attention"]
        return transformers.RecurrentGemmaConfig(num_hidden_layers=layers, hidden_size=h, intermediate_size=3 * h,
                                                 num_attention_heads=n, num_key_value_heads=1, head_dim=d, lru_width=h,
                                                 conv1d_width=4, attention_window_size=2048,
                                                 block_types=blocks, **special)
    delta = dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=n, num_key_value_heads=n // 4 or 1,
                 head_dim=d, linear_conv_kernel_dim=4, linear_key_head_dim=d, linear_value_head_dim=d,
                 linear_num_key_heads=n // 2, linear_num_value_heads=n,
                 layer_types=["linear_attention"] * (layers - 1) + ["full_attention"], **special)
    if kind == "qwen3_5":
        return transformers.Qwen3_5TextConfig(intermediate_size=size.ffn, **delta)
    if kind == "qwen3_next":
        return transformers.Qwen3NextConfig(intermediate_size=size.ffn, num_experts=8, num_experts_per_tok=2,
                                            moe_intermediate_size=h // 2, shared_expert_intermediate_size=h, **delta)
    if kind == "lfm2":  # short convolutions, one attention layer
        types = ["conv"] * layers
        types[layers // 2] = "full_attention"
        return transformers.Lfm2Config(hidden_size=h, intermediate_size=size.ffn, num_hidden_layers=layers,
                                       num_attention_heads=n, num_key_value_heads=n // 2, conv_L_cache=3,
                                       layer_types=types, **special)
    raise KeyError(f"unknown family {kind!r}: one of {', '.join(KINDS)}")


def build(kind: str, size: Size = MODERATE) -> Any:
    """The family's causal LM with seeded random weights, in eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config(kind, size)).eval()


def ours_round(g: Any, ids: np.ndarray, new: int) -> float:
    """Seconds per decode token of one `generate`: from the first token (the prefill's) to the last."""
    steps = g.generate(ids, max_new_tokens=new, eos_token_id=[], stream=True)
    next(steps)
    first = time.perf_counter()
    for _ in steps:
        pass
    return (time.perf_counter() - first) / (new - 1)


def transformers_run(lm: Any, ids: np.ndarray, new: int) -> float:
    """Seconds of transformers' greedy generate of exactly `new` tokens."""
    import torch

    ids_t = torch.from_numpy(ids)
    start = time.perf_counter()
    with torch.inference_mode():
        lm.generate(ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, use_cache=True, pad_token_id=0)
    return time.perf_counter() - start


def measure(kind: str, setting: Setting = Setting(), rounds: int = 5, flatness: bool = False) -> dict[str, Any]:
    """One family: convert, warm up both, then `rounds` paired rounds (ours, transformers) of decode seconds per
    token; with `flatness`, ours also at the setting's two contexts ("flatness": [short, long] samples)."""
    import torch

    import torch2jax

    size, prompt, new = setting.size, setting.prompt, setting.new
    lm = build(kind, size)  # transformers' own, as its users get it: conversion sets an experts implementation
    cache_len = (setting.contexts[1] if flatness else prompt) + new
    start = time.perf_counter()
    g = torch2jax.convert_hf(build(kind, size), max_cache_len=cache_len, max_batch=1)
    convert_s = time.perf_counter() - start
    ids = np.random.default_rng(0).integers(3, size.vocab, (1, prompt))
    ours_round(g, ids, new)  # compiles the prefill and every decode span
    transformers_run(lm, ids, new)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(ours_round(g, ids, new))
        theirs.append((transformers_run(lm, ids, new) - transformers_run(lm, ids, 1)) / (new - 1))
    result = {"kind": kind, "params": sum(p.numel() for p in lm.parameters()), "convert_s": convert_s,
              "ours": ours, "transformers": theirs, "cache_kinds": list(g.spec.cache_kinds),
              "attn_implementation": getattr(lm.config, "_attn_implementation", None),
              "experts_implementation": getattr(lm.config, "_experts_implementation", None),
              "torch_threads": torch.get_num_threads()}
    if flatness:  # the two contexts in turns, round by round, as the speed's pairs
        prompts = [np.random.default_rng(1).integers(3, size.vocab, (1, context)) for context in setting.contexts]
        for ids in prompts:
            ours_round(g, ids, new)
        result["flatness"] = [[], []]
        for _ in range(rounds):
            for samples, ids in zip(result["flatness"], prompts):
                samples.append(ours_round(g, ids, new))
    return result


def pin_one_core() -> None:
    """One core, one thread, as benchmarks/generation.py measures (XLA's CPU client then runs on that core)."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    import torch

    torch.set_num_threads(1)


def run_isolated(kind: str, setting: str, rounds: int, timeout: float) -> dict[str, Any]:
    """`measure(kind)` in a process of its own (pinned, so one family's compiled code and allocations never slow the
    next); a failure comes back as {"kind", "error"}."""
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "result.json"
        command = [sys.executable, "-m", "benchmarks.recurrent", "--one", kind, "--rounds", str(rounds), "--json", str(out),
                   "--setting", setting]
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"kind": kind, "error": f"timed out after {timeout:.0f} s"}
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            return {"kind": kind, "error": f"exit {done.returncode}: {tail[0][:200]}"}
        return json.loads(out.read_text())


def spread(samples: list[float]) -> float:
    """(max - min) / median: how much the rounds disagree, the run's noise."""
    return (max(samples) - min(samples)) / statistics.median(samples)


def report(results: list[dict[str, Any]], rounds: int, load: tuple[tuple[float, ...], tuple[float, ...]],
           setting: Setting = Setting()) -> str:
    """docs/benchmarks.md's section: the speed table, the flatness rows, which targets are met."""
    (short_at, long_at), size, prompt, new = setting.contexts, setting.size, setting.prompt, setting.new
    lines = ["| family | params | cache | torch2jax ms/token | transformers eager ms/token | speedup (paired median) | "
             "noise (ours / transformers) | conversion (s) |", "|---|---|---|---|---|---|---|---|"]
    slow, met, failed, slow_kinds = [], [], [], []
    for r in results:
        if "error" in r:
            failed.append(r["kind"])
            lines.append(f"| {r['kind']} | | | failed: {r['error']} | | | | |")
            continue
        ours, theirs = statistics.median(r["ours"]), statistics.median(r["transformers"])
        speedup = statistics.median(t / o for o, t in zip(r["ours"], r["transformers"]))
        kinds = r["cache_kinds"]
        cache = "state" if "kv" not in kinds else "state + kv"
        (met if speedup >= SPEEDUP_TARGET else slow).append(f"{r['kind']} {speedup:.1f}x")
        if speedup < SPEEDUP_TARGET:
            slow_kinds.append(r["kind"])
        lines.append(f"| {r['kind']} | {r['params'] / 1e6:.0f}M | {cache} | {ours * 1e3:.2f} | {theirs * 1e3:.2f} | "
                     f"{speedup:.1f}x | {spread(r['ours']):.0%} / {spread(r['transformers']):.0%} | {r['convert_s']:.0f} |")
    flat_lines = [f"| family | ms/token at {short_at} | ms/token at {long_at} | {long_at} / {short_at} (paired median) | within "
                  f"{FLATNESS_TOLERANCE:.0%} |", "|---|---|---|---|---|"]
    flat = {}
    for r in results:
        if "flatness" not in r:
            continue
        shorts, longs = r["flatness"]
        short, long = statistics.median(shorts), statistics.median(longs)
        flat[r["kind"]] = statistics.median(b / a for a, b in zip(shorts, longs))
        flat_lines.append(f"| {r['kind']} | {short * 1e3:.2f} | {long * 1e3:.2f} | {flat[r['kind']]:.2f} | "
                          f"{'yes' if abs(flat[r['kind']] - 1) <= FLATNESS_TOLERANCE else 'no'} |")
    speed_line = (f"met for {len(met)} of {len(results)} families" + (f"; not met: {', '.join(slow)}" if slow else "")
                  + (f"; failed: {', '.join(failed)}" if failed else ""))
    pure = flat.get("mamba2")
    flat_line = ("not measured" if pure is None else
                 f"{'met' if abs(pure - 1) <= FLATNESS_TOLERANCE else 'not met'}: Mamba2's step at {long_at} tokens is "
                 f"{pure:.2f}x its step at {short_at}")
    notes = ""
    if any(kind in MOE_KINDS for kind in slow_kinds):
        notes = """
Where a mixture-of-experts family's time goes: at batch 1 a decode step is bound by reading its weights, on both
sides. Ours gathers each token's top-k expert matrices (ops/linalg.expert_bmm: a copy of k of E matrices, then the
product), where transformers' default `grouped_mm` experts read the same k matrices in place; the LM head's read
(32000 x hidden floats) is the same on both. What is left to gain is torch's per-op overhead, a smaller share of a
step the larger the experts are.
"""
    return f"""{BEGIN}
## Recurrent and hybrid generation (state-space, linear-attention and short-convolution layers)

Random weights (hidden {size.hidden}, {size.layers} layers, vocab {size.vocab}, each family's state sizes scaled down), float32,
batch 1, prompt {prompt}, {new} new tokens, one core and one thread per process, {rounds} rounds after a warm-up
that compiles every step. Decode ms/token leaves out prefill and compilation (ours: first token to last over the
tokens after the first; transformers: generate of {new} tokens minus generate of 1, greedy, its default attention).
The speedup is the median of round-by-round ratios (ours and transformers timed in turns under the same load); noise
is each side's (max - min) / median over the rounds. The machine's 2 cores were shared with other work: load average
{load[0][0]:.1f} at the start, {load[1][0]:.1f} at the end. Written by `python -m benchmarks.recurrent`
(`make bench-recurrent`).

Targets: decode at batch 1 at least {SPEEDUP_TARGET:.0f}x transformers eager on the same weights: {speed_line}.
A pure state-space model's decode step at {long_at} tokens of context within {FLATNESS_TOLERANCE:.0%} of its step at
{short_at}: {flat_line}.

{chr(10).join(lines)}
{notes}
Context flatness: max_cache_len {long_at + new}, a prompt of {short_at} or {long_at} tokens, then {new} new tokens (ours
only), the two in turns round by round.

{chr(10).join(flat_lines)}
{END}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=KINDS, help="these families only")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per family")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--setting", choices=SETTINGS, default="full", help="smoke: tiny models, 2 new tokens (the test's)")
    parser.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)  # the worker: measure one family
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        pin_one_core()
        result = measure(args.one, SETTINGS[args.setting], rounds=args.rounds, flatness=args.one in FLAT_KINDS)
        args.json.write_text(json.dumps(result))
        return
    start_load = os.getloadavg()
    results = []
    for kind in args.only or KINDS:
        r = run_isolated(kind, args.setting, args.rounds, args.timeout)
        results.append(r)
        if "error" in r:
            print(f"  {kind}: {r['error']}", flush=True)
        else:
            ours, theirs = statistics.median(r["ours"]), statistics.median(r["transformers"])
            print(f"  {kind}: ours {ours * 1e3:.2f} ms/token, transformers {theirs * 1e3:.2f} ms/token "
                  f"({theirs / ours:.1f}x), conversion {r['convert_s']:.0f} s", flush=True)
    text = report(results, args.rounds, (start_load, os.getloadavg()), SETTINGS[args.setting])
    print(text)
    if not args.no_write:
        from benchmarks.report import write_section

        write_section(args.out, text, BEGIN, END)
        print(f"wrote the recurrent section of {args.out}")


if __name__ == "__main__":
    main()
