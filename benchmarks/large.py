"""Converting checkpoints larger than memory should allow: peak RSS and time vs the weights' size.

    python -m benchmarks.large                  # 0.5, 1, 2, 4 GB; rewrites its section of docs/benchmarks.md
    python -m benchmarks.large --sizes 0.5 1    # fewer sizes

Each size is a Llama-shaped bfloat16 checkpoint (hidden 2048, 16 heads, 4 kv heads, vocab 32000, as many
layers as the size needs) written here tensor by tensor from random values, then converted by
`torch2jax convert hf:DIR` (streamed weights, the default) in a fresh process that reports its own
peak RSS (VmHWM). "fixed" is the same conversion of a model as deep but 64 wide: the cost of torch, jax
and transformers imported and of exporting that many layers, which does not depend on the weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("TORCH2JAX_LARGE_DIR", "/tmp/torch2jax-large-bench"))
BEGIN, END = "<!-- large:begin -->", "<!-- large:end -->"
WIDE = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)


def write_checkpoint(directory: Path, shape: dict, layers: int) -> int:
    """config.json + model.safetensors of a random bfloat16 Llama; returns the weights' bytes."""
    import ml_dtypes
    import torch
    import transformers

    from torch2jax.capture.checkpoint_files import write_streamed
    from torch2jax.capture.fake_params import fake_parameters

    config = transformers.LlamaConfig(**shape, num_hidden_layers=layers, max_position_embeddings=4096, dtype="bfloat16",
                                      architectures=["LlamaForCausalLM"])
    with fake_parameters():  # the names and shapes, without the values
        model = transformers.LlamaForCausalLM(config)
    layout = {name: (np.dtype(ml_dtypes.bfloat16), tuple(p.shape)) for name, p in model.state_dict().items()
              if name in dict(model.named_parameters())}
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    rng = np.random.default_rng(0)
    del model, torch

    def make(name: str) -> np.ndarray:
        shape = layout[name][1]
        if name.endswith("norm.weight"):
            return np.ones(shape, ml_dtypes.bfloat16)
        return (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    write_streamed(directory / "model.safetensors", layout, make)
    return sum(int(np.prod(s)) * 2 for _, s in layout.values())


def evict(directory: Path) -> None:
    """Drop the checkpoint's pages from the page cache (written back first), so that the next read comes from disk
    as a freshly downloaded or copied checkpoint's would."""
    os.sync()
    for file in directory.glob("*.safetensors"):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_once(directory: Path) -> float:
    """Seconds to read every safetensors file once from disk (64 MiB at a time)."""
    evict(directory)
    buffer = bytearray(64 << 20)
    start = time.perf_counter()
    for file in sorted(directory.glob("*.safetensors")):
        with open(file, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass
    return time.perf_counter() - start


def write_once(directory: Path, nbytes: int) -> float:
    """Seconds to write `nbytes` to a new file on the same disk (64 MiB at a time, then flushed): the floor for
    any conversion, which must write every weight once."""
    block = np.random.default_rng(1).integers(0, 255, 64 << 20, np.uint8).tobytes()
    path = directory / "write-once.bin"
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, nbytes // len(block))):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return elapsed


def child(directory: str, out: str, verify: bool) -> None:
    """Run the CLI's convert in this process; print peak RSS and the time spent streaming the weights."""
    from torch2jax.cli.main import main

    from torch2jax.runtime import checkpoint

    streamed = {}
    save = checkpoint.save_streamed_params

    def timed(*args, **kwargs):
        start = time.perf_counter()
        save(*args, **kwargs)
        streamed["s"] = time.perf_counter() - start

    checkpoint.save_streamed_params = timed
    start = time.perf_counter()
    args = ["convert", f"hf:{directory}", "--out", out, "--max-cache-len", "64", "--max-batch", "2", "--platforms", "cpu", "-q"]
    try:
        main(args + ([] if verify else ["--no-verify"]), standalone_mode=False)
    finally:
        total = time.perf_counter() - start
        status = Path("/proc/self/status").read_text()
        peak = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM"))
        print(json.dumps({"peak_rss": peak, "total_s": total, "stream_s": streamed.get("s")}), flush=True)


def measure(directory: Path, verify: bool) -> dict:
    out = WORK / "out"
    shutil.rmtree(out, ignore_errors=True)
    evict(directory)
    result = subprocess.run([sys.executable, "-m", "benchmarks.large", "--child", str(directory), str(out)]
                            + (["--verify"] if verify else []), cwd=ROOT, capture_output=True, text=True, timeout=3600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"conversion of {directory} failed:\n{result.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(lines[-1])


def section(rows: list[dict], verify: bool) -> str:
    lines = [
        BEGIN,
        "## Converting large checkpoints (streamed weights)",
        "",
        "`python -m benchmarks.large` (`make bench-large`): Llama-shaped bfloat16 checkpoints with random weights (hidden 2048, "
        "intermediate 5632, vocab 32000, more layers for more bytes), converted by `torch2jax convert hf:DIR` in a fresh "
        f"process each ({'with' if verify else 'without'} verification; text generation, max cache 64, cpu platform). "
        "Peak RSS is the process's VmHWM. The fixed overhead is measured per row: the same conversion of a model with "
        "the same number of layers but 64 wide (a few MB of weights): torch, jax, transformers and Orbax imported, and "
        "torch.export of the decoder step at 3 and 4 layers (a middle layer's graph is repeated for the others; "
        "docs/architecture.md), which does not grow with the bytes of weights. "
        "Target: peak RSS at most 0.25 x weights + that overhead. Time: the checkpoint's pages are dropped from the page "
        "cache before the conversion and before reading the files once, so both read from disk; writing the same bytes "
        "once (flushed) is the other floor, since the artifact must hold every weight.",
        "",
        "| weights | layers | peak RSS | fixed (same depth, no weights) | over fixed | over fixed / weights "
        "| read once | write once | stream into checkpoint | whole conversion | whole / read once | whole / (read + write once) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        over = r["peak_rss"] - r["fixed_rss"]
        lines.append(
            f"| {r['bytes'] / 1e9:.2f} GB | {r['layers']} | {r['peak_rss'] / 2**30:.2f} GiB | {r['fixed_rss'] / 2**30:.2f} GiB | "
            f"{over / 2**30:.2f} GiB | {over / r['bytes']:.3f} | {r['read_s']:.2f} s | {r['write_s']:.2f} s | "
            f"{r['stream_s']:.2f} s | {r['total_s']:.1f} s | {r['total_s'] / r['read_s']:.1f}x | "
            f"{r['total_s'] / (r['read_s'] + r['write_s']):.2f}x |"
        )
    lines += ["", "What the weights add over the fixed overhead (\"over fixed\") is one batch "
              "of at most 128 MiB, read and handed to Orbax, plus Orbax's write buffers: it does not grow with the "
              "weights, because the memory each batch frees is handed back to the OS before the next (glibc keeps memory "
              "freed by Orbax's writer threads in its arenas otherwise, and it piled up over the batches: 0.12-0.15x "
              "of the weights before). On this disk writing is several times slower than reading, so no conversion "
              "that writes the weights can come within 2x of reading them once; the last column compares with the floor "
              "of reading and writing them once.", END]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.5, 1, 2, 4], help="weights in GB")
    parser.add_argument("--verify", action="store_true", help="verify each conversion (default: --no-verify)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.verify)
        return
    from benchmarks.report import write_section

    per_layer = 2 * (2 * WIDE["hidden_size"] ** 2 + 2 * WIDE["hidden_size"] * 512 + 3 * WIDE["hidden_size"] * WIDE["intermediate_size"])
    ends = 2 * 2 * WIDE["vocab_size"] * WIDE["hidden_size"]
    rows = []
    for size in args.sizes:
        layers = max(2, round((size * 1e9 - ends) / per_layer))
        directory = WORK / f"llama-{size:g}gb"
        shutil.rmtree(directory, ignore_errors=True)
        fixed_dir = WORK / f"narrow-{layers}"
        write_checkpoint(fixed_dir, TINY, layers)
        fixed_rss = measure(fixed_dir, args.verify)["peak_rss"]
        shutil.rmtree(fixed_dir, ignore_errors=True)
        nbytes = write_checkpoint(directory, WIDE, layers)
        read_s = min(read_once(directory) for _ in range(2))
        write_s = write_once(WORK, nbytes)
        row = {"bytes": nbytes, "layers": layers, "read_s": read_s, "write_s": write_s, "fixed_rss": fixed_rss,
               **measure(directory, args.verify)}
        print(json.dumps(row), flush=True)
        rows.append(row)
        shutil.rmtree(directory, ignore_errors=True)
    text = section(rows, args.verify)
    print(text)
    write_section(args.out, text, BEGIN, END)


if __name__ == "__main__":
    main()
