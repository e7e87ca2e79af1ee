"""Turn the per-model results of benchmarks/run.py into markdown tables, a target check and a PNG plot."""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

MB = 1 << 20
STAGES = ["export", "decompose", "lower", "weights", "jax.export", "save"]
WEIGHTS_DOMINATE_BYTES = 64 * 1024 * 1024
OTHERS = ["torch.compile", "onnxruntime", "torchax"]  # compared pair by pair with "converted"


def ratio_stats(num: list[float], den: list[float]) -> dict[str, float]:
    """Median and quartiles of the round-by-round ratios num[i] / den[i] (samples taken side by side)."""
    ratios = sorted(a / b for a, b in zip(num, den))
    if len(ratios) < 2:
        return {"median": ratios[0], "p25": ratios[0], "p75": ratios[0]}
    q = statistics.quantiles(ratios, n=4)
    return {"median": statistics.median(ratios), "p25": q[0], "p75": q[2]}


def ratio(result: dict, num: str, den: str, kind: str = "wall") -> dict[str, float] | None:
    """Paired ratio num/den of a model's latency samples, or None when either runtime did not run."""
    samples = result.get("latency", {}).get("samples", {})
    if num not in samples or den not in samples:
        return None
    return ratio_stats(samples[num][kind], samples[den][kind])


def median_ms(result: dict, runtime: str) -> float | None:
    samples = result.get("latency", {}).get("samples", {}).get(runtime)
    return 1e3 * statistics.median(samples["wall"]) if samples else None


def _fmt_ratio(r: dict[str, float] | None, why: str = "—") -> str:
    return why if r is None else f"{r['median']:.2f} ({r['p25']:.2f}–{r['p75']:.2f})"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _missing(result: dict, runtime: str, notes: dict[str, str]) -> str:
    """The cell for a runtime that did not run: a footnote marker pointing at its error."""
    failed = result.get("latency", {}).get("failed", {})
    if runtime not in failed:
        return "—"
    message = failed[runtime]
    key = f"{runtime}: {message}"
    notes.setdefault(key, f"[{len(notes) + 1}]")
    return f"failed {notes[key]}"


def latency_table(results: list[dict], notes: dict[str, str]) -> str:
    head = ["model", "inputs", "params", "torch eager ms", "converted ms", "converted / eager", "converted / eager (CPU time)",
            "converted / torch.compile", "converted / onnxruntime", "converted / torchax", "artifact / converted", "max abs err"]
    rows = []
    for res in results:
        if "latency" not in res and "error" not in res:
            continue  # a conversion-only model
        if "latency" not in res:
            rows.append([res["model"], res.get("shape", ""), "", f"error: {res.get('error', '?')}"] + [""] * (len(head) - 4))
            continue
        cells = [res["model"], res["shape"], f"{res['params'] / 1e6:.2f}M", _num(median_ms(res, "torch eager")),
                 _num(median_ms(res, "converted")), _fmt_ratio(ratio(res, "converted", "torch eager")),
                 _fmt_ratio(ratio(res, "converted", "torch eager", "cpu"))]
        for other in OTHERS:
            cells.append(_fmt_ratio(ratio(res, "converted", other), _missing(res, other, notes)))
        cells += [_fmt_ratio(ratio(res, "artifact", "converted")), f"{res['latency']['max_abs_err']:.1e}"]
        rows.append(cells)
    medians = ["**median**", "", "", "", ""]
    for num, den, kind in [("converted", "torch eager", "wall"), ("converted", "torch eager", "cpu"),
                           *[("converted", o, "wall") for o in OTHERS], ("artifact", "converted", "wall")]:
        values = [r["median"] for r in (ratio(res, num, den, kind) for res in results) if r]
        medians.append(_num(_median(values)))
    return _table(head, rows + [medians + [""]])


