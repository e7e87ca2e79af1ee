"""An artifact checked against torch running its target on the same inputs (what `torch2jax verify` runs)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..capture.converter import StageTimer
from ..diagnose.report import ReportData, reporting
from ..diagnose.verify import Report, check
from ..diagnose.verify import verify as compare_with_torch
from ..generate.artifacts import load
from .targets import resolve_target


def verify_artifact(artifact_dir: str | os.PathLike, target: str, *, inputs: Sequence[str] = (), weights: str | None = None,
                    seed: int = 0, report: str | os.PathLike | None = None) -> Report:
    """Compare the artifact at `artifact_dir` with torch running `target` (as for convert_target) on the example inputs,
    random inputs of the same shapes and a second size of every symbolic dim. Returns the per-output errors; raises
    VerificationError when one is beyond its dtype's tolerance. `report` also writes them as markdown, pass or fail."""
    timer = StageTimer()
    data = ReportData(title="torch2jax verification report", target=target, artifact=str(artifact_dir), timings=timer.timings)
    with reporting(data, report, lambda line: None):
        with timer.stage("load artifact", ""):
            model = load(artifact_dir)
        data.graph = model.graph
        with timer.stage("build torch model", ""):
            resolved = resolve_target(target, inputs, weights, seed=seed)
        with timer.stage("compare", ""):
            data.verification = compare_with_torch(resolved.module, model, resolved.args, resolved.kwargs, seed)
        check(data.verification)
    return data.verification
