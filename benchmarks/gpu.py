"""The GPU tables: quantized decoding, serving and vision-language generation measured on a GPU machine, from
artifacts converted elsewhere.

    python -m benchmarks.gpu prepare DIR             # where torch converts: the artifacts without weights, the configs
    python -m benchmarks.gpu measure DIR OUT.md      # on the GPU machine (torch2jax installed; torch for the references)

The same models, prompts and lengths as benchmarks/quantized.py, serve.py and vlm.py. The tables measure speed and
weights are most of an artifact's bytes, so they need not travel: `measure` refills each artifact's params with
seeded random values of the shapes and dtypes its manifest declares (and rewrites the manifest's hashes), and builds
the transformers reference models from their configs with random weights on the GPU. Each section is written to
OUT.md as soon as it is measured; a section that fails is written as its error.

Run from the repository root on a machine where the project is not installed, the command line must first sit
where an install puts it (`ln -s ../cli torch2jax/cli`): the serving section starts `torch2jax serve`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import numpy as np

QUANTIZED = {"float32": {}, "bfloat16": {"dtype": "bfloat16"}, "int8": {"quantize": "int8"},
             "int8-dynamic": {"quantize": "int8-dynamic"}, "int4 (group 64)": {"quantize": "int4", "group_size": 64}}
PLATFORMS = ["cpu", "cuda"]


# -- prepare (with torch, where the converter runs) ------------------------------------------------
def prepare(root: Path) -> None:
    import torch2jax
    from benchmarks import serve, vlm
    from benchmarks.generation import NEW, PROMPT

    root.mkdir(parents=True, exist_ok=True)
    source, _, _ = serve.make_model(root)  # root/hf (Llama + word-level tokenizer) and root/llm (the serve artifact)
    for label, options in QUANTIZED.items():
        g = torch2jax.convert_hf(source, max_cache_len=PROMPT + NEW, max_batch=8, stream_weights=True, **options)
        torch2jax.save(g, root / _folder(label), platforms=PLATFORMS, force=True)
        print(f"converted {label}", flush=True)
    vlm.llava(root / "hf-llava")
    g = torch2jax.convert_hf(root / "hf-llava", max_cache_len=512, max_batch=1)
    torch2jax.save(g, root / "vlm", platforms=PLATFORMS, force=True)
    for params in root.glob("*/params"):
        shutil.rmtree(params)
    for weights in root.glob("hf*/*.safetensors"):
        weights.unlink()
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    print(f"prepared {root}: {total / 1e6:.1f} MB without weights")


def _folder(label: str) -> str:
    return "q-" + label.split()[0]


# -- measure (on the GPU machine) ------------------------------------------------------------------
def refill(artifact: Path, seed: int = 0) -> None:
    """Write seeded random params of the manifest's shapes and dtypes into `artifact`, and the manifest's new hashes."""
    from torch2jax.ir import dtypes
    from torch2jax.runtime.artifact import MANIFEST, PARAMS, file_hashes, param_tree
    from torch2jax.runtime.checkpoint import save_params

    manifest = json.loads((artifact / MANIFEST).read_text())
    rng = np.random.default_rng(seed)
    params = {}
    for name, (shape, dtype_name) in param_tree(manifest).items():
        dtype = dtypes.numpy_dtype(dtype_name)
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            params[name] = rng.integers(max(info.min, -128), min(info.max, 255) + 1, shape).astype(dtype)
        else:
            params[name] = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(dtype)
    shutil.rmtree(artifact / PARAMS, ignore_errors=True)
    save_params(params, (artifact / PARAMS).resolve())
    manifest["files"] = {rel: digest for rel, digest in file_hashes(artifact).items() if rel != MANIFEST}
    (artifact / MANIFEST).write_text(json.dumps(manifest, indent=2))


def reference(auto_class: str, config_dir: Path, device: str, dtype: str = "float32"):
    """A transformers model of `config_dir`'s config with random weights, on `device`, in eval mode."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(config_dir)
    torch.manual_seed(0)
    model = getattr(transformers, auto_class).from_config(config, dtype=getattr(torch, dtype))
    return model.to(device).eval()