def export_share(conv: dict, stage: str = "lower") -> float:
    """stage / export, each without the cyclic-GC pauses that happened to land in it (listed apart)."""
    stages, pauses = conv["stages_s"], conv.get("gc_pauses_s", {})
    return (stages.get(stage, 0.0) - pauses.get(stage, 0.0)) / (stages["export"] - pauses.get("export", 0.0))


def conversion_table(results: list[dict]) -> str:
    head = ["model", "weights MB", *[f"{s} s" for s in STAGES], "total s", "GC pauses s", "lower / export (GC apart)",
            "peak extra MB", "peak extra / weights",
            "peak rise by stage MB", "first jit call s", "torch.compile first call s", "ONNX export + first run s"]
    rows = []
    for res in results:
        conv = res.get("conversion")
        if not conv:
            continue
        stages, setup = conv["stages_s"], res.get("latency", {}).get("setup_s", {})
        rows.append([res["model"], f"{res['weights_bytes'] / MB:.1f}", *[_num(stages.get(s)) for s in STAGES],
                     f"{sum(stages.values()):.2f}",
                     " ".join(f"{k} {v:.2f}" for k, v in conv.get("gc_pauses_s", {}).items() if v >= 0.01) or "—",
                     f"{export_share(conv):.1%}",
                     f"{conv['peak_extra_bytes'] / MB:.0f}", f"{conv['peak_extra_bytes'] / res['weights_bytes']:.1f}x",
                     " ".join(f"{k} {v / MB:.0f}" for k, v in conv.get("peak_rise_by_stage", {}).items() if v >= MB),
                     *[_num(setup.get(k)) for k in ("converted", "torch.compile", "onnxruntime")]])
    return _table(head, rows)


def artifact_table(results: list[dict]) -> str:
    head = ["model", "weights MB", "artifact MB", "params/ MB", "exported.bin KB", "graph.json KB", "artifact / weights",
            "torch-free start → first output s", "of which import / load / first call s"]
    rows = []
    for res in results:
        conv = res.get("conversion")
        if not conv:
            continue
        files, load = conv["artifact_files"], res.get("load")
        split = "—" if not load else f"{load['import_s']:.2f} / {load['load_s']:.2f} / {load['first_call_s']:.2f}"
        rows.append([res["model"], f"{res['weights_bytes'] / MB:.2f}", f"{conv['artifact_bytes'] / MB:.2f}",
                     f"{files.get('params', 0) / MB:.2f}", f"{files.get('exported.bin', 0) / 1024:.0f}",
                     f"{files.get('graph.json', 0) / 1024:.0f}", f"{conv['artifact_bytes'] / res['weights_bytes']:.3f}",
                     _num(load and load["total_s"]) if load else f"failed: {res.get('load_error', '?')}", split])
    return _table(head, rows)


