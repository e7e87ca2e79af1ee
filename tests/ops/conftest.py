"""Record each OpInfo case's outcome when T2J_OPINFO_REPORT names a file (make test-ops-full)."""

from __future__ import annotations

import json
import os
from collections import Counter

_OUTCOMES: dict[str, str] = {}


def pytest_runtest_logreport(report):
    if "test_opinfo[" not in report.nodeid:
        return
    case = report.nodeid.split("[", 1)[1].rstrip("]")
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if outcome == "skipped" and "torch.export cannot export" in str(report.longrepr):
            outcome = "torch-limit"
        _OUTCOMES[case] = outcome


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("T2J_OPINFO_REPORT")
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller sees every report and writes the file
    if not path or not _OUTCOMES:
        return
    by_dtype: dict[str, Counter] = {}
    for case, outcome in _OUTCOMES.items():
        dtype = case.rsplit("-", 1)[1]
        by_dtype.setdefault(dtype, Counter())[outcome] += 1
    data = {
        "samples_per_op": os.environ.get("T2J_OPINFO_SAMPLES", "1"),
        "dtypes": os.environ.get("T2J_OPINFO_DTYPES", "rotate"),
        "by_dtype": {d: dict(c) for d, c in sorted(by_dtype.items())},
        "cases": dict(sorted(_OUTCOMES.items())),
    }
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