def measure_quantized(root: Path, rounds: int, device: str) -> str:
    import torch2jax
    from benchmarks.generation import NEW, PROMPT, bandwidth_bytes_per_s, bytes_per_step, time_ours, time_transformers
    from torch2jax.generate.loop import STEPS_PER_CALL

    bandwidth = bandwidth_bytes_per_s()
    rows = []
    for label in QUANTIZED:
        g = torch2jax.load(root / _folder(label))
        unread = g.params["model.embed_tokens.weight"].nbytes
        for batch in (1, 8):
            ids = np.random.default_rng(0).integers(3, 32000, (batch, PROMPT))
            blocks = (g.steps_per_call, 1) if label == "float32" else (g.steps_per_call,)
            for steps in blocks:  # float32 also one decode step per call, as before decode ran in blocks
                g.steps_per_call = steps
                ttft, rate = time_ours(g, ids, rounds)
                name = f"torch2jax {label}" + (" (1 step per call)" if steps == 1 else "")
                rows.append((name, batch, ttft, rate, rate * bytes_per_step(g, batch, unread) / bandwidth))
                print(f"  {rows[-1]}", flush=True)
            g.steps_per_call = blocks[0]
        del g
    for dtype in ("float32", "bfloat16"):
        model = reference("AutoModelForCausalLM", root / "hf", device, dtype)
        for batch in (1, 8):
            ids = np.random.default_rng(0).integers(3, 32000, (batch, PROMPT))
            ttft, rate = time_transformers(model, ids, rounds)
            rows.append((f"transformers eager {dtype}", batch, ttft, rate, None))
            print(f"  {rows[-1]}", flush=True)
        del model
    base = {b: next(r[3] for r in rows if r[0] == "torch2jax float32" and r[1] == b) for b in (1, 8)}
    lines = ["| runtime and weights | batch | TTFT (ms) | decode tok/s per row | vs torch2jax float32 | of its own memory bound |",
             "|---|---|---|---|---|---|"]
    for label, batch, ttft, rate, share in sorted(rows, key=lambda r: r[1]):
        bound = f"{share:.0%}" if share is not None else "—"
        lines.append(f"| {label} | {batch} | {ttft * 1e3:.1f} | {rate:.1f} | {rate / base[batch]:.2f}x | {bound} |")
    return f"""### Quantized text generation on the GPU

benchmarks/quantized.py's model and lengths (Llama-shaped, 56M params, prompt {PROMPT}, {NEW} new tokens), medians of
{rounds} runs after a warm-up; each memory bound counts the bytes that artifact's decode step reads, at
{bandwidth / 1e9:.0f} GB/s (a jitted sum over 512 MiB on this GPU). transformers eager runs `generate` on the same GPU.
Decode runs {STEPS_PER_CALL} steps per compiled call (`steps_per_call`); "1 step per call" is float32 with one decode
step per dispatch and token read, as generate ran before.

{chr(10).join(lines)}
"""


def measure_serve(root: Path, requests: int, rounds: int, device: str, device_name: str) -> str:
    from benchmarks import serve

    source = root / "hf"
    if not any(source.glob("*.safetensors")):  # transformers serve loads weights: random ones of the same config
        reference("AutoModelForCausalLM", source, device).save_pretrained(source)
    # three servers share the GPU: JAX's default takes 75% of its memory at start, leaving the others none
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    args = SimpleNamespace(requests=requests, concurrency=8, rounds=rounds, seed=0, skip_transformers=False)
    logs = root / "serve-logs"
    logs.mkdir(exist_ok=True)
    contenders = serve.serve_and_measure(root / "llm", source, logs, args, device=device)
    text = serve.report(contenders, args, 0.0, machine=f"One {device_name}; transformers serve on torch device {device}.")
    for c in contenders:
        if c.error:
            print(f"{c.name}: {c.error}\n{Path(c.server.log).read_text()[-1500:]}", flush=True)
    body = text.split("\n", 3)[3].rsplit("\n", 1)[0]  # drop the markers and the CPU section's heading
    body = body.replace(" (0 s)", "").replace("Written by `make bench-serve` (`python -m benchmarks.serve`).\n", "")
    return "### Serving on the GPU\n\n" + body + "\n"