def targets(results: list[dict]) -> list[tuple[str, str, bool]]:
    """(target, what was measured, met) for each target of the issue."""
    done = [r for r in results if "latency" in r]
    conv = [r for r in results if "conversion" in r]
    vs_eager = {r["model"]: ratio(r, "converted", "torch eager")["median"] for r in done}
    out = []
    worst = max(vs_eager, key=vs_eager.get) if vs_eager else None
    out.append(("converted latency <= torch eager on every model",
                f"worst {worst} {vs_eager[worst]:.2f}" if worst else "no data", bool(vs_eager) and max(vs_eager.values()) <= 1))
    med = _median(list(vs_eager.values()))
    out.append(("median converted / eager <= 0.8", _num(med), med is not None and med <= 0.8))
    for other in ["onnxruntime", "torchax"]:
        values = [r["median"] for r in (ratio(res, "converted", other) for res in done) if r]
        med = _median(values)
        out.append((f"no worse than {other} on the median (converted / {other} <= 1)",
                    f"{_num(med)} over {len(values)} models" if values else f"{other} did not run", med is not None and med <= 1))
    shares = {r["model"]: export_share(r["conversion"]) for r in conv}
    copies = {r["model"]: export_share(r["conversion"], "weights") for r in conv}
    worst = max(shares, key=shares.get) if shares else None
    most = max(copies, key=copies.get) if copies else None
    measured = (f"worst {worst} {shares[worst]:.1%} (the weight copy, a stage of its own: up to {copies[most]:.1%}, {most})"
                if worst else "no data")
    out.append(("lower < 10% of torch.export on every model", measured, bool(shares) and max(shares.values()) < 0.10))
    # Memory and size are judged where the weights dominate (wide_mlp); on small models a fixed cost
    # (torch.export's working memory, the StableHLO and graph files) swamps any ratio to the weights.
    big = [r for r in conv if r["weights_bytes"] >= WEIGHTS_DOMINATE_BYTES] or conv
    scope = f"models with >= {WEIGHTS_DOMINATE_BYTES // MB} MB of weights" if big is not conv else "all models"
    mem = {r["model"]: r["conversion"]["peak_extra_bytes"] / r["weights_bytes"] for r in big}
    fixed = [r["conversion"]["peak_extra_bytes"] / MB for r in conv if r not in big]
    worst = max(mem, key=mem.get) if mem else None
    text = f"{worst} {mem[worst]:.2f}x ({scope})" if worst else "no data"
    if fixed:
        text += f"; small models: {min(fixed):.0f}-{max(fixed):.0f} MB extra whatever their size"
    out.append(("peak conversion memory <= 2x weights", text, bool(mem) and max(mem.values()) <= 2))
    size = {r["model"]: r["conversion"]["artifact_bytes"] / r["weights_bytes"] - 1 for r in big}
    small = {r["model"]: r["conversion"]["artifact_bytes"] / r["weights_bytes"] - 1 for r in conv if r not in big}
    text = f"{min(size.values()):+.1%} to {max(size.values()):+.1%} ({scope})" if size else "no data"
    if small:
        text += f"; small models {min(small.values()):+.1%} to {max(small.values()):+.1%}"
    out.append(("artifact size within 2% of the weights (met when no more than 2% larger)", text,
                bool(size) and max(size.values()) <= 0.02))
    return out


