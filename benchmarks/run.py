"""The torch2jax benchmark suite: latency vs torch eager / torch.compile / ONNX Runtime / torchax, conversion cost,
artifact size and torch-free load time. Writes docs/benchmarks.md and docs/benchmarks.png and prints the tables.

    python -m benchmarks.run            # every model (make bench)
    python -m benchmarks.run --quick    # three models, fewer rounds; writes to build/benchmarks-quick/

Each model is measured in its own fresh process (benchmarks/worker.py), then loaded in a torch-free one
(benchmarks/load_probe.py). Every runtime runs with the same number of intra-op threads (--threads, default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from functools import partial
from importlib import metadata
from pathlib import Path

from benchmarks import report
from benchmarks.models import MODELS, QUICK_MODELS

ROOT = Path(__file__).resolve().parent.parent
WORKER_TIMEOUT_S = 900


def thread_env(threads: int) -> dict[str, str]:
    """The environment for the measuring processes: `threads` intra-op threads for torch, XLA and OpenMP."""
    env = dict(os.environ)
    multi = "true" if threads > 1 else "false"
    env.update({
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={multi} intra_op_parallelism_threads={threads}",
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    return env


def pinned_cpus(threads: int) -> set[int]:
    """The cores every measuring process is pinned to: XLA's CPU client ignores XLA_FLAGS' thread count
    (jaxlib 0.10 still runs 2 tf_XLAEigen threads on 2 cores), but sizes its pool by the process's affinity."""
    return set(sorted(os.sched_getaffinity(0))[-threads:])


def _pin(cpus: set[int]) -> None:
    os.sched_setaffinity(0, cpus)


def settings_line(threads: int) -> str:
    cpus = ",".join(map(str, sorted(pinned_cpus(threads))))
    return (f"threads: every measuring process is pinned to {threads} core(s) (CPU {cpus}, `sched_setaffinity`), and "
            f"{threads} intra-op thread(s) everywhere: torch.set_num_threads({threads}) (eager and torch.compile), "
            f"set_num_interop_threads(1), OMP/MKL_NUM_THREADS={threads}, XLA_FLAGS=`{thread_env(threads)['XLA_FLAGS']}`, "
            f"onnxruntime intra_op_num_threads={threads}, inter_op_num_threads=1, sequential execution")