def measure_serve_blocks(root: Path, rounds: int) -> str:
    """The serving load through the scheduler alone (no HTTP), decoding one step per call against blocks of 16."""
    import statistics
    from collections import deque

    import torch2jax
    from benchmarks.serve import workload
    from torch2jax.serve.api import warm_up_short
    from torch2jax.serve.engine import BatchEngine
    from torch2jax.serve.scheduler import Request, Scheduler

    g = torch2jax.load(root / "llm")
    work = [(np.random.default_rng(i).integers(3, 32000, len(p.split())).tolist(), m) for i, (p, m) in enumerate(workload(32, 0))]
    schedulers = {block: Scheduler(BatchEngine(g, 8, 256, decode_block=block), max_queue=64) for block in (1, 16)}
    rates = {block: [] for block in schedulers}
    for scheduler in schedulers.values():
        warm_up_short(scheduler)
    for turn in range(rounds + 1):  # the first round compiles what the short warm-up did not
        for block, scheduler in schedulers.items():
            queue, done, tokens = deque(work), [0], [0]

            def submit_next(scheduler=scheduler, queue=queue, done=done, tokens=tokens) -> None:
                if queue:
                    prompt, max_tokens = queue.popleft()

                    def heard(event) -> None:
                        tokens[0] += len(event.tokens)
                        if event.finish_reason:
                            done[0] += 1
                            submit_next()

                    scheduler.submit(Request(prompt, max_tokens, heard, end_tokens=()))

            for _ in range(8):
                submit_next()
            start = time.perf_counter()
            while done[0] < len(work):
                scheduler.step()
            if turn:
                rates[block].append(tokens[0] / (time.perf_counter() - start))
    lines = ["| decode steps per call | output tok/s | vs one step per call |", "|---|---|---|"]
    for block, values in rates.items():
        lines.append(f"| {block} | {statistics.median(values):.1f} | {statistics.median(values) / statistics.median(rates[1]):.2f}x |")
    return f"""### Serving in decode blocks on the GPU

The serving load (32 requests, 8 in a closed loop, greedy) through serve's scheduler alone, no HTTP, after a short
warm-up and one untimed round; medians of {rounds} rounds.

{chr(10).join(lines)}
"""


def measure_vlm(root: Path, rounds: int, device: str) -> str:
    import torch

    import torch2jax
    from benchmarks import vlm
    from benchmarks.generation import time_ours, time_transformers

    g = torch2jax.load(root / "vlm")
    ids, pixels = vlm.inputs(g.vision.tokens_per_image)
    ours = time_ours(g, ids, rounds, vlm.NEW, pixel_values=pixels)
    model = reference("AutoModelForImageTextToText", root / "hf-llava", device)
    theirs = time_transformers(model, ids, rounds, vlm.NEW, pixel_values=torch.from_numpy(pixels).to(device))
    lines = ["| runtime | TTFT (ms) | decode tok/s | TTFT vs transformers eager | decode vs transformers eager |",
             "|---|---|---|---|---|"]
    for label, (ttft, rate) in (("torch2jax generate", ours), ("transformers eager", theirs)):
        lines.append(f"| {label} | {ttft * 1e3:.1f} | {rate:.1f} | {theirs[0] / ttft:.2f}x | {rate / theirs[1]:.2f}x |")
    return f"""### Vision-language generation on the GPU

benchmarks/vlm.py's LLaVA-shaped model and input (one 224x224 image, {vlm.TEXT} text tokens, {vlm.NEW} new tokens, batch 1),
float32, medians of {rounds} runs after a warm-up.

{chr(10).join(lines)}
"""


def measure(root: Path, out: Path, rounds: int, requests: int, serve_rounds: int, only: list[str], device: str) -> None:
    import jax

    first = jax.devices()[0]
    device_name = getattr(first, "device_kind", str(first))
    print(f"jax {jax.__version__} on {device_name}", flush=True)
    for artifact in sorted(p.parent for p in root.glob("*/manifest.json")):
        start = time.perf_counter()
        refill(artifact)
        print(f"refilled {artifact.name} in {time.perf_counter() - start:.1f} s", flush=True)
    sections = {"quantized": lambda: measure_quantized(root, rounds, device),
                "serve": lambda: measure_serve(root, requests, serve_rounds, device, device_name),
                "serve-blocks": lambda: measure_serve_blocks(root, rounds),
                "vlm": lambda: measure_vlm(root, rounds, device)}
    text = f"## On a GPU: {device_name} (jax {jax.__version__})\n\nWritten by `python -m benchmarks.gpu measure`.\n"
    out.write_text(text)
    for name in only or list(sections):
        start = time.perf_counter()
        try:
            section = sections[name]()
        except Exception:
            section = f"### {name}: failed\n\n```\n{traceback.format_exc()[-3000:]}\n```\n"
        print(section, f"({name}: {time.perf_counter() - start:.0f} s)", flush=True)
        text += "\n" + section
        out.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare").add_argument("root", type=Path)
    run = commands.add_parser("measure")
    run.add_argument("root", type=Path)
    run.add_argument("out", type=Path)
    run.add_argument("--rounds", type=int, default=3)
    run.add_argument("--requests", type=int, default=32)
    run.add_argument("--serve-rounds", type=int, default=2)
    run.add_argument("--only", nargs="*", choices=["quantized", "serve", "serve-blocks", "vlm"], default=[])
    run.add_argument("--torch-device", default="cuda", help="where the transformers references run (cpu: a dry run)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.command == "prepare":
        prepare(args.root)
    else:
        measure(args.root, args.out, args.rounds, args.requests, args.serve_rounds, args.only, args.torch_device)
    sys.exit(0)


if __name__ == "__main__":
    main()