def markdown(results: list[dict], machine: dict[str, Any], settings: str, torchax_note: str) -> str:
    notes: dict[str, str] = {}
    latency = latency_table(results, notes)
    lines = ["# Benchmarks", "", "Generated by `make bench` (`benchmarks/run.py`); do not edit by hand.", "",
             "## Machine and settings", ""]
    lines += [f"- {key}: {value}" for key, value in machine.items()]
    lines += [f"- {settings}", "", "## Targets", "", _table(["target", "measured", "met"],
              [[t, m, "yes" if ok else "**no**"] for t, m, ok in targets(results)]), ""]
    lines += ["## Steady-state latency", "",
              "One process per model: every runtime is warmed up, then timed round-robin (each round one sample of each, "
              "the starting runtime rotating); a sample repeats a call for about 20 ms. Ratios are taken round by round "
              "between samples taken side by side, then the median (and quartiles) over rounds; below 1 means the "
              "converted model is faster. `converted` is `jax.jit(model.apply)` with params as arguments; `artifact` is "
              "`torch2jax.load(dir)` of the saved StableHLO (symbolic shapes); absolute ms are for orientation only. "
              "The CPU-time column divides process CPU time instead of wall time, which is less sensitive to other load "
              "on the machine.", "", latency, ""]
    lines += [f"{marker} {text}" + "  " for text, marker in notes.items()]
    lines += ["", f"torchax: {torchax_note}", "", "## Conversion", "",
              "A fresh process per model. Stages: `export` (torch.export), `decompose` (core ATen), `lower` (capture + "
              "interpreter build, from `StageTimer`), `weights` (each weight copied once into a JAX-owned buffer: "
              "memory bound, and on a VM the first touch of fresh memory dominates it), `jax.export` "
              "(`stablehlo.export`), `save` (`artifact.save`). "
              "Peak extra memory is `ru_maxrss` after saving minus the RSS once torch, jax and the model are loaded. "
              "`lower` includes importing the lowering registry (first use in the process); `export` includes torch.export's "
              "own first-use warm-up, as a CLI conversion would. Python's cyclic garbage collector pauses whichever "
              "stage happens to allocate when a collection is due (a full one after torch.export walks all it left, "
              "~0.4 s): those pauses are measured with `gc.callbacks`, listed by stage, and left out of "
              "`lower / export`. The last three columns are for comparison: the first call "
              "of `jax.jit(model.apply)` (XLA compilation), of `torch.compile` (inductor), and ONNX export + session + "
              "first run.",
              "", conversion_table(results), "", "## Artifact size and torch-free load", "",
              "Start → first output: a new process with torch imports blocked (`scripts/without_torch.py`) that imports "
              "torch2jax, loads the artifact and runs it once; timed by the parent from spawn to the first printed line "
              "(median over the repeats).", "", artifact_table(results), "", "![benchmarks](benchmarks.png)", ""]
    return "\n".join(lines)


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """Three panels: latency vs torch eager, conversion time by stage, memory and size vs weights."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [r for r in results if "latency" in r]
    models = [r["model"] for r in timed]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5))

    ax = axes[0]
    runtimes = ["converted", "artifact", "torch.compile", "onnxruntime", "torchax"]
    width = 0.8 / len(runtimes)
    for i, runtime in enumerate(runtimes):
        values = [(ratio(r, runtime, "torch eager") or {}).get("median", float("nan")) for r in timed]
        ax.bar([x + i * width for x in range(len(models))], values, width, label=runtime)
    ax.axhline(1.0, color="black", lw=1)
    ax.axhline(0.8, color="red", lw=1, ls="--", label="target 0.8")
    ax.set_yscale("log")
    ax.set_ylim(top=ax.get_ylim()[1] * 4)  # room for the legend above the bars
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(models))], models, rotation=30)
    ax.set_title("latency / torch eager (median of paired rounds; lower is faster)")
    ax.legend(fontsize=8, loc="upper center", ncol=3)

    ax = axes[1]
    conv = [r for r in results if "conversion" in r]
    bottom = [0.0] * len(conv)
    for stage in STAGES:
        values = [r["conversion"]["stages_s"].get(stage, 0.0) for r in conv]
        ax.bar([r["model"] for r in conv], values, bottom=bottom, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("seconds")
    ax.set_title("conversion time by stage")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8)

    ax = axes[2]
    xs = range(len(conv))
    ax.bar([x - 0.2 for x in xs], [r["conversion"]["peak_extra_bytes"] / r["weights_bytes"] for r in conv], 0.4,
           label="peak extra memory / weights")
    ax.bar([x + 0.2 for x in xs], [r["conversion"]["artifact_bytes"] / r["weights_bytes"] for r in conv], 0.4,
           label="artifact size / weights")
    ax.axhline(2.0, color="C0", lw=1, ls="--", label="target memory 2x")
    ax.axhline(1.02, color="C1", lw=1, ls="--", label="target size 1.02x")
    ax.set_yscale("log")
    ax.set_xticks(list(xs), [r["model"] for r in conv], rotation=30)
    ax.set_title("conversion memory and artifact size vs weights")
    ax.legend(fontsize=8)

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


SECTION = re.compile(r"<!-- (\S+):begin -->.*?<!-- \1:end -->", re.S)


def marked_sections(text: str) -> list[str]:
    """The sections other benchmarks wrote between `<!-- name:begin -->` / `<!-- name:end -->` markers: run.py
    rewrites the rest of docs/benchmarks.md and keeps these as they are."""
    return [match.group(0) for match in SECTION.finditer(text)]


def write_section(path: Path, text: str, begin: str, end: str) -> None:
    """Replace the section between `begin` and `end` markers of `path` (or append it): the rest is run.py's."""
    old = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    new = pattern.sub(lambda _: text, old) if pattern.search(old) else old.rstrip() + "\n\n" + text + "\n"
    path.write_text(new)
