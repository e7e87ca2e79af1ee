"""A markdown report of a conversion or verification, for a reviewer reading a CI run.

It gathers what a reviewer asks first: did it pass, how long each stage took, which ops the
graph uses (and which were kept whole instead of decomposed), each output's error against its
tolerance, and the environment. Written by `torch2jax convert/verify --report FILE`.
"""

from __future__ import annotations

import collections
import os
import platform
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import VerificationError
from ..ir.graph import Graph

_PACKAGES = ("torch2jax-aot", "torch", "jax", "jaxlib", "numpy", "orbax-checkpoint", "transformers")


@dataclass
class ReportData:
    title: str
    target: str
    status: str = "ok"  # "ok", "numerics differ" or "failed"
    error: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    graph: Graph | None = None
    verification: Any = None  # verify.Report, when verification ran (it renders its own table)
    artifact: str | None = None


@contextmanager
def reporting(data: ReportData, path: str | os.PathLike | None, announce: Callable[[str], None] = print) -> Iterator[ReportData]:
    """Fill `data` in the block; whatever happens (pass, mismatch, error), write it to `path` if given."""
    try:
        yield data
    except BaseException as err:
        data.status = "numerics differ" if isinstance(err, VerificationError) else "failed"
        data.error = str(err) or type(err).__name__
        raise
    finally:
        if path:
            write(data, path)
            announce(f"report: {path}")


def write(data: ReportData, path: str | os.PathLike) -> Path:
    """Render `data` as markdown into `path` (written whole, then renamed into place)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(render(data))
    os.replace(tmp, path)
    return path


def render(data: ReportData) -> str:
    lines = [f"# {data.title}", "", f"- target: `{data.target}`", f"- result: **{data.status}**"]
    if data.artifact:
        lines.append(f"- artifact: `{data.artifact}`")
    lines.append(f"- written: {datetime.now(timezone.utc).isoformat(timespec='seconds')}")
    if data.error:
        lines += ["", "## Error", "", "```", data.error.strip(), "```"]
    if data.timings:
        lines += ["", "## Stages", "", "| stage | seconds |", "|---|---|"]
        lines += [f"| {name} | {seconds:.2f} |" for name, seconds in data.timings.items()]
        lines.append(f"| **total** | {sum(data.timings.values()):.2f} |")
    if data.verification is not None:
        lines += ["", "## Numerics against PyTorch", ""] + data.verification.lines(markdown=True)
    if data.graph is not None:
        lines += ["", "## Graph", ""] + _graph_lines(data.graph)
    lines += ["", "## Environment", ""] + [f"- {item}" for item in environment()]
    return "\n".join(lines) + "\n"


def _graph_lines(graph: Graph) -> list[str]:
    from ..capture.decomposition import KEEP_WHOLE  # reports are written where torch is installed (convert, verify)

    counts = collections.Counter(node.op for node in graph.all_nodes())
    whole = sorted(op for op in counts if op in KEEP_WHOLE)
    params = [i for i in graph.inputs if i.kind in ("parameter", "buffer", "constant")]
    lines = [
        f"- {sum(counts.values())} nodes, {len(counts)} distinct ops, {len(graph.subgraphs)} subgraphs",
        f"- inputs: {len(graph.user_inputs)} user, {len(params)} params/buffers/constants; {len(graph.mutations)} mutated buffers",
        f"- symbolic dims: {', '.join(_ranges(graph)) or 'none'}",
        f"- ops kept whole (not decomposed): {', '.join(whole) or 'none used'}",
        "",
        "| op | count |",
        "|---|---|",
    ]
    lines += [f"| `{op}` | {n} |" for op, n in counts.most_common()]
    return lines


def _ranges(graph: Graph) -> list[str]:
    return [f"{name} in [{bounds.get('min')}, {bounds.get('max') or 'inf'}]" for name, bounds in graph.symbols.items()]


def environment() -> list[str]:
    versions = []
    for name in _PACKAGES:
        try:
            versions.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return [
        f"python {sys.version.split()[0]} on {platform.platform()}",
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs",
        "packages: " + ", ".join(versions),
    ]