def machine_info() -> dict[str, str]:
    """nproc, CPU model, load, versions: what a reader needs to weigh the numbers."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    versions = []
    for dist in ["torch", "jax", "jaxlib", "onnxruntime", "onnx", "onnxscript", "transformers", "torchax", "numpy"]:
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} not installed")
    return {"nproc": nproc, "CPU": cpu, "memory": _mem_total(), "OS": platform.platform(),
            "python": platform.python_version(), "versions": ", ".join(versions),
            "load average at start (1/5/15 min)": " / ".join(f"{x:.1f}" for x in os.getloadavg())}


def _mem_total() -> str:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    return "unknown"


def torchax_note() -> str:
    """Whether torchax can be imported here, and why not; checked in a subprocess (a failing import is messy)."""
    proc = subprocess.run([sys.executable, "-c", "import torchax"], capture_output=True, text=True)
    if proc.returncode == 0:
        return "importable; measured as `jax.jit` of `torchax.extract_jax(module)`."
    last = (proc.stderr.strip().splitlines() or ["?"])[-1]
    if "No module named 'torchax'" in last:
        return ("skipped, not installed: torchax 0.0.13 (the newest on PyPI) fails to import with torch 2.13 "
                "(`AttributeError: The underlying op of 'aten.prod' has no overload name 'dim_Dimname'`), "
                "so the `bench` extra does not install it.")
    return f"skipped, it does not import here: `{last}`"


def run_model(name: str, work: Path, rounds: int, threads: int, load_repeats: int) -> dict:
    """Measure one model: the worker process, then the torch-free load probe."""
    env = thread_env(threads)
    artifact, result_path, log = work / name, work / f"{name}.json", work / f"{name}.log"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.worker", name, "--artifact", str(artifact), "--result", str(result_path),
           "--rounds", str(rounds), "--threads", str(threads)]
    with open(log, "w") as err:
        try:
            subprocess.run(cmd, env=env, cwd=ROOT, stdout=err, stderr=subprocess.STDOUT, timeout=WORKER_TIMEOUT_S,
                           preexec_fn=partial(_pin, pinned_cpus(threads)))
        except subprocess.TimeoutExpired:
            return {"model": name, "error": f"worker timed out after {WORKER_TIMEOUT_S} s (log: {log})"}
    if not result_path.exists():
        return {"model": name, "error": f"worker crashed (log: {log})"}
    result = json.loads(result_path.read_text())
    if "conversion" in result:
        loads = []
        for _ in range(load_repeats):
            try:
                loads.append(time_load(artifact, work / f"{name}-inputs.npz", env, pinned_cpus(threads)))
            except RuntimeError as err:
                result["load_error"] = str(err)
                break
        if loads:
            result["load"] = {key: statistics.median(x[key] for x in loads) for key in loads[0] if key != "torch_imported"}
    return result


def time_load(artifact: Path, inputs: Path, env: dict[str, str], cpus: set[int]) -> dict:
    """Spawn the torch-free probe; time from spawn to its first line of output."""
    cmd = [sys.executable, str(ROOT / "scripts" / "without_torch.py"), str(ROOT / "benchmarks" / "load_probe.py"),
           str(artifact), str(inputs)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=partial(_pin, cpus))
    line = proc.stdout.readline()
    total = time.perf_counter() - start
    _, err = proc.communicate()
    if proc.returncode != 0 or not line:
        raise RuntimeError((err.strip().splitlines() or ["no output"])[-1])
    data = json.loads(line)
    if data["torch_imported"]:
        raise RuntimeError("torch was imported")
    data["total_s"] = total
    return data


def summary_line(result: dict) -> str:
    if "latency" not in result:
        return f"{result['model']}: {result.get('error', 'no latency')}"
    parts = [f"{result['model']}: converted / eager {report.ratio(result, 'converted', 'torch eager')['median']:.2f}"]
    for other in report.OTHERS:
        r = report.ratio(result, "converted", other)
        parts.append(f"/ {other} {r['median']:.2f}" if r else f"{other} failed")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description="torch2jax benchmarks")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK_MODELS)}, fewer rounds")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), help="models to run (default: all, or the quick set)")
    parser.add_argument("--rounds", type=int, help="timed rounds per model (default 40, quick 10)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads for every runtime (default 1)")
    parser.add_argument("--out", type=Path, help="folder for benchmarks.md/.png (default docs/, quick build/benchmarks-quick/)")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench-work", help="scratch folder for artifacts and logs")
    args = parser.parse_args()
    models = args.models or (QUICK_MODELS if args.quick else list(MODELS))
    rounds = args.rounds or (10 if args.quick else 40)
    load_repeats = 1 if args.quick else 3
    out = args.out or (ROOT / "build" / "benchmarks-quick" if args.quick else ROOT / "docs")
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)

    machine = machine_info()
    note = torchax_note()
    print(f"benchmarking {', '.join(models)}: {rounds} rounds, {args.threads} thread(s); torchax {note.split(':')[0]}", flush=True)
    results = []
    for name in models:
        start = time.perf_counter()
        results.append(run_model(name, args.work, rounds, args.threads, load_repeats))
        print(f"  {summary_line(results[-1])}  [{time.perf_counter() - start:.0f} s]", flush=True)
    machine["load average at end (1/5/15 min)"] = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    mode = "quick" if args.quick else "full"
    settings = settings_line(args.threads) + f"; {rounds} timed rounds per model ({mode} run)"
    text = report.markdown(results, machine, settings, note)
    old = (out / "benchmarks.md").read_text() if (out / "benchmarks.md").exists() else ""
    kept = report.marked_sections(old)  # the other benchmarks' sections (generation, large, eager, compile, ...)
    (out / "benchmarks.md").write_text("\n\n".join([text.rstrip(), *kept]) + "\n")
    (args.work / "results.json").write_text(json.dumps(results))
    report.plot(results, out / "benchmarks.png")
    print(text)
    print(f"wrote {out / 'benchmarks.md'} and {out / 'benchmarks.png'}")


if __name__ == "__main__":
    main()
